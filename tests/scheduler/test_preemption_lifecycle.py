"""Preemption through a victim's whole notice, on a real database (SQLite and PostgreSQL): the
capacity being freed is held for its preemptor against pods that arrive meanwhile, the victim
ends Failed (or is requeued Pending under its own name), the agent ends it when the notice is
over, and billing stops at its termination."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from app import agent
from app.db.engine import Database
from app.pods import service as pods
from billing import ledger
from scheduler.loop import LoopConfig, SchedulingLoop
from scheduler.preempt import PreemptionConfig
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create, disrupted, gpu_node, in_pool, new_tenant

BEST_EFFORT = {"tessera.io/compute-qos": "best-effort", "tessera.io/gpu-model": "H100"}
REGULAR = {"tessera.io/gpu-model": "H100"}


def scheduler(db: Database, pool: str, *, notice_seconds: int = 5) -> SchedulingLoop:
    config = LoopConfig(
        scheduler_name=pool,
        preemption=PreemptionConfig(min_runtime_s=0),
        notice_seconds=notice_seconds,
    )
    return SchedulingLoop(db, config)


def gpus(pool: str, name: str, count: int, labels: dict[str, str], **annotations: str) -> Any:
    document = in_pool(
        pool, manifest(name, cpu="8", memory="64Gi", gpus=count, labels=dict(labels))
    )
    if annotations:
        document["metadata"]["annotations"] = annotations
    return document


def read(db: Database, namespace: str, name: str) -> dict[str, Any]:
    return db.read(lambda s: pods.get(s, namespace=namespace, name=name))


def free_gpus(db: Database, node: str) -> int:
    return db.read(
        lambda s: s.execute(
            text("SELECT count(*) FROM gpu_devices WHERE node_name = :n AND core_free_pct = 100"),
            {"n": node},
        ).scalar_one()
    )


def run_best_effort(db: Database, loop: SchedulingLoop, ns: Any, pool: str, *names: str) -> list:
    spare = [create(db, ns, gpus(pool, n, 1, BEST_EFFORT)) for n in names]
    assert loop.run_once().bound == len(names)
    for p in spare:
        db.write(lambda s, uid=p["metadata"]["uid"]: pods.start(s, uid=uid))
    return spare


def audit_is_clean(db: Database, tenant_id: int) -> None:
    result = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=tenant_id))
    assert result.ok, result.problems


def test_the_capacity_being_freed_is_held_for_its_preemptor(db: Database) -> None:
    pool = unique("hold-")
    paying, spare_owner = new_tenant(db), new_tenant(db)
    node = gpu_node(db, pool, gpus=3)
    loop = scheduler(db, pool)
    spare = run_best_effort(db, loop, spare_owner, pool, "be0", "be1")
    assert free_gpus(db, node) == 1

    # Two GPUs: the free one and one victim's.
    create(db, paying, gpus(pool, "big", 2, REGULAR))
    assert loop.run_once().preempted == 1
    victim = next(p for p in spare if disrupted(read(db, spare_owner.name, p["metadata"]["name"])))
    assert read(db, paying.name, "big")["status"]["nominatedNodeName"] == node

    # A smaller regular pod arriving during the notice fits the free GPU, but that GPU is the
    # preemptor's: it waits, and nothing more is evicted for it while the victim stops.
    create(db, paying, gpus(pool, "small", 1, REGULAR))
    during = loop.run_once(now=10**9)
    assert (during.bound, during.preempted) == (0, 0)
    assert "nodeName" not in read(db, paying.name, "small")["spec"]
    assert free_gpus(db, node) == 1

    assert db.write(lambda s: pods.end_preempted(s, uid=victim["metadata"]["uid"]))
    assert free_gpus(db, node) == 2
    (other,) = [p for p in spare if p is not victim]
    assert not disrupted(read(db, spare_owner.name, other["metadata"]["name"]))
    placed = loop.run_once(now=2 * 10**9)
    big = read(db, paying.name, "big")
    assert big["spec"]["nodeName"] == node and "nominatedNodeName" not in big["status"]
    # Only now, with the node full again, does the smaller pod preempt for itself.
    assert placed.preempted == 1
    assert disrupted(read(db, spare_owner.name, other["metadata"]["name"]))
    assert read(db, paying.name, "small")["status"]["nominatedNodeName"] == node
    audit_is_clean(db, spare_owner.tenant_id)
    audit_is_clean(db, paying.tenant_id)


def test_no_other_plan_counts_on_a_node_being_freed(db: Database) -> None:
    pool = unique("held-")
    paying, spare_owner = new_tenant(db), new_tenant(db)
    gpu_node(db, pool, gpus=3)
    loop = scheduler(db, pool)
    spare = run_best_effort(db, loop, spare_owner, pool, "be0", "be1")
    create(db, paying, gpus(pool, "first", 2, REGULAR))
    assert loop.run_once().preempted == 1

    # The second pod would fit by evicting the other BestEffort pod and taking the free GPU,
    # but that GPU is the first one's: no plan, no second victim.
    create(db, paying, gpus(pool, "second", 2, REGULAR))
    assert loop.run_once(now=10**9).preempted == 0
    states = [disrupted(read(db, spare_owner.name, p["metadata"]["name"])) for p in spare]
    assert states.count(True) == 1
    assert "nominatedNodeName" not in read(db, paying.name, "second")["status"]


def test_a_pod_annotated_to_requeue_returns_pending_under_its_own_name(db: Database) -> None:
    pool = unique("rq-")
    paying, spare_owner = new_tenant(db), new_tenant(db)
    node = gpu_node(db, pool, gpus=1)
    loop = scheduler(db, pool)
    requeue = {"tessera.io/requeue-on-preemption": "true"}
    be = create(db, spare_owner, gpus(pool, "batch", 1, BEST_EFFORT, **requeue))
    assert loop.run_once().bound == 1
    db.write(lambda s: pods.start(s, uid=be["metadata"]["uid"]))

    create(db, paying, gpus(pool, "paying", 1, REGULAR))
    assert loop.run_once().preempted == 1
    assert db.write(lambda s: pods.end_preempted(s, uid=be["metadata"]["uid"]))

    again = read(db, spare_owner.name, "batch")
    assert again["metadata"]["uid"] != be["metadata"]["uid"]  # a new run: a new object
    assert again["status"]["phase"] == "Pending" and "nodeName" not in again["spec"]
    scheduled = next(c for c in again["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Preempted")
    assert again["metadata"]["labels"] == be["metadata"]["labels"]
    assert "tessera.io/gpu-allocation" not in again["metadata"].get("annotations", {})

    # The first run's billing stopped at its termination, with the reason.
    used = db.read(lambda s: ledger.events(s, pod_uid=be["metadata"]["uid"]))
    assert [(e.kind, e.reason) for e in used] == [("start", "bind"), ("stop", "preempt")]
    assert db.read(lambda s: ledger.events(s, pod_uid=again["metadata"]["uid"])) == []

    # The paying pod takes the GPU; the requeued one waits until it is free again.
    loop.run_once(now=10**9)
    assert read(db, paying.name, "paying")["spec"]["nodeName"] == node
    assert "nodeName" not in read(db, spare_owner.name, "batch")["spec"]
    paying_uid = read(db, paying.name, "paying")["metadata"]["uid"]
    db.write(lambda s: pods.start(s, uid=paying_uid))
    assert db.write(lambda s: pods.finish(s, uid=paying_uid))
    assert free_gpus(db, node) == 1  # finishing released it
    loop.run_once(now=2 * 10**9)
    assert read(db, spare_owner.name, "batch")["spec"]["nodeName"] == node
    audit_is_clean(db, spare_owner.tenant_id)
    audit_is_clean(db, paying.tenant_id)


def test_the_agent_stops_a_victim_when_its_notice_is_over(db: Database) -> None:
    pool = unique("ag-")
    paying, spare_owner = new_tenant(db), new_tenant(db)
    node = gpu_node(db, pool, gpus=1)
    loop = scheduler(db, pool, notice_seconds=0)
    (victim,) = run_best_effort(db, loop, spare_owner, pool, "be")
    started = datetime.now(UTC)
    create(db, paying, gpus(pool, "paying", 1, REGULAR))
    assert loop.run_once().preempted == 1

    agent.run_once(db, keep_changes=10**6)
    ended = read(db, spare_owner.name, "be")
    assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "Preempted")
    state = ended["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (143, "Preempted")
    stop = db.read(lambda s: ledger.events(s, pod_uid=victim["metadata"]["uid"]))[-1]
    assert (stop.kind, stop.reason) == ("stop", "preempt")
    assert started - timedelta(seconds=1) <= stop.at <= datetime.now(UTC)

    loop.run_once(now=10**9)
    assert read(db, paying.name, "paying")["spec"]["nodeName"] == node
    # A failed victim is kept (kubectl shows it) until its owner deletes it, which frees nothing.
    db.write(lambda s: pods.delete(s, namespace=spare_owner.name, name="be", grace_seconds=0))
    assert free_gpus(db, node) == 0
    audit_is_clean(db, spare_owner.tenant_id)


def test_each_side_is_told_the_other_when_they_share_a_tenant(db: Database) -> None:
    pool = unique("told-")
    ns, stranger = new_tenant(db), new_tenant(db)
    gpu_node(db, pool, gpus=2)
    loop = scheduler(db, pool)
    (own,) = run_best_effort(db, loop, ns, pool, "own-spare")
    (foreign,) = run_best_effort(db, loop, stranger, pool, "foreign-spare")
    # Two GPUs: both BestEffort pods must go, one of the same tenant and one of another.
    create(db, ns, gpus(pool, "paying", 2, REGULAR))
    assert loop.run_once().preempted == 2

    def messages(pod: dict[str, Any], reason: str) -> list[str]:
        rows = db.read(
            lambda s: s.execute(
                text("SELECT message FROM events WHERE involved_uid = :u AND reason = :r"),
                {"u": pod["metadata"]["uid"], "r": reason},
            ).all()
        )
        return [m for (m,) in rows]

    (to_preemptor,) = messages(read(db, ns.name, "paying"), "Preempting")
    assert f"{ns.name}/own-spare" in to_preemptor and "1 pod(s) of another tenant" in to_preemptor
    assert "foreign-spare" not in to_preemptor and stranger.name not in to_preemptor
    (to_own,) = messages(own, "Preempted")
    assert f"{ns.name}/paying" in to_own
    (to_foreign,) = messages(foreign, "Preempted")
    assert "paying" not in to_foreign and ns.name not in to_foreign
    assert "another tenant" in to_foreign


def test_a_preemptor_binds_where_its_victims_were_stopped(db: Database) -> None:
    pool = unique("pin-")
    paying, spare_owner = new_tenant(db), new_tenant(db)
    first, second = gpu_node(db, pool, gpus=1), gpu_node(db, pool, gpus=1)
    loop = scheduler(db, pool)
    spare = run_best_effort(db, loop, spare_owner, pool, "be0", "be1")
    create(db, paying, gpus(pool, "paying", 1, REGULAR))
    assert loop.run_once().preempted == 1
    nominated = read(db, paying.name, "paying")["status"]["nominatedNodeName"]
    victim = next(p for p in spare if disrupted(read(db, spare_owner.name, p["metadata"]["name"])))
    (other,) = [p for p in spare if p is not victim]

    # The other BestEffort pod finishes on its own during the notice: its GPU is free, but the
    # preemptor keeps to the node stopped for it (elsewhere, that eviction would be wasted),
    # and the free GPU goes to the next pod.
    assert db.write(lambda s: pods.finish(s, uid=other["metadata"]["uid"]))
    create(db, paying, gpus(pool, "next", 1, REGULAR))
    loop.run_once(now=10**9)
    assert "nodeName" not in read(db, paying.name, "paying")["spec"]
    assert (
        read(db, paying.name, "next")["spec"]["nodeName"] == ({first, second} - {nominated}).pop()
    )

    assert db.write(lambda s: pods.end_preempted(s, uid=victim["metadata"]["uid"]))
    loop.run_once(now=2 * 10**9)
    assert read(db, paying.name, "paying")["spec"]["nodeName"] == nominated
