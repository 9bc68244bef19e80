"""Bad input is a 4xx naming the problem, never a 500, and a refused request writes nothing.

Each case is one that used to be a 500 (or no answer at all). Every refusal is checked three
ways: the status and the Kubernetes `Status` body name the problem, the store is unchanged
(the resourceVersion counter and the row counts of every table a request can write), and the
keep-alive connection stays open (a 500 closes it). Runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from tests.conftest import unique
from tests.factories import cpu_node, gpu_node, pod

TABLES = ("pods", "events", "changes", "pod_groups", "namespaces", "tenants", "nodes")


def store_state(server: Any) -> dict[str, int]:
    def read(session: Any) -> dict[str, int]:
        state = {
            t: int(session.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES
        }
        state["resourceVersion"] = int(
            session.execute(
                text("SELECT coalesce(max(resource_version), 0) FROM changes")
            ).scalar_one()
        )
        return state

    return server.services.db.read(read)


@contextmanager
def writes_nothing(server: Any) -> Iterator[None]:
    before = store_state(server)
    yield
    assert store_state(server) == before


def refused(response: Any, code: int, *words: str) -> dict[str, Any]:
    assert response.status_code == code, response.text[:500]
    status = response.json()
    assert status["kind"] == "Status" and status["code"] == code, status
    for word in words:
        assert word in status["message"], status["message"]
    assert response.headers.get("connection", "").lower() != "close"
    return status


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


def raw_pod(*, spec_extra: str = "", resources: str = "") -> bytes:
    container = '{"name": "main", "image": "app:1"' + resources + "}"
    return (
        '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hostile"}, '
        f'"spec": {{"containers": [{container}]{spec_extra}}}}}'
    ).encode()


JSON = "application/json"
YAML = "application/yaml"
ALIAS_BOMB = "\n".join(
    ["x0: &a0 [" + ",".join(["1"] * 9) + "]"]
    + [f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
)

BAD_BODIES: list[tuple[str, bytes, str, int, str]] = [
    (
        "cpu 1e999999999",
        raw_pod(resources=', "resources": {"requests": {"cpu": "1e999999999"}}'),
        JSON,
        422,
        "too large",
    ),
    (
        "memory 1e999",
        raw_pod(resources=', "resources": {"requests": {"memory": "1e999"}}'),
        JSON,
        422,
        "too large",
    ),
    (
        "5001-digit integer",
        raw_pod(resources=', "resources": {"requests": {"cpu": 1' + "0" * 5000 + "}}"),
        JSON,
        400,
        "",
    ),
    (
        "gpu true",
        raw_pod(resources=', "resources": {"limits": {"nvidia.com/gpu": true}}'),
        JSON,
        400,
        "nvidia.com/gpu",
    ),
    ("JSON 1100 deep", b'{"a": ' + b"[" * 1100 + b"]" * 1100 + b"}", JSON, 400, "depth"),
    (
        "YAML 5000 deep",
        ("a:\n" + "- " * 5000 + "x").encode(),
        YAML,
        400,
        "nested",
    ),
    (
        "affinity 254 deep",
        raw_pod(spec_extra=', "affinity": ' + json.dumps(nested(254))),
        JSON,
        400,
        "nested more than 100 levels",
    ),
    (
        "lone surrogate in a label (YAML)",
        b'metadata: {name: s, labels: {a: "\\ud800"}}\nspec: {containers: [{name: m, image: i}]}',
        YAML,
        400,
        "YAML",
    ),
    (
        "lone surrogate in an annotation (JSON)",
        b'{"metadata": {"name": "s", "annotations": {"a": "\\ud800"}}, "spec": {"containers": []}}',
        JSON,
        400,
        "surrogate",
    ),
    (
        "terminationGracePeriodSeconds 2**63",
        raw_pod(spec_extra=f', "terminationGracePeriodSeconds": {2**63}'),
        JSON,
        400,
        "64 bits",
    ),
    ("YAML alias bomb", ALIAS_BOMB.encode(), YAML, 400, "aliases"),
    ("YAML alias bomb sent as JSON", ALIAS_BOMB.encode(), JSON, 400, "aliases"),
    ("YAML timestamp", b"metadata: {name: 2020-01-01}\nspec: {}", YAML, 400, "quote it"),
]


@pytest.mark.parametrize(
    ("body", "content_type", "code", "word"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_bad_bodies_are_4xx_and_write_nothing(
    server, tenant, body: bytes, content_type: str, code: int, word: str
) -> None:
    with writes_nothing(server):
        response = tenant.post(
            f"/api/v1/namespaces/{tenant.tenant}/pods",
            content=body,
            headers={"Content-Type": content_type},
        )
        refused(response, code, word)
    # the same connection still serves
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods").status_code == 200


BAD_NAMES = [
    ("pod name", pod("web\n"), "metadata.name"),
    ("container name", {**pod("ok"), "spec": {"containers": [{"name": "c\n", "image": "i"}]}}, ""),
    ("label key", pod("ok", labels={"app\n": "x"}), "label key"),
    ("label value", pod("ok", labels={"app": "x\n"}), "label value"),
    (
        "annotation key",
        {**pod("ok"), "metadata": {"name": "ok", "annotations": {"bad key": "v"}}},
        "annotation key",
    ),
    (
        "257 labels (at most 256)",
        pod("ok", labels={f"k{i}": "v" for i in range(257)}),
        "at most 256",
    ),
    (
        "generateName without room for its suffix",
        {**pod(None), "metadata": {"generateName": "g" * 250}},
        "no more than 248",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "word"), [c[1:] for c in BAD_NAMES], ids=[c[0] for c in BAD_NAMES]
)
def test_names_are_matched_whole(server, tenant, manifest: dict[str, Any], word: str) -> None:
    with writes_nothing(server):
        response = tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=manifest)
        status = refused(response, 422, word)
    assert status["reason"] == "Invalid" and status["details"]["causes"]


def test_namespace_tenant_and_podgroup_names_with_a_newline(server, tenant, admin) -> None:
    with writes_nothing(server):
        refused(
            tenant.post("/api/v1/namespaces", json={"metadata": {"name": f"{tenant.tenant}-x\n"}}),
            422,
        )
        refused(
            admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": "alpha\n"}}), 422
        )
        group = {"metadata": {"name": "gang\n"}, "spec": {"minMember": 2}}
        refused(
            tenant.post(f"/apis/tessera.io/v1/namespaces/{tenant.tenant}/podgroups", json=group),
            422,
        )


def test_the_longest_valid_pod_name_lives_its_whole_life(tenant, admin) -> None:
    """253 characters: its events (`<pod>.<16 hex>`) fit their column on PostgreSQL too."""
    ns = tenant.tenant
    name = ("a" * 62 + ".") * 3 + "b" * 64
    assert len(name) == 253
    created = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod(name, cpu="1", memory="2Gi"))
    assert created.status_code == 201, created.text
    node = unique("long-")
    assert admin.post("/api/v1/nodes", json=cpu_node(node)).status_code == 201
    binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    bound = admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=binding)
    assert bound.status_code == 201, bound.text
    events = tenant.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    mine = [e for e in events if e["involvedObject"]["name"] == name]
    assert {e["reason"] for e in mine} >= {"Created", "Scheduled"}
    assert all(len(e["metadata"]["name"]) <= 253 for e in mine)
    assert len({e["metadata"]["name"] for e in mine}) == len(mine)
    deleted = tenant.delete(
        f"/api/v1/namespaces/{ns}/pods/{name}", params={"gracePeriodSeconds": 0}
    )
    assert deleted.status_code == 200
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 404


def test_a_node_with_the_longest_name_gets_gpus_whose_names_fit(admin) -> None:
    name = unique("n") + "-" + "x" * 230
    name = name[:253]
    created = admin.post("/api/v1/nodes", json=gpu_node(name, gpus=2))
    assert created.status_code == 201, created.text
    gpus = admin.get("/apis/tessera.io/v1/gpudevices").json()["items"]
    mine = [g["metadata"]["name"] for g in gpus if g["spec"]["nodeName"] == name]
    assert len(mine) == 2 and all(len(n) <= 253 for n in mine) and len(set(mine)) == 2


BAD_QUERIES = [
    ("limit of 23 digits", "", {"limit": "99999999999999999999999"}, "limit"),
    ("fieldSelector ===", "", {"fieldSelector": "status.phase===Running"}, "field selector"),
    ("garbage resourceVersion", "", {"resourceVersion": "abc"}, "resourceVersion"),
    (
        "garbage resourceVersionMatch",
        "",
        {"resourceVersion": "1", "resourceVersionMatch": "x"},
        "resourceVersionMatch",
    ),
    ("resourceVersionMatch alone", "", {"resourceVersionMatch": "Exact"}, "resourceVersionMatch"),
    ("negative watch", "", {"watch": "true", "resourceVersion": "-1"}, "resourceVersion"),
    ("watch beyond int64", "", {"watch": "true", "resourceVersion": str(2**63)}, "resourceVersion"),
    (
        "a selector of 4,600 characters",
        "",
        {"labelSelector": ",".join(f"k{i}=v" for i in range(700))},
        "at most 4096",
    ),
    (
        "a selector of 65 terms",
        "",
        {"labelSelector": ",".join(f"k{i}=v" for i in range(65))},
        "more than 64 requirements",
    ),
    (
        "a selector of 257 values",
        "",
        {"labelSelector": "k in (" + ",".join(f"v{i}" for i in range(257)) + ")"},
        "more than 256 values",
    ),
    (
        "a field selector of 65 terms",
        "",
        {"fieldSelector": ",".join(["status.phase=Running"] * 65)},
        "at most 64",
    ),
    (
        "timeoutSeconds beyond int64",
        "",
        {"watch": "true", "timeoutSeconds": str(2**64)},
        "timeoutSeconds",
    ),
]


@pytest.mark.parametrize(
    ("params", "word"), [c[2:] for c in BAD_QUERIES], ids=[c[0] for c in BAD_QUERIES]
)
def test_bad_list_and_watch_parameters_are_400(tenant, params: dict[str, str], word: str) -> None:
    for path in (f"/api/v1/namespaces/{tenant.tenant}/pods", "/api/v1/pods"):
        refused(tenant.get(path, params=params), 400, word)


def test_bad_json_patches_are_4xx_and_write_nothing(server, tenant) -> None:
    ns = tenant.tenant
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("patched")).status_code == 201
    url = f"/api/v1/namespaces/{ns}/pods/patched"
    headers = {"Content-Type": "application/json-patch+json"}
    with writes_nothing(server):
        index = [{"op": "add", "path": "/spec/containers/" + "9" * 20, "value": {}}]
        refused(tenant.patch(url, content=json.dumps(index), headers=headers), 400, "index")
        grow = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "x" * 400_000}}]
        grow += [
            {"op": "copy", "from": "/metadata/annotations", "path": f"/metadata/labels{i}"}
            for i in range(12)
        ]
        refused(tenant.patch(url, content=json.dumps(grow), headers=headers), 413, "copies")
        deep = [{"op": "add", "path": "/metadata/annotations", "value": nested(150)}]
        refused(tenant.patch(url, content=json.dumps(deep), headers=headers), 400, "nested")


def test_unknown_field_names_that_no_header_can_hold_are_warned_safely(server, tenant) -> None:
    """Non-Latin-1 and CR/LF in an unknown field's name: the pod is created and the Warning
    header carries the name escaped (this was a 500 after the commit, or no answer at all)."""
    ns = tenant.tenant
    for name, field in (("unicode", "spéc字段"), ("crlf", "x\r\nSet-Cookie: a=b")):
        manifest = pod(name)
        manifest["spec"][field] = 1
        response = tenant.post(
            f"/api/v1/namespaces/{ns}/pods", json=manifest, params={"fieldValidation": "Warn"}
        )
        assert response.status_code == 201, response.text
        warning = response.headers["warning"]
        assert warning.startswith('299 - "unknown field') and "\\u" in warning
        assert "set-cookie" not in response.headers
        assert tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 200


def test_grace_periods_of_any_int64_and_a_shortened_deletion(tenant, admin) -> None:
    """Created with terminationGracePeriodSeconds 2**63-1, bound, deleted (default grace: the
    far future, capped), then deleted again with 5 s: the shorter grace period takes effect,
    and 3e11 s is a 400 (not an integer) while 300000000000 is accepted."""
    ns = tenant.tenant
    node = unique("grace-")
    assert admin.post("/api/v1/nodes", json=cpu_node(node)).status_code == 201
    manifest = pod("slow", cpu="1", memory="2Gi", terminationGracePeriodSeconds=2**63 - 1)
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest).status_code == 201
    binding = {"metadata": {"name": "slow"}, "target": {"kind": "Node", "name": node}}
    assert admin.post(f"/api/v1/namespaces/{ns}/pods/slow/binding", json=binding).status_code == 201
    url = f"/api/v1/namespaces/{ns}/pods/slow"

    refused(tenant.delete(url, params={"gracePeriodSeconds": "3e11"}), 400, "gracePeriodSeconds")
    first = tenant.delete(url)
    assert first.status_code == 200, first.text
    meta = first.json()["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 2**63 - 1
    assert meta["deletionTimestamp"].startswith("9999-")

    longer = tenant.delete(url, params={"gracePeriodSeconds": 300_000_000_000})
    assert (
        longer.status_code == 200
        and longer.json()["metadata"] == tenant.get(url).json()["metadata"]
    )
    shorter = tenant.delete(url, params={"gracePeriodSeconds": 5})
    assert shorter.status_code == 200
    meta = tenant.get(url).json()["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 5 and not meta["deletionTimestamp"].startswith(
        "9999-"
    )
    assert tenant.delete(url, params={"gracePeriodSeconds": 0}).status_code == 200
    assert tenant.get(url).status_code == 404


def test_podgroup_patches_are_bounded_and_cannot_rename(server, tenant) -> None:
    base = f"/apis/tessera.io/v1/namespaces/{tenant.tenant}/podgroups"
    group = {"metadata": {"name": "gang"}, "spec": {"minMember": 2}}
    assert tenant.post(base, json=group).status_code == 201
    merge = {"Content-Type": "application/merge-patch+json"}
    with writes_nothing(server):
        huge = json.dumps({"spec": {"minMember": 2**63}})
        refused(tenant.patch(f"{base}/gang", content=huge, headers=merge), 400, "64 bits")
        big = json.dumps({"spec": {"minMember": 2**40}})
        refused(tenant.patch(f"{base}/gang", content=big, headers=merge), 400, "minMember")
        unknown = json.dumps({"spec": {"bogus": 1}})
        refused(
            tenant.patch(
                f"{base}/gang", content=unknown, headers=merge, params={"fieldValidation": "Strict"}
            ),
            400,
            "bogus",
        )
        rename = json.dumps({"metadata": {"name": "other"}})
        status = refused(tenant.patch(f"{base}/gang", content=rename, headers=merge), 422)
        assert status["details"]["causes"][0]["field"] == "metadata.name"
    changed = tenant.patch(
        f"{base}/gang", content=json.dumps({"spec": {"minMember": 3}}), headers=merge
    )
    assert changed.status_code == 200 and changed.json()["spec"]["minMember"] == 3
