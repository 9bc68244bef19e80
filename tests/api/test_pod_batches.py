"""Tessera's PodBatch (`POST /apis/tessera.io/v1/namespaces/{ns}/podbatches`), over real HTTP on
both databases: each pod created as its own create would be (admission, validation, quotas),
one answer per item in order, a refused item leaving the others made; the same authorization as
pods' create; bounded."""

from __future__ import annotations

from typing import Any

from tests.api.test_quotas import quota, set_quota, sized
from tests.conftest import Api
from tests.factories import pod

BATCHES = "/apis/tessera.io/v1/namespaces/{ns}/podbatches"


def batch(*items: Any) -> dict[str, Any]:
    return {"apiVersion": "tessera.io/v1", "kind": "PodBatch", "items": list(items)}


def test_each_item_is_created_as_a_create_of_its_own(tenant: Api) -> None:
    ns = tenant.tenant
    generated = pod("ignored")
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "web-"
    broken = pod("broken")
    broken["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "lots"}}
    answer = tenant.post(
        BATCHES.format(ns=ns),
        json=batch(pod("a"), generated, broken, pod("a"), "not a pod", pod("b")),
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["kind"] == "PodBatch" and body["apiVersion"] == "tessera.io/v1"
    items = body["items"]
    assert [i["kind"] for i in items] == ["Pod", "Pod", "Status", "Status", "Status", "Pod"], items
    assert items[0]["metadata"]["name"] == "a" and items[0]["metadata"]["namespace"] == ns
    assert items[1]["metadata"]["name"].startswith("web-")
    assert items[2]["code"] == 422 and items[2]["reason"] == "Invalid"
    assert items[3]["code"] == 409 and items[3]["reason"] == "AlreadyExists"
    assert items[4]["code"] == 400
    # the pods made are the API's like any other: read back, listed, with their versions
    for made in (items[0], items[1], items[5]):
        read = tenant.get(f"/api/v1/namespaces/{ns}/pods/{made['metadata']['name']}")
        assert read.status_code == 200, read.text
        assert read.json()["metadata"]["uid"] == made["metadata"]["uid"]
    listed = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    assert len(listed) == 3
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/broken").status_code == 404


def test_quotas_count_the_batchs_own_pods(admin: Api, tenant: Api) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, quota("compute", cpu="4", memory="10Gi"))
    items = [sized(f"p{i}", "1", "1Gi") for i in range(6)]
    answer = tenant.post(BATCHES.format(ns=ns), json=batch(*items))
    assert answer.status_code == 200, answer.text
    kinds = [i["kind"] for i in answer.json()["items"]]
    assert kinds.count("Pod") == 4 and kinds.count("Status") == 2
    refused = [i for i in answer.json()["items"] if i["kind"] == "Status"]
    assert all(i["code"] == 403 and "exceeded quota: compute" in i["message"] for i in refused)
    listed = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    assert len(listed) == 4


def test_a_dry_run_writes_nothing(tenant: Api) -> None:
    ns = tenant.tenant
    answer = tenant.post(f"{BATCHES.format(ns=ns)}?dryRun=All", json=batch(pod("x"), pod("y")))
    assert answer.status_code == 200, answer.text
    assert [i["kind"] for i in answer.json()["items"]] == ["Pod", "Pod"]
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"] == []


def test_only_where_the_caller_may_create_pods(tenant: Api, make_tenant: Any) -> None:
    other = make_tenant()
    refused = other.post(BATCHES.format(ns=tenant.tenant), json=batch(pod("x")))
    assert refused.status_code == 403, refused.text
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/x").status_code == 404


def test_a_batch_is_bounded_and_well_formed(tenant: Api) -> None:
    url = BATCHES.format(ns=tenant.tenant)
    too_many = tenant.post(url, json=batch(*(pod(f"p{i}") for i in range(501))))
    assert too_many.status_code == 400 and "at most 500" in too_many.json()["message"]
    assert tenant.post(url, json=batch()).status_code == 400
    wrong = tenant.post(url, json={**batch(pod("p")), "kind": "PodList"})
    assert wrong.status_code == 400
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods").json()["items"] == []
