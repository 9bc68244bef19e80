"""A GPU fault through its whole life, with the real scheduling loop on a real database (SQLite
and PostgreSQL): the pods on the faulty GPU (and only they) are told at once, nothing new is
placed on it while the rest of the node keeps taking pods, after the grace period they stop
(Failed/GPUFault, or Pending again and placed elsewhere under their own names, a gang whole),
billing ends at the fault second, and a repair makes the GPU placeable again."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from app import agent
from app.db.engine import Database
from app.db.models import Event
from app.errors import Invalid
from app.faults import service as faults
from app.inventory.service import GPUShare
from app.pods import service as pods
from billing import ledger
from billing.usage import whole_second
from scheduler.loop import LoopConfig, SchedulingLoop, build_snapshot
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create, gpu_node, in_pool, make_group, new_tenant

MODEL = {"tessera.io/gpu-model": "H100"}
RESCHEDULE = {"tessera.io/reschedule-on-fault": "true"}


def read(db: Database, namespace: str, name: str) -> dict[str, Any]:
    return db.read(lambda s: pods.get(s, namespace=namespace, name=name))


def gpus_of(obj: dict[str, Any]) -> list[str]:
    raw = obj["metadata"].get("annotations", {}).get("tessera.io/gpu-allocation")
    return [share["gpu"] for share in json.loads(raw)] if raw else []


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj["status"]["conditions"] if c["type"] == kind), None)


def warnings_of(db: Database, uid: str) -> list[tuple[str, str]]:
    return db.read(
        lambda s: [
            (e.reason, e.message)
            for e in s.scalars(
                select(Event).where(Event.involved_uid == uid, Event.type == "Warning")
            )
        ]
    )


def start(db: Database, *objs: dict[str, Any]) -> None:
    for obj in objs:
        db.write(lambda s, uid=obj["metadata"]["uid"]: pods.start(s, uid=uid))


def bind(db: Database, ns: Any, name: str, node: str, *shares: GPUShare) -> dict[str, Any]:
    return db.write(
        lambda s: pods.bind(s, namespace=ns.name, name=name, node_name=node, gpus=list(shares))
    )


def later(seconds: int):
    """`now` as the pod service sees it, `seconds` from the real now (the end of a grace
    period, without waiting for it)."""
    real = pods.now

    def shifted() -> datetime:
        return real() + timedelta(seconds=seconds)

    return shifted


def test_a_fault_isolates_one_gpu_and_stops_exactly_the_pods_on_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = unique("flt-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=4)
    g = [f"{node}-gpu{i}" for i in range(4)]
    slice_spec = {"cpu": "2", "memory": "8Gi", "gpu_memory": "20Gi", "gpu_core": 25}
    for name in ("s1", "s2", "other"):
        create(db, ns, in_pool(pool, manifest(name, labels=dict(MODEL), **slice_spec)))
    create(db, ns, in_pool(pool, manifest("whole", cpu="8", memory="64Gi", gpus=2, labels=MODEL)))
    # A slice and another slice on gpu0, a two-GPU pod on gpu1 and gpu2, a slice on gpu3.
    s1 = bind(db, ns, "s1", node, GPUShare(g[0], 20480, 25))
    s2 = bind(db, ns, "s2", node, GPUShare(g[0], 20480, 25))
    whole = bind(db, ns, "whole", node, GPUShare(g[1], 81920, 100), GPUShare(g[2], 81920, 100))
    other = bind(db, ns, "other", node, GPUShare(g[3], 20480, 25))
    start(db, s1, s2, whole, other)

    gpu = db.write(
        lambda s: faults.report_fault(
            s, name=g[0], kind="xid", xid=79, message="fallen off the bus", grace_seconds=30
        )
    )
    fault_time = datetime.fromisoformat(gpu["status"]["faults"][-1]["time"].replace("Z", "+00:00"))
    assert gpu["status"]["health"] == "Unhealthy"
    assert gpu["spec"]["taints"] == [
        {
            "key": "tessera.io/gpu-fault",
            "value": "xid",
            "effect": "NoExecute",
            "timeAdded": gpu["status"]["faults"][-1]["time"],
        }
    ]
    assert gpu["status"]["faults"][-1]["xid"] == 79
    # The fault of gpu1 too: the two-GPU pod holds it (and a healthy gpu2).
    db.write(lambda s: faults.report_fault(s, name=g[1], kind="ecc", grace_seconds=30))

    for name in ("s1", "s2", "whole"):
        told = read(db, ns.name, name)
        target = condition(told, "DisruptionTarget")
        assert target is not None and target["reason"] == "DeletionByDeviceTaintManager"
        assert told["status"]["phase"] == "Running"  # it has its grace period
        gpu_named = g[0] if name != "whole" else g[1]
        assert gpu_named in target["message"]
        (event,) = [w for w in warnings_of(db, told["metadata"]["uid"]) if w[0] == "GPUFault"]
        assert gpu_named in event[1]
    assert "Xid 79" in condition(read(db, ns.name, "s1"), "DisruptionTarget")["message"]
    untouched = read(db, ns.name, "other")
    assert condition(untouched, "DisruptionTarget") is None
    assert warnings_of(db, untouched["metadata"]["uid"]) == []

    # Nothing new on the faulty GPUs (gpu0 still has 40Gi free), the rest of the node serves.
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=pool))
    for i in range(2):
        create(db, ns, in_pool(pool, manifest(f"new{i}", labels=dict(MODEL), **slice_spec)))
    assert scheduler.run_once().bound == 2
    for i in range(2):
        placed = read(db, ns.name, f"new{i}")
        assert placed["spec"]["nodeName"] == node and gpus_of(placed) == [g[3]]
    healthy = {x.id: x.healthy for x in db.read(lambda s: build_snapshot(s)).gpus if x.node == node}
    assert healthy == {g[0]: False, g[1]: False, g[2]: True, g[3]: True}
    create(db, ns, in_pool(pool, manifest("late", labels=dict(MODEL), **slice_spec)))
    with pytest.raises(Invalid, match="unhealthy"):  # a stale plan cannot bind there either
        bind(db, ns, "late", node, GPUShare(g[0], 20480, 25))
    db.write(lambda s: pods.delete(s, namespace=ns.name, name="late", grace_seconds=0))

    # After the grace period (30 s later) the agent stops them: Failed, GPUFault.
    monkeypatch.setattr(pods, "now", later(31))
    for name in ("s1", "s2", "whole"):
        uid = read(db, ns.name, name)["metadata"]["uid"]
        assert db.write(lambda s, uid=uid: pods.end_preempted(s, uid=uid))
    monkeypatch.undo()
    for name in ("s1", "s2", "whole"):
        ended = read(db, ns.name, name)
        assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "GPUFault")
        (container,) = ended["status"]["containerStatuses"]
        assert container["state"]["terminated"]["reason"] == "GPUFault"
    assert read(db, ns.name, "other")["status"]["phase"] == "Running"
    # Billing ended at the fault second, not at the end of the grace period.
    usage = db.read(lambda s: ledger.usage(s, tenant_id=ns.tenant_id))
    s1_usage = usage[s1["metadata"]["uid"]]
    assert s1_usage.stopped == whole_second(fault_time) and s1_usage.stop_reason == "gpu-fault"
    assert usage[other["metadata"]["uid"]].open
    audit = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=ns.tenant_id))
    assert audit.ok, audit.problems
    # Their capacity went back: gpu2 (healthy) is whole again and takes a whole-GPU pod.
    create(db, ns, in_pool(pool, manifest("w2", cpu="8", memory="64Gi", gpus=1, labels=MODEL)))
    assert scheduler.run_once(now=10**9).bound == 1
    assert gpus_of(read(db, ns.name, "w2")) == [g[2]]

    # The repair returns gpu0: Healthy, no taint, the fault closed, placeable again.
    repaired = db.write(lambda s: faults.repair(s, name=g[0]))
    assert repaired["status"]["health"] == "Healthy" and "taints" not in repaired["spec"]
    assert repaired["status"]["faults"][-1]["repairedTime"]
    healthy = {x.id: x.healthy for x in db.read(lambda s: build_snapshot(s)).gpus if x.node == node}
    assert healthy[g[0]] and not healthy[g[1]]
    create(db, ns, in_pool(pool, manifest("back", labels=dict(MODEL), **slice_spec)))
    assert gpus_of(bind(db, ns, "back", node, GPUShare(g[0], 20480, 25))) == [g[0]]


def test_a_pod_that_reschedules_on_fault_is_placed_again_elsewhere(db: Database) -> None:
    pool = unique("flr-")
    ns = new_tenant(db)
    gpu_node(db, pool, gpus=2)
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=pool))
    document = in_pool(pool, manifest("job", cpu="8", memory="64Gi", gpus=1, labels=MODEL))
    document["metadata"]["annotations"] = dict(RESCHEDULE)
    create(db, ns, document)
    assert scheduler.run_once().bound == 1
    first = read(db, ns.name, "job")
    start(db, first)
    (failed,) = gpus_of(first)
    db.write(lambda s: faults.report_fault(s, name=failed, kind="driver", grace_seconds=0))

    agent.run_once(db, keep_changes=10**6)  # the grace (0 s) is over: the agent ends it
    again = read(db, ns.name, "job")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again["status"]["phase"] == "Pending" and "nodeName" not in again["spec"]
    assert condition(again, "PodScheduled")["reason"] == "GPUFault"
    assert scheduler.run_once(now=10**9).bound == 1
    start(db, read(db, ns.name, "job"))
    placed = read(db, ns.name, "job")
    assert placed["status"]["phase"] == "Running" and gpus_of(placed) not in ([], [failed])
    usage = db.read(lambda s: ledger.usage(s, tenant_id=ns.tenant_id))
    assert usage[first["metadata"]["uid"]].stop_reason == "gpu-fault"
    assert usage[placed["metadata"]["uid"]].open


def test_a_gang_goes_back_whole_and_keeps_its_required_domain(db: Database) -> None:
    pool = unique("flg-")
    ns = new_tenant(db)
    nodes = [gpu_node(db, pool, gpus=2) for _ in range(2)]
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=pool))
    make_group(db, ns, "train", 2, "node")
    for i in range(2):
        document = in_pool(
            pool,
            manifest(
                f"w{i}",
                cpu="8",
                memory="64Gi",
                gpus=1,
                labels={**MODEL, "tessera.io/pod-group": "train"},
            ),
        )
        document["metadata"]["annotations"] = dict(RESCHEDULE)
        create(db, ns, document)
    assert scheduler.run_once().bound == 2
    members = [read(db, ns.name, f"w{i}") for i in range(2)]
    start(db, *members)
    (first_node,) = {m["spec"]["nodeName"] for m in members}
    failing = gpus_of(members[0])[0]
    db.write(lambda s: faults.report_fault(s, name=failing, kind="bus", grace_seconds=0))
    # The member on the healthy GPU is told too: its gang goes back whole.
    for i in range(2):
        target = condition(read(db, ns.name, f"w{i}"), "DisruptionTarget")
        assert target is not None and failing in target["message"]

    agent.run_once(db, keep_changes=10**6)
    back = [read(db, ns.name, f"w{i}") for i in range(2)]
    assert all(b["status"]["phase"] == "Pending" and "nodeName" not in b["spec"] for b in back)
    assert {b["metadata"]["uid"] for b in back}.isdisjoint(m["metadata"]["uid"] for m in members)
    assert scheduler.run_once(now=10**9).bound == 2
    placed = [read(db, ns.name, f"w{i}") for i in range(2)]
    # One node for the whole gang (required: node); the first has one healthy GPU left.
    assert {p["spec"]["nodeName"] for p in placed} == {n for n in nodes if n != first_node}
    start(db, *placed)
    assert all(read(db, ns.name, f"w{i}")["status"]["phase"] == "Running" for i in range(2))


def test_the_fault_history_is_bounded_and_newest_last(db: Database) -> None:
    node = gpu_node(db, unique("flh-"), gpus=1)
    gpu = f"{node}-gpu0"
    for i in range(faults.FAULT_HISTORY + 2):
        db.write(
            lambda s, i=i: faults.report_fault(
                s, name=gpu, kind="driver", message=f"#{i}", grace_seconds=0
            )
        )
        if i % 2:
            db.write(lambda s: faults.repair(s, name=gpu))
    history = db.read(lambda s: faults.get(s, name=gpu))["status"]["faults"]
    assert len(history) == faults.FAULT_HISTORY
    assert [f["message"] for f in history] == [f"#{i}" for i in range(2, faults.FAULT_HISTORY + 2)]
    # A repair closes every fault still open (the even ones were followed by another fault).
    assert all("repairedTime" in f for f in history)
    db.write(lambda s: faults.report_fault(s, name=gpu, kind="ecc", grace_seconds=0))
    history = db.read(lambda s: faults.get(s, name=gpu))["status"]["faults"]
    assert "repairedTime" not in history[-1] and history[-1]["kind"] == "ecc"
    assert len(history) == faults.FAULT_HISTORY
