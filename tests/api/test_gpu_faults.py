"""GPU faults over real HTTP (SQLite and PostgreSQL): only the admin reports a fault or a
repair (a tenant gets 403 and nothing changes), a refused report says what is wrong and writes
nothing, the pods on the GPU see the fault in their condition and events, `kubectl get gpu`'s
table shows the health and the last fault, the usage report bills a pod up to the fault second,
and a NoSchedule taint drains a GPU without stopping its pods."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from app.db.models import Change
from app.faults import service as faults
from app.pods import service as pods
from tests.conftest import unique
from tests.factories import gpu_node, pod

GPUS = "/apis/tessera.io/v1/gpudevices"
BILLING = "/apis/billing.tessera.io/v1"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def fault(kind: str, **fields: object) -> dict:
    return {"apiVersion": "tessera.io/v1", "kind": "GPUFault", "spec": {"kind": kind, **fields}}


def new_node(admin, gpus: int = 2) -> str:
    node = unique("flt-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=gpus)).status_code == 201
    return node


def slice_on(tenant, admin, name: str, node: str, gpu: int, *, cpu: str = "2") -> dict:
    ns = tenant.tenant
    manifest = pod(name, cpu=cpu, memory="8Gi", gpu_memory="20Gi", gpu_core=25)
    created = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest)
    assert created.status_code == 201, created.text
    return bind(tenant, admin, name, node, gpu)


def bind(tenant, admin, name: str, node: str, gpu: int):
    share = [{"gpu": f"{node}-gpu{gpu}", "memoryMiB": 20480, "corePercent": 25}]
    binding = {
        "target": {"kind": "Node", "name": node},
        "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(share)}},
    }
    return admin.post(f"/api/v1/namespaces/{tenant.tenant}/pods/{name}/binding", json=binding)


def disruption(obj: dict) -> dict | None:
    return next((c for c in obj["status"]["conditions"] if c["type"] == "DisruptionTarget"), None)


def test_the_admin_reports_a_fault_and_a_repair(server, admin, make_tenant) -> None:
    owner, intruder = make_tenant("flo"), make_tenant("flx")
    db = server.services.db
    node = new_node(admin)
    gpu0, gpu1 = f"{node}-gpu0", f"{node}-gpu1"
    ns = owner.tenant
    for name, gpu in (("on0", 0), ("on1", 1)):
        assert slice_on(owner, admin, name, node, gpu).status_code == 201
        uid = owner.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["metadata"]["uid"]
        db.write(lambda s, uid=uid: pods.start(s, uid=uid))
    before = admin.get(f"{GPUS}/{gpu0}").json()

    # Refused: a tenant (whether or not the GPU exists), and reports that are not faults.
    for path in (f"{GPUS}/{gpu0}/fault", f"{GPUS}/nothing/fault"):
        refused = intruder.post(path, json=fault("ecc"))
        assert refused.status_code == 403 and refused.json()["reason"] == "Forbidden"
    assert owner.post(f"{GPUS}/{gpu0}/repair").status_code == 403
    bad = {
        "kind": (fault("overheat"), "spec.kind"),
        "xid missing": (fault("xid"), "spec.xid"),
        "xid on ecc": (fault("ecc", xid=79), "spec.xid"),
        "application xid": (fault("xid", xid=13), "spec.xid"),
        "xid too big": (fault("xid", xid=10**6), "spec.xid"),
        "message": (fault("driver", message="x" * 1025), "spec.message"),
        "unknown field": (fault("ecc", severity="high"), None),
    }
    for what, (body, field) in bad.items():
        answer = admin.post(f"{GPUS}/{gpu0}/fault", json=body)
        assert answer.status_code in (400, 422), (what, answer.text)
        status = answer.json()
        assert status["kind"] == "Status" and status["message"], what
        if field is not None:
            assert field in {c["field"] for c in status["details"]["causes"]}, (what, status)
    assert admin.post(f"{GPUS}/nothing/fault", json=fault("ecc")).status_code == 404
    assert admin.get(f"{GPUS}/{gpu0}").json() == before  # nothing was written

    reported = admin.post(
        f"{GPUS}/{gpu0}/fault", json=fault("xid", xid=79, message="GPU has fallen off the bus")
    )
    assert reported.status_code == 200, reported.text
    gpu = reported.json()
    assert gpu["status"]["health"] == "Unhealthy"
    # The node counts only its healthy GPUs, and its watchers are told.
    node_now = admin.get(f"/api/v1/nodes/{node}").json()
    assert node_now["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert node_now["status"]["capacity"]["nvidia.com/gpu"] == "2"
    logged = db.read(
        lambda s: s.scalars(
            select(Change.object)
            .where(Change.kind == "Node", Change.name == node)
            .order_by(Change.resource_version.desc())
            .limit(1)
        ).one()
    )
    assert logged["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert [(t["key"], t["effect"]) for t in gpu["spec"]["taints"]] == [
        ("tessera.io/gpu-fault", "NoExecute")
    ]
    (record,) = gpu["status"]["faults"]
    assert (record["kind"], record["xid"], record["message"]) == (
        "xid",
        79,
        "GPU has fallen off the bus",
    )
    # The tenant sees it on the GPU, on its pod and in its events; the other pod is untouched.
    seen = owner.get(f"{GPUS}/{gpu0}").json()
    assert seen["status"]["faults"] == gpu["status"]["faults"]
    on0 = owner.get(f"/api/v1/namespaces/{ns}/pods/on0").json()
    condition = disruption(on0)
    assert condition["reason"] == "DeletionByDeviceTaintManager"
    assert gpu0 in condition["message"] and "Xid 79" in condition["message"]
    assert disruption(owner.get(f"/api/v1/namespaces/{ns}/pods/on1").json()) is None
    events = owner.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    warned = [e for e in events if e["reason"] == "GPUFault"]
    assert [e["involvedObject"]["name"] for e in warned] == ["on0"]
    assert warned[0]["type"] == "Warning" and gpu0 in warned[0]["message"]

    # kubectl get gpu: the health and the last fault.
    table = admin.get(GPUS, headers=TABLE).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    rows = {r["cells"][0]: dict(zip(names, r["cells"], strict=True)) for r in table["rows"]}
    assert rows[gpu0]["Health"] == "Unhealthy" and rows[gpu0]["Last Fault"].startswith("xid 79 (")
    assert rows[gpu0]["Taints"] == "tessera.io/gpu-fault:NoExecute"
    assert (rows[gpu1]["Health"], rows[gpu1]["Last Fault"]) == ("Healthy", "<none>")

    # Nothing new is bound to it; after the repair it takes pods again.
    created = owner.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("late", gpu_memory="20Gi", gpu_core=25)
    )
    assert created.status_code == 201
    refused = bind(owner, admin, "late", node, 0)
    assert refused.status_code == 422 and "unhealthy" in refused.json()["message"]
    healthy = {"status": {"health": "Healthy"}}
    patched = admin.patch(f"{GPUS}/{gpu0}", json=healthy, headers=MERGE)
    assert patched.status_code == 422 and "repair" in patched.json()["message"]
    repaired = admin.post(f"{GPUS}/{gpu0}/repair")
    assert repaired.status_code == 200
    assert repaired.json()["status"]["health"] == "Healthy"
    assert "taints" not in repaired.json()["spec"]
    assert repaired.json()["status"]["faults"][-1]["repairedTime"]
    assert bind(owner, admin, "late", node, 0).status_code == 201
    table = admin.get(f"{GPUS}/{gpu0}", headers=TABLE).json()
    assert table["rows"][0]["cells"][5:7] == ["Healthy", table["rows"][0]["cells"][6]]
    assert table["rows"][0]["cells"][6].endswith(", repaired)")


def test_usage_ends_at_the_fault_second(
    server, admin, make_tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = make_tenant("flb")
    db = server.services.db
    node = new_node(admin, gpus=1)
    ns = owner.tenant
    assert slice_on(owner, admin, "train", node, 0).status_code == 201
    bound = owner.get(f"/api/v1/namespaces/{ns}/pods/train").json()
    bound_at = datetime.fromisoformat(
        next(c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled")[
            "lastTransitionTime"
        ].replace("Z", "+00:00")
    )
    db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))
    real = faults.now
    # The fault 5 s after the bind, the end of its grace period 35 s after (no waiting).
    monkeypatch.setattr(faults, "now", lambda: max(real(), bound_at + timedelta(seconds=5)))
    assert admin.post(f"{GPUS}/{node}-gpu0/fault", json=fault("ecc")).status_code == 200
    monkeypatch.setattr(pods, "now", lambda: bound_at + timedelta(seconds=40))
    assert db.write(lambda s: pods.end_preempted(s, uid=bound["metadata"]["uid"]))
    monkeypatch.undo()
    ended = owner.get(f"/api/v1/namespaces/{ns}/pods/train").json()
    assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "GPUFault")

    params = {
        "from": bound_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "to": (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "granularity": "second",
        "groupBy": "resource",
    }
    report = owner.get(f"{BILLING}/namespaces/{ns}/usage", params=params)
    assert report.status_code == 200, report.text
    cpu_rows = [r for r in report.json()["items"] if r["resource"] == "vcpu"]
    # Billed from the bind second to the fault second: 5 s, none of the grace period.
    assert len(cpu_rows) == 5
    assert Decimal(report.json()["total"]["quantities"]["vcpu"]) == 5 * 2


def test_a_drain_taint_keeps_new_fragments_off_and_the_pods_running(
    server, admin, make_tenant
) -> None:
    owner = make_tenant("fld")
    node = new_node(admin, gpus=1)
    gpu = f"{node}-gpu0"
    ns = owner.tenant
    assert slice_on(owner, admin, "stays", node, 0).status_code == 201
    drain = {"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}}
    assert owner.patch(f"{GPUS}/{gpu}", json=drain, headers=MERGE).status_code == 403
    drained = admin.patch(f"{GPUS}/{gpu}", json=drain, headers=MERGE)
    assert drained.status_code == 200, drained.text
    assert drained.json()["status"]["health"] == "Healthy"
    (taint,) = drained.json()["spec"]["taints"]
    assert (taint["key"], taint["effect"]) == ("example.com/maintenance", "NoSchedule")
    assert taint["timeAdded"]
    stays = owner.get(f"/api/v1/namespaces/{ns}/pods/stays").json()
    assert disruption(stays) is None and stays["spec"]["nodeName"] == node
    owner.post(f"/api/v1/namespaces/{ns}/pods", json=pod("new", gpu_memory="20Gi", gpu_core=25))
    refused = bind(owner, admin, "new", node, 0)
    assert refused.status_code == 422 and "tainted" in refused.json()["message"]

    # A fault is not set (or lifted) by a patch; an unknown effect is refused; nothing changes.
    for taints, field in (
        ([{"key": "x", "effect": "NoExecute"}], "spec.taints[0].effect"),
        ([{"key": "tessera.io/gpu-fault", "effect": "NoExecute"}], "spec.taints[0].key"),
        ([{"key": "", "effect": "NoSchedule"}], "spec.taints[0].key"),
    ):
        answer = admin.patch(f"{GPUS}/{gpu}", json={"spec": {"taints": taints}}, headers=MERGE)
        assert answer.status_code == 422, answer.text
        assert field in {c["field"] for c in answer.json()["details"]["causes"]}
    assert admin.get(f"{GPUS}/{gpu}").json()["spec"]["taints"] == drained.json()["spec"]["taints"]

    undrained = admin.patch(f"{GPUS}/{gpu}", json={"spec": {"taints": None}}, headers=MERGE)
    assert undrained.status_code == 200 and "taints" not in undrained.json()["spec"]
    assert bind(owner, admin, "new", node, 0).status_code == 201


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"spec": {"kind": "xid", "xid": 1' + b"0" * 5000 + b"}}", 400),
        (b'{"spec": {"kind": "xid", "xid": 100000000000000000000000000000}}', 400),
        (b'{"spec": {"kind": "xid", "xid": "79"}}', 400),
        (b'{"spec": {"kind": "xid", "xid": 79.5}}', 400),
        (b'{"spec": {"kind": "ecc", "message": ["a"]}}', 400),
        (b'{"spec": {"kind": "ecc"}, "kind": "Pod"}', 400),
        (b'{"spec": "ecc"}', 400),
        (b'{"spec": {"kind": "xid", "xid": 0}}', 422),
        (b"[1, 2]", 400),
        (b"", 400),
    ],
)
def test_hostile_fault_reports_are_refused_and_write_nothing(server, admin, body, code) -> None:
    from tests.api.test_hostile_input import refused, writes_nothing

    node = new_node(admin, gpus=1)
    with writes_nothing(server):
        response = admin.post(
            f"{GPUS}/{node}-gpu0/fault", content=body, headers={"Content-Type": "application/json"}
        )
        refused(response, code)
