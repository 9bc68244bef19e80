"""`dryRun=All` writes nothing for every write of PodGroups (both groups), callbacks (and their
`rotate`), commitments, nodes, GPU devices and tenants; and a namespace's deletion deletes its PodGroups, callbacks and leases
through their own delete, so every watcher sees DELETED (a database cascade logged nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from app.kube.router import kube_openapi
from app.main import create_app
from app.settings import Settings
from tests.conftest import unique
from tests.factories import gpu_node
from tests.receiver import Receiver

TESSERA = "/apis/tessera.io/v1"
COSCHEDULING = "/apis/scheduling.x-k8s.io/v1alpha1"
LEASES = "/apis/coordination.k8s.io/v1"
BILLING = "/apis/billing.tessera.io/v1"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


def events(api: Any, url: str, since: str) -> list[tuple[str, str]]:
    answer = api.get(f"{url}?watch=true&resourceVersion={since}&timeoutSeconds=1")
    assert answer.status_code == 200, answer.text
    lines = [orjson.loads(line) for line in answer.text.splitlines() if line.strip()]
    return [(e["type"], e["object"]["metadata"]["name"]) for e in lines]


def podgroup(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"minMember": 2}}


def coscheduling(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": 2},
    }


def callback(name: str, url: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"url": url, "events": ["PodFinished"]}}


def test_dry_run_of_pod_groups_writes_nothing(tenant) -> None:
    for base, make in (
        (f"{TESSERA}/namespaces/{tenant.tenant}/podgroups", podgroup),
        (f"{COSCHEDULING}/namespaces/{tenant.tenant}/podgroups", coscheduling),
    ):
        dry = tenant.post(f"{base}?dryRun=All", json=make("dry"))
        assert dry.status_code == 201, dry.text
        assert tenant.get(f"{base}/dry").status_code == 404
        kept = tenant.post(base, json=make("kept")).json()
        patched = tenant.patch(
            f"{base}/kept?dryRun=All", json={"spec": {"minMember": 5}}, headers=MERGE
        )
        assert patched.status_code == 200 and patched.json()["spec"]["minMember"] == 5
        assert tenant.delete(f"{base}/kept?dryRun=All").status_code == 200
        now = tenant.get(f"{base}/kept").json()
        assert now["spec"]["minMember"] == 2
        assert now["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
        tenant.delete(f"{base}/kept")
    base = f"{COSCHEDULING}/namespaces/{tenant.tenant}/podgroups"
    kept = tenant.post(base, json=coscheduling("put")).json()
    replaced = tenant.put(
        f"{base}/put?dryRun=All", json={**kept, "spec": {**kept["spec"], "minMember": 9}}
    )
    assert replaced.status_code == 200
    assert tenant.get(f"{base}/put").json()["spec"]["minMember"] == 2


def test_dry_run_of_callbacks_writes_nothing(tenant, receiver) -> None:
    base = f"{TESSERA}/namespaces/{tenant.tenant}/callbacks"
    dry = tenant.post(f"{base}?dryRun=All", json=callback("dry", receiver.url()))
    assert dry.status_code == 201, dry.text
    assert tenant.get(f"{base}/dry").status_code == 404
    kept = tenant.post(base, json=callback("kept", receiver.url())).json()
    patched = tenant.patch(
        f"{base}/kept?dryRun=All", json={"spec": {"description": "changed"}}, headers=MERGE
    )
    assert patched.status_code == 200, patched.text
    rotated = tenant.post(f"{base}/kept/rotate?dryRun=All", json={})
    assert rotated.status_code in (200, 201), rotated.text
    assert tenant.delete(f"{base}/kept?dryRun=All").status_code == 200
    now = tenant.get(f"{base}/kept").json()
    assert now["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    assert now["spec"] == kept["spec"]


def test_dry_run_of_commitments_writes_nothing(tenant) -> None:
    base = f"{BILLING}/namespaces/{tenant.tenant}/commitments"
    body = {"metadata": {"name": "daily"}, "spec": {"amountPerDay": "100.00"}}
    dry = tenant.post(f"{base}?dryRun=All", json=body)
    assert dry.status_code == 201, dry.text
    assert tenant.get(f"{base}/daily").status_code == 404
    kept = tenant.post(base, json=body).json()
    patched = tenant.patch(
        f"{base}/daily?dryRun=All", json={"spec": {"amountPerDay": "150.00"}}, headers=MERGE
    )
    assert patched.status_code == 200, patched.text
    assert tenant.delete(f"{base}/daily?dryRun=All").status_code == 200
    now = tenant.get(f"{base}/daily").json()
    assert now["spec"] == kept["spec"]
    assert now["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]


def test_namespace_deletion_is_seen_by_every_watcher(tenant, admin, receiver) -> None:
    ns = f"{tenant.tenant}-cascade"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    kinds = {
        "podgroups": (f"{TESSERA}/podgroups", f"{TESSERA}/namespaces/{ns}/podgroups", podgroup),
        "coscheduling": (
            f"{COSCHEDULING}/podgroups",
            f"{COSCHEDULING}/namespaces/{ns}/podgroups",
            coscheduling,
        ),
        "callbacks": (
            f"{TESSERA}/callbacks",
            f"{TESSERA}/namespaces/{ns}/callbacks",
            lambda name: callback(name, receiver.url()),
        ),
        "leases": (
            f"{LEASES}/leases",
            f"{LEASES}/namespaces/{ns}/leases",
            lambda name: {"metadata": {"name": name}, "spec": {"holderIdentity": "me"}},
        ),
    }
    start = admin.get("/api/v1/namespaces").json()["metadata"]["resourceVersion"]
    for kind, (_, base, make) in kinds.items():
        writer = admin if kind == "leases" else tenant
        name = f"{kind}-1"
        made = writer.post(base, json=make(name))
        assert made.status_code == 201, (kind, made.text)
    assert tenant.delete(f"/api/v1/namespaces/{ns}").status_code == 200
    for kind, (everywhere, _, _) in kinds.items():
        seen = events(admin, everywhere, start)
        assert ("DELETED", f"{kind}-1") in seen, (kind, seen)
        if kind != "leases":  # the tenant's own watch too
            assert ("DELETED", f"{kind}-1") in events(tenant, everywhere, start), kind


def test_dry_run_of_nodes_gpus_and_tenants_writes_nothing(admin) -> None:
    name = unique("dry-node-")
    dry = admin.post("/api/v1/nodes?dryRun=All", json=gpu_node(name, gpus=1))
    assert dry.status_code == 201, dry.text
    assert admin.get(f"/api/v1/nodes/{name}").status_code == 404
    made = admin.post("/api/v1/nodes", json=gpu_node(name, gpus=1)).json()
    cordon = admin.patch(
        f"/api/v1/nodes/{name}?dryRun=All", json={"spec": {"unschedulable": True}}, headers=MERGE
    )
    assert cordon.status_code == 200 and cordon.json()["spec"]["unschedulable"] is True
    cordoned = {**made, "spec": {**made["spec"], "unschedulable": True}}
    replaced = admin.put(f"/api/v1/nodes/{name}?dryRun=All", json=cordoned)
    assert replaced.status_code == 200, replaced.text
    assert admin.delete(f"/api/v1/nodes/{name}?dryRun=All").status_code == 200
    now = admin.get(f"/api/v1/nodes/{name}").json()
    assert now["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    assert not now["spec"].get("unschedulable")
    gpu = next(
        g["metadata"]["name"]
        for g in admin.get(f"{TESSERA}/gpudevices").json()["items"]
        if g["metadata"]["name"].startswith(name)
    )
    before = admin.get(f"{TESSERA}/gpudevices/{gpu}").json()
    labelled = admin.patch(
        f"{TESSERA}/gpudevices/{gpu}?dryRun=All",
        json={"metadata": {"labels": {"dry": "yes"}}},
        headers=MERGE,
    )
    assert labelled.status_code == 200, labelled.text
    assert admin.get(f"{TESSERA}/gpudevices/{gpu}").json() == before
    tenant = unique("drytenant")
    made_tenant = admin.post(f"{TESSERA}/tenants?dryRun=All", json={"metadata": {"name": tenant}})
    assert made_tenant.status_code == 201, made_tenant.text
    assert admin.get(f"{TESSERA}/tenants/{tenant}").status_code == 404


# Writes that take no dryRun, and why: nothing is stored (access reviews; exec, attach and
# port-forward, whose plain HTTP answer says they are served over WebSocket), a node's report of
# what it observed (a container's log, a GPU's fault, its usage, an event), an operator's action on a
# device (repair), and tokens
# (shown once: a dry run's token would be one that never works).
NO_DRY_RUN = {
    ("post", "/api/v1/namespaces/{namespace}/pods/{name}/log"),
    ("post", "/api/v1/namespaces/{namespace}/pods/{name}/exec"),
    ("post", "/api/v1/namespaces/{namespace}/pods/{name}/attach"),
    ("post", "/api/v1/namespaces/{namespace}/pods/{name}/portforward"),
    ("post", "/api/v1/nodes/{node}/usage"),
    ("post", "/api/v1/namespaces/{namespace}/events"),  # a node's or a controller's record
    ("post", "/apis/authentication.k8s.io/v1/selfsubjectreviews"),
    ("post", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
    ("post", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"),
    ("post", "/apis/tessera.io/v1/gpudevices/{name}/fault"),
    ("post", "/apis/tessera.io/v1/gpudevices/{name}/repair"),
    ("post", "/apis/tessera.io/v1/tenants/{name}/tokens"),
    ("post", "/apis/tessera.io/v1/nodetokens"),
}


def test_every_write_of_every_kind_takes_dry_run(tmp_path: Path) -> None:
    """Walks the OpenAPI documents kubectl reads: every create, update, patch and delete of a
    kind declares `dryRun` (the tests above show it writes nothing), but for the listed ones."""
    app = create_app(Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/o.db"))
    try:
        lacking = {
            (method, path)
            for document in kube_openapi(app).values()
            for path, operations in document["paths"].items()
            for method, operation in operations.items()
            if method in ("post", "put", "patch", "delete")
            and "x-kubernetes-group-version-kind" in operation
            and not any(p["name"] == "dryRun" for p in operation.get("parameters", []))
        }
    finally:
        app.state.services.db.dispose()
    assert lacking == NO_DRY_RUN
