"""The views a client asks for in `Accept`: the object, a Table, or only the metadata (real HTTP,
SQLite and PostgreSQL)."""

from __future__ import annotations

import json

from tests.api.test_pod_updates import bound_pod
from tests.factories import pod

META = "application/json;as={};v=v1;g=meta.k8s.io"
PARTIAL_LIST = META.format("PartialObjectMetadataList")
PARTIAL = META.format("PartialObjectMetadata")


def test_metadata_only_lists_gets_and_watches(tenant, admin) -> None:
    ns = tenant.tenant
    bound_pod(tenant, admin, "meta-a", app="a")
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("meta-b")).status_code == 201
    url = f"/api/v1/namespaces/{ns}/pods"
    full = tenant.get(url).json()

    listed = tenant.get(url, headers={"Accept": PARTIAL_LIST + ",application/json"})
    assert listed.status_code == 200 and listed.headers["content-type"] == PARTIAL_LIST
    body = listed.json()
    assert body["kind"] == "PartialObjectMetadataList" and body["apiVersion"] == "meta.k8s.io/v1"
    # a list's version is the store's horizon when read: it may move on between two lists
    assert int(body["metadata"]["resourceVersion"]) >= int(full["metadata"]["resourceVersion"])
    assert [i["metadata"] for i in body["items"]] == [i["metadata"] for i in full["items"]]
    assert all(set(i) == {"kind", "apiVersion", "metadata"} for i in body["items"])
    assert {i["kind"] for i in body["items"]} == {"PartialObjectMetadata"}

    one = tenant.get(f"{url}/meta-a", headers={"Accept": PARTIAL})
    assert one.json() == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": tenant.get(f"{url}/meta-a").json()["metadata"],
    }
    # and on the pool's kinds too
    nodes = tenant.get("/api/v1/nodes", headers={"Accept": PARTIAL_LIST}).json()
    assert nodes["kind"] == "PartialObjectMetadataList" and "spec" not in nodes["items"][0]

    with tenant.stream(
        "GET",
        url,
        params={"watch": "true", "timeoutSeconds": "1"},
        headers={"Accept": PARTIAL},
    ) as watch:
        events = [json.loads(line) for line in watch.iter_lines() if line]
    assert {e["object"]["metadata"]["name"] for e in events} == {"meta-a", "meta-b"}
    assert all(set(e["object"]) == {"kind", "apiVersion", "metadata"} for e in events)


def test_a_view_this_server_cannot_give_is_406_unless_a_fallback_is_offered(tenant) -> None:
    ns = tenant.tenant
    url = f"/api/v1/namespaces/{ns}/pods"
    assert tenant.post(url, json=pod("meta-c")).status_code == 201
    for accept, where in (
        (PARTIAL, url),  # the single-object view of a list
        (PARTIAL_LIST, f"{url}/meta-c"),  # the list view of one object
        ("application/json;as=PartialObjectMetadataList;v=v2;g=meta.k8s.io", url),
        ("application/json;as=Table;v=v1;g=example.com", url),
    ):
        refused = tenant.get(where, headers={"Accept": accept})
        assert refused.status_code == 406, (accept, refused.text)
        assert refused.json()["reason"] == "NotAcceptable"
        assert "application/json" in refused.json()["message"]
        fallback = tenant.get(where, headers={"Accept": f"{accept}, application/json"})
        assert fallback.status_code == 200 and fallback.json()["kind"] in ("Pod", "PodList")
    # the order of Accept decides
    table_first = tenant.get(url, headers={"Accept": f"{META.format('Table')},{PARTIAL_LIST}"})
    assert table_first.json()["kind"] == "Table"
    json_first = tenant.get(url, headers={"Accept": f"application/json,{PARTIAL_LIST}"})
    assert json_first.json()["kind"] == "PodList"
    # what no client asks for in earnest still gets the object
    assert tenant.get(url, headers={"Accept": "text/html,*/*;q=0.8"}).json()["kind"] == "PodList"
