"""The scheduling loop on a real database (SQLite and PostgreSQL): pending pods are solved and
bound, capacity moves with them, and what does not fit says why."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from app.auth import service as auth
from app.bootstrap import bootstrap
from app.db.engine import Database, current_resource_version, next_resource_version
from app.deps import Services
from app.inventory import service as inventory
from app.inventory.service import NodeSpec, default_gpu_layout
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.pods.admission import admit
from app.pods.schemas import Pod
from app.settings import Settings
from app.watch.notify import Notifier
from scheduler.loop import (
    LoopConfig,
    Mirror,
    SchedulingLoop,
    build_snapshot,
    drift,
    read_changes,
)
from scheduler.preempt import PreemptionConfig
from scheduler.snapshot import WorkloadShape
from tests.conftest import migrated_database, unique
from tests.factories import pod as manifest


def new_tenant(db: Database) -> NamespaceInfo:
    name = unique("sch")
    tenant = db.write(lambda s: auth.create_tenant(s, name=name))
    return NamespaceInfo(name, tenant.id, False)


def prepared(db: Database, ns: NamespaceInfo, document: dict[str, Any]) -> pods.NewPod:
    """A create worked out before its write (`pods.insert` writes it), as the API does."""
    pod = Pod.model_validate(document)
    context = db.read(Services.build(Settings(), db=db).admission)
    admitted = admit(pod, specs=context.specs, pool=context.pool, default_spec=context.default_spec)
    return pods.prepare(namespace=ns, pod=pod, admitted=admitted)


def create(db: Database, ns: NamespaceInfo, document: dict[str, Any]) -> dict[str, Any]:
    pod = Pod.model_validate(document)

    def work(session: Any) -> dict[str, Any]:
        context = Services.build(Settings(), db=db).admission(session)
        admitted = admit(
            pod, specs=context.specs, pool=context.pool, default_spec=context.default_spec
        )
        return pods.create(session, namespace=ns, pod=pod, admitted=admitted)

    made = db.write(work)
    visible(db, made["metadata"]["resourceVersion"])
    return made


def visible(db: Database, version: int | str, timeout: float = 60.0) -> None:
    """Wait until a reader's horizon (`current_resource_version`) has passed `version`. On
    PostgreSQL the scheduler's mirror reads a commit once every transaction of the database
    begun before it has ended, and other tests' processes write to the database meanwhile: a
    cycle run at once may not see a pod just created yet (the next one does)."""
    version = int(version)
    deadline = time.monotonic() + timeout
    while db.read(current_resource_version) < version:
        assert time.monotonic() < deadline, f"resourceVersion {version} never became visible"
        time.sleep(0.01)


POOL_LABEL = "tessera.io/test-pool"


def gpu_node(db: Database, pool: str, *, gpus: int = 8, model: str = "H100") -> str:
    """A node in a pool of its own: the database is shared with other tests, whose pods and
    nodes must not mix with this test's, so this test's pods select the pool label."""
    name = unique("ln-")
    spec = NodeSpec(
        name=name,
        cpu_milli=96000,
        memory_mib=1024 * 1024,
        zone=unique("z"),
        labels={POOL_LABEL: pool},
        gpus=default_gpu_layout(name, gpus, model),
    )
    db.write(lambda s: inventory.create_node(s, spec))
    return name


@pytest.fixture(scope="module")
def db(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A database of this module's own: its loops run by a fake clock and count every pending
    pod of their pools, which no node loop of another test's processes (sharing the worker's
    database) may touch meanwhile."""
    backend = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    with migrated_database(backend, tmp_path_factory) as url:
        database = Database(url)
        bootstrap(database)
        yield database
        database.dispose()


def in_pool(pool: str, document: dict[str, Any]) -> dict[str, Any]:
    """The pod goes to the scheduler named `pool`, and only onto nodes of that pool."""
    document["spec"]["schedulerName"] = pool
    document["spec"]["nodeSelector"] = {POOL_LABEL: pool}
    return document


def loop(db: Database, scheduler_name: str) -> SchedulingLoop:
    return SchedulingLoop(db, LoopConfig(scheduler_name=scheduler_name))


def test_pending_pods_are_bound_and_capacity_follows(db: Database) -> None:
    name = unique("sched-")
    ns = new_tenant(db)
    node = gpu_node(db, name, gpus=2)
    slices = [
        create(
            db,
            ns,
            in_pool(name, manifest(f"s{i}", cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25)),
        )
        for i in range(3)
    ]
    whole_gpu = manifest(
        "w", cpu="8", memory="64Gi", gpus=1, labels={"tessera.io/gpu-model": "H100"}
    )
    whole = create(db, ns, in_pool(name, whole_gpu))
    result = loop(db, name).run_once()
    assert (result.pending, result.bound, result.unschedulable, result.stale) == (4, 4, 0, 0)
    placed = {
        p["metadata"]["name"]: db.read(
            lambda s, p=p: pods.get(s, namespace=ns.name, name=p["metadata"]["name"])
        )
        for p in [*slices, whole]
    }
    assert {p["spec"]["nodeName"] for p in placed.values()} == {node}
    free = db.read(
        lambda s: s.execute(
            text(
                "SELECT name, vram_free_mib, core_free_pct FROM gpu_devices WHERE node_name = :n ORDER BY name"
            ),
            {"n": node},
        ).all()
    )
    # The whole GPU is one GPU; the three slices share the other one (they are not spread).
    assert sorted((v, c) for _, v, c in free) == [(0, 0), (81920 - 3 * 20480, 25)]
    cpu = db.read(
        lambda s: s.execute(
            text("SELECT cpu_free_milli FROM nodes WHERE name = :n"), {"n": node}
        ).scalar_one()
    )
    assert cpu == 96000 - 3 * 2000 - 8000
    assert loop(db, name).run_once().pending == 0  # nothing left to do


def test_a_commit_wakes_the_loop_long_before_its_interval(db: Database) -> None:
    """Told of commits, the loop does not wait out `interval` when a pod is created: it looks
    as soon as the commit lands. Here the interval is a minute and the test waits ten seconds;
    its own binds wake it too, and the cycle after them finds nothing to do and waits again."""
    name = unique("wake-")
    ns = new_tenant(db)
    node = gpu_node(db, name, gpus=1)
    notifier = Notifier(None)
    previous, db.on_changes = db.on_changes, notifier.publish

    async def scenario() -> tuple[dict[str, Any], int]:
        await notifier.start()
        config = LoopConfig(scheduler_name=name, interval=60)
        scheduling = SchedulingLoop(db, config, notifier=notifier)
        cycles = 0
        run_once = scheduling.run_once

        def counted(now: float | None = None) -> Any:
            nonlocal cycles
            cycles += 1
            return run_once(now)

        scheduling.run_once = counted  # type: ignore[method-assign]
        task = asyncio.create_task(scheduling.run_forever())
        try:
            while cycles == 0 or scheduling.mirror.version < 0:  # the first cycle has run
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            assert cycles == 1  # nothing was committed: it waits
            document = in_pool(name, manifest("woken", gpus=1))
            await asyncio.to_thread(create, db, ns, document)
            deadline = time.monotonic() + 10
            while not (
                current := await asyncio.to_thread(
                    db.read, lambda s: pods.get(s, namespace=ns.name, name="woken")
                )
            )["spec"].get("nodeName"):
                assert time.monotonic() < deadline, "the create did not wake the loop"
                await asyncio.sleep(0.05)
            while cycles < 3:  # the cycle its own bind woke
                assert time.monotonic() < deadline, "the loop's bind did not wake it"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a loop that spun would have run more cycles by now
            return current, cycles
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await notifier.stop()

    try:
        bound, cycles = asyncio.run(scenario())
    finally:
        db.on_changes = previous
    assert bound["spec"]["nodeName"] == node
    # the first cycle, the one the create woke, the one its bind woke; then it waits again (a
    # loop that spun at its 50 ms floor would have run about ten more; one more is left to a
    # stray commit of the database the suite shares)
    assert 3 <= cycles <= 4, cycles


def test_the_pool_is_derived_between_cycles_until_its_static_part_changes(db: Database) -> None:
    name = unique("pool-")
    ns = new_tenant(db)
    node = gpu_node(db, name, gpus=4)
    scheduler = loop(db, name)
    mirror: Mirror = scheduler.mirror

    def whole(pod_name: str) -> dict[str, Any]:
        return in_pool(name, manifest(pod_name, cpu="8", memory="64Gi", gpus=1))

    def gpus_of(pod_name: str) -> list[str]:
        pod = db.read(lambda s: pods.get(s, namespace=ns.name, name=pod_name))
        assert pod["spec"]["nodeName"] == node
        return sorted(
            db.read(
                lambda s: s.execute(
                    text("SELECT gpu_name FROM gpu_allocations WHERE pod_uid = :u"),
                    {"u": pod["metadata"]["uid"]},
                ).scalars()
            )
        )

    create(db, ns, whole("a"))
    assert scheduler.run_once().bound == 1
    assert (mirror.rebuilds, mirror.derived) == (1, 0)
    create(db, ns, whole("b"))
    assert scheduler.run_once().bound == 1
    assert (mirror.rebuilds, mirror.derived) == (1, 1)  # only free amounts changed
    # The derived snapshot saw the GPU the first cycle took.
    assert set(gpus_of("a")).isdisjoint(gpus_of("b"))

    # What the mirror derives is the pool read whole.
    mirror.apply(db.read(lambda s: read_changes(s, mirror.version)))
    derived = mirror.snapshot(())
    fresh = db.read(lambda s: build_snapshot(s))
    assert mirror.derived == 2
    assert derived.nodes == fresh.nodes
    assert sorted(derived.gpus, key=lambda g: g.id) == sorted(fresh.gpus, key=lambda g: g.id)
    cycle, full = derived.cycle, fresh.cycle
    assert cycle.node_cpu_free.tolist() == full.node_cpu_free.tolist()
    assert cycle.node_whole_free.tolist() == full.node_whole_free.tolist()

    # Caches past their bound: the next cycle starts again from a newly built pool.
    assert mirror.base is not None and mirror.base.cycle.cached_entries > 0
    mirror.max_memo = 0
    mirror.snapshot(())
    assert (mirror.rebuilds, mirror.derived) == (2, 2)
    mirror.max_memo = Mirror.max_memo

    # A cordon is static: the pool is rebuilt, and the pod that would fit waits.
    labels = dict(db.read(lambda s: inventory.get_node_row(s, node))["labels"])
    cordon = {"metadata": {"labels": labels}, "spec": {"unschedulable": True}}
    db.write(lambda s: inventory.update_node(s, node, cordon))
    create(db, ns, whole("c"))
    result = scheduler.run_once()
    assert (result.bound, result.unschedulable) == (0, 1)
    assert mirror.rebuilds == 3
    assert mirror.base is not None
    assert mirror.base.cycle.node_cordoned[mirror.base.cycle.node_index[node]]


def test_what_does_not_fit_is_told_why_and_backs_off(db: Database) -> None:
    name = unique("sched-")
    ns = new_tenant(db)
    gpu_node(db, name, gpus=1, model="T4")
    create(db, ns, in_pool(name, manifest("big", gpus=1, labels={"tessera.io/gpu-model": "T4"})))
    create(db, ns, in_pool(name, manifest("huge", gpus=1, labels={"tessera.io/gpu-model": "T4"})))
    scheduler = loop(db, name)
    result = scheduler.run_once(now=0.0)
    assert (result.bound, result.unschedulable) == (1, 1)
    waiting = [
        p
        for p in (
            db.read(lambda s, n=n: pods.get(s, namespace=ns.name, name=n)) for n in ("big", "huge")
        )
        if "nodeName" not in p["spec"]
    ]
    assert len(waiting) == 1
    condition = next(c for c in waiting[0]["status"]["conditions"] if c["type"] == "PodScheduled")
    assert condition["reason"] == "Unschedulable" and "nodes" in condition["message"]
    events = db.read(
        lambda s: s.execute(
            text("SELECT reason, type FROM events WHERE involved_name = :n AND namespace = :ns"),
            {"n": waiting[0]["metadata"]["name"], "ns": ns.name},
        ).all()
    )
    assert ("FailedScheduling", "Warning") in [tuple(e) for e in events]
    assert scheduler.run_once(now=0.5).pending == 0  # backing off
    assert scheduler.run_once(now=1.5).pending == 1  # tried again after a second

    def seen() -> tuple[str, int]:
        name = waiting[0]["metadata"]["name"]
        pod = db.read(lambda s: pods.get(s, namespace=ns.name, name=name))
        failed = db.read(
            lambda s: s.execute(
                text("SELECT count(*) FROM events WHERE involved_name = :n AND reason = :r"),
                {"n": name, "r": "FailedScheduling"},
            ).scalar_one()
        )
        return pod["metadata"]["resourceVersion"], failed

    before = seen()
    assert scheduler.run_once(now=3.6).pending == 1  # after two seconds, for the same reason:
    assert seen() == before  # nothing written again (the same version, no other event)


def test_a_stale_plan_is_not_forced(db: Database) -> None:
    """Capacity taken between the solve and the bind: the bind fails, nothing is over-allocated,
    and the pod waits for the next cycle."""
    name = unique("sched-")
    ns = new_tenant(db)
    node = gpu_node(db, name, gpus=1)
    create(db, ns, in_pool(name, manifest("late", gpus=1)))
    scheduler = loop(db, name)
    original = scheduler.mirror.snapshot

    def stale_snapshot(workload: Any) -> Any:
        snapshot = original(workload)
        # Someone else takes the GPU after the pool was read (a write: a new version).
        with Database(str(db.url.render_as_string(hide_password=False))).session(
            write=True
        ) as other:
            other.execute(
                text(
                    "UPDATE gpu_devices SET core_free_pct = 50, resource_version = :rv"
                    " WHERE node_name = :n"
                ),
                {"n": node, "rv": next_resource_version(other)},
            )
        return snapshot

    scheduler.mirror.snapshot = stale_snapshot  # type: ignore[method-assign]
    result = scheduler.run_once()
    assert (result.bound, result.stale) == (0, 1)
    assert (
        db.read(lambda s: pods.get(s, namespace=ns.name, name="late"))["spec"].get("nodeName")
        is None
    )
    core = db.read(
        lambda s: s.execute(
            text("SELECT core_free_pct FROM gpu_devices WHERE node_name = :n"), {"n": node}
        ).scalar_one()
    )
    assert core == 50


def test_the_loops_own_binds_count_while_the_horizon_lags(db: Database) -> None:
    """Another write transaction of the database still running holds readers below it
    (`current_resource_version`), so the next cycle's reading of what changed does not bring
    this loop's own binds yet: the mirror took them as it wrote them. The GPU bound is not
    planned twice, and the pod bound is not tried again."""
    if db.is_sqlite:
        pytest.skip("SQLite's readers see every commit: no horizon lags behind them")
    name = unique("lag-")
    ns = new_tenant(db)
    scheduler = loop(db, name)
    gpu_node(db, unique("elsewhere-"), gpus=1)  # the pool sells GPUs, none in this one's pool
    # `late` waits first with no node of its pool, and is tried again after its back-off.
    create(db, ns, in_pool(name, manifest("late", gpus=1)))
    assert scheduler.run_once(now=0.0).unschedulable == 1
    node = gpu_node(db, name, gpus=1)
    create(db, ns, in_pool(name, manifest("first", gpus=1)))
    with db.engine.connect() as held:
        held.execute(text("SELECT pg_current_xact_id()"))  # a writer, still running
        assert scheduler.run_once(now=0.5).bound == 1
        first = db.read(lambda s: pods.get(s, namespace=ns.name, name="first"))
        assert db.read(current_resource_version) < int(first["metadata"]["resourceVersion"])
        during = scheduler.run_once(now=2.0)
        assert (during.pending, during.bound, during.unschedulable, during.stale) == (1, 0, 1, 0)
        held.rollback()

    after = scheduler.run_once(now=10.0)
    assert (after.pending, after.bound, after.unschedulable, after.stale) == (1, 0, 1, 0)
    (gpu,) = scheduler.mirror.node_gpus[node]
    cycle = scheduler.mirror.snapshot(()).cycle
    assert cycle.gpu_free_sm[cycle.gpu_number[gpu]] == 0


def make_group(
    db: Database, ns: NamespaceInfo, name: str, min_member: int, required: str | None
) -> None:
    from app.registry.kinds.podgroups import PodGroupStrategy
    from app.registry.store import Store

    topology = {"required": required} if required else {}
    body = {"metadata": {"name": name}, "spec": {"minMember": min_member, "topology": topology}}
    db.write(lambda s: Store(PodGroupStrategy()).create(s, namespace=ns, obj=body))


def test_a_gang_is_placed_whole_inside_its_required_domain(db: Database) -> None:
    pool = unique("sched-")
    ns = new_tenant(db)
    nodes = [gpu_node(db, pool, gpus=8) for _ in range(3)]
    for i in range(2):  # fill part of two nodes so that only one has room for the whole gang
        create(db, ns, in_pool(pool, manifest(f"filler{i}", gpus=4)))
    scheduler = loop(db, pool)
    assert scheduler.run_once().bound == 2
    make_group(db, ns, "train", 3, "node")
    for i in range(3):
        create(
            db,
            ns,
            in_pool(
                pool,
                manifest(
                    f"w{i}",
                    cpu="8",
                    memory="32Gi",
                    gpus=2,
                    labels={"tessera.io/pod-group": "train"},
                ),
            ),
        )
    result = scheduler.run_once()
    assert (result.bound, result.unschedulable) == (3, 0)
    placed = {
        db.read(lambda s, i=i: pods.get(s, namespace=ns.name, name=f"w{i}"))["spec"]["nodeName"]
        for i in range(3)
    }
    assert len(placed) == 1 and placed <= set(nodes)  # 6 GPUs on one node: the one left empty


def test_a_gang_that_cannot_fit_whole_takes_nothing(db: Database) -> None:
    pool = unique("sched-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=8)
    make_group(db, ns, "big", 3, "node")
    for i in range(3):  # 3 x 4 GPUs: more than the node holds
        create(
            db, ns, in_pool(pool, manifest(f"b{i}", gpus=4, labels={"tessera.io/pod-group": "big"}))
        )
    result = loop(db, pool).run_once()
    assert (result.bound, result.unschedulable) == (0, 3)
    free = db.read(
        lambda s: s.execute(
            text("SELECT count(*) FROM gpu_devices WHERE node_name = :n AND core_free_pct = 100"),
            {"n": node},
        ).scalar_one()
    )
    assert free == 8  # not even the two members that would have fitted
    waiting = db.read(lambda s: pods.get(s, namespace=ns.name, name="b0"))
    assert (
        next(c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")["reason"]
        == "Unschedulable"
    )


def test_a_gang_waits_for_its_members(db: Database) -> None:
    pool = unique("sched-")
    ns = new_tenant(db)
    gpu_node(db, pool, gpus=8)
    make_group(db, ns, "late", 2, None)
    create(
        db, ns, in_pool(pool, manifest("first", gpus=1, labels={"tessera.io/pod-group": "late"}))
    )
    scheduler = loop(db, pool)
    assert scheduler.run_once(now=0.0).bound == 0
    first = db.read(lambda s: pods.get(s, namespace=ns.name, name="first"))
    message = next(c for c in first["status"]["conditions"] if c["type"] == "PodScheduled").get(
        "message", ""
    )
    assert "1 of its 2 pods exist" in message
    create(
        db, ns, in_pool(pool, manifest("second", gpus=1, labels={"tessera.io/pod-group": "late"}))
    )
    assert scheduler.run_once(now=100.0).bound == 2


def test_later_members_of_a_group_join_the_domain_of_its_running_members(db: Database) -> None:
    pool = unique("sched-")
    ns = new_tenant(db)
    gpu_node(db, pool, gpus=8)
    gpu_node(db, pool, gpus=8)  # each node is a zone of its own
    scheduler = loop(db, pool)
    create(db, ns, in_pool(pool, manifest("filler", gpus=6)))
    assert scheduler.run_once(now=0.0).bound == 1
    fuller = db.read(lambda s: pods.get(s, namespace=ns.name, name="filler"))["spec"]["nodeName"]

    def member(name: str, **selector: str) -> None:
        document = in_pool(pool, manifest(name, gpus=2, labels={"tessera.io/pod-group": "train"}))
        document["spec"]["nodeSelector"].update(selector)
        create(db, ns, document)

    def node_of(name: str) -> str | None:
        return db.read(lambda s: pods.get(s, namespace=ns.name, name=name))["spec"].get("nodeName")

    make_group(db, ns, "train", 2, "zone")
    member("w0")
    member("w1")
    assert scheduler.run_once(now=1.0).bound == 2
    home = node_of("w0")
    assert home == node_of("w1") != fuller  # 4 GPUs: only the empty node's zone holds both
    # A member added later would fill the fuller node exactly, but its group is in the other zone.
    member("w2")
    assert scheduler.run_once(now=2.0).bound == 1
    assert node_of("w2") == home
    # A member whose own selector names another zone waits and says why.
    zone = db.read(lambda s: inventory.get_node_row(s, fuller))["zone"]
    member("w3", **{"topology.kubernetes.io/zone": zone})
    assert scheduler.run_once(now=3.0).bound == 0
    w3 = db.read(lambda s: pods.get(s, namespace=ns.name, name="w3"))
    reason = next(c for c in w3["status"]["conditions"] if c["type"] == "PodScheduled")
    assert node_of("w3") is None
    assert "excludes the zone of its running members" in reason["message"]
    assert 'pod group "train"' in reason["message"]


def test_a_gang_whose_members_failed_with_their_node_is_placed_anew_elsewhere(
    db: Database,
) -> None:
    """The members a job controller recreates after the whole gang failed (NodeLost) are not
    held to the lost node: only members still running keep the gang's domain."""
    pool = unique("sched-")
    ns = new_tenant(db)
    first = gpu_node(db, pool, gpus=8)
    scheduler = loop(db, pool)
    make_group(db, ns, "job", 2, "node")

    def member(name: str) -> dict[str, Any]:
        labels = {"tessera.io/pod-group": "job"}
        return create(db, ns, in_pool(pool, manifest(name, gpus=4, labels=labels)))

    def node_of(name: str) -> str | None:
        return db.read(lambda s: pods.get(s, namespace=ns.name, name=name))["spec"].get("nodeName")

    old = [member("w0"), member("w1")]
    assert scheduler.run_once(now=0.0).bound == 2
    assert node_of("w0") == node_of("w1") == first
    second = gpu_node(db, pool, gpus=8)
    lost_at = datetime.now(UTC)
    db.write(lambda s: inventory.set_lost(s, first, since=lost_at))
    for gone in old:
        uid = gone["metadata"]["uid"]
        assert db.write(lambda s, uid=uid: pods.node_lost(s, uid=uid, last_heartbeat=lost_at))
    member("w0-again")
    member("w1-again")
    assert scheduler.run_once(now=100.0).bound == 2
    assert node_of("w0-again") == node_of("w1-again") == second


def test_a_regular_pod_preempts_the_cheapest_best_effort_pod(db: Database) -> None:
    name = unique("pre-")
    ns, other = new_tenant(db), new_tenant(db)
    node = gpu_node(db, name, gpus=2)
    scheduler = SchedulingLoop(
        db,
        LoopConfig(
            scheduler_name=name, preemption=PreemptionConfig(min_runtime_s=0), notice_seconds=5
        ),
    )
    best_effort = {"tessera.io/compute-qos": "best-effort", "tessera.io/gpu-model": "H100"}

    def whole_gpu(pod_name: str, labels: dict[str, str]) -> dict[str, Any]:
        return in_pool(name, manifest(pod_name, cpu="8", memory="64Gi", gpus=1, labels=labels))

    spare = [create(db, other, whole_gpu(f"be{i}", best_effort)) for i in range(2)]
    assert scheduler.run_once().bound == 2
    for victim in spare:
        db.write(lambda s, uid=victim["metadata"]["uid"]: pods.start(s, uid=uid))

    # A BestEffort pod never preempts another.
    create(db, other, whole_gpu("be-late", best_effort))
    assert scheduler.run_once().preempted == 0

    regular = create(db, ns, whole_gpu("paying", {"tessera.io/gpu-model": "H100"}))
    first = scheduler.run_once()
    assert first.preempted == 1

    def read(namespace: str, pod_name: str) -> dict[str, Any]:
        return db.read(lambda s: pods.get(s, namespace=namespace, name=pod_name))

    victims = [read(other.name, p["metadata"]["name"]) for p in spare]
    stopping = [v for v in victims if disrupted(v)]
    assert len(stopping) == 1  # one GPU is needed: one victim, never both
    victim = stopping[0]
    # The notice: it keeps running (and is not being deleted) until its node stops it.
    assert "deletionTimestamp" not in victim["metadata"]
    assert victim["status"]["phase"] == "Running"
    target = next(c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["status"], target["reason"]) == ("True", "PreemptionByScheduler")
    preemptor = read(ns.name, "paying")
    assert preemptor["status"]["nominatedNodeName"] == node
    assert "nodeName" not in preemptor["spec"]
    told = db.read(
        lambda s: s.execute(
            text("SELECT reason, message, type FROM events WHERE involved_uid = :u"),
            {"u": victim["metadata"]["uid"]},
        ).all()
    )
    assert ("Preempted", "Warning") in {(r, t) for r, _, t in told}
    assert not any("paying" in m or ns.name in m for _, m, _ in told)  # another tenant's names

    # While the victim stops, nothing more is evicted, for this pod or for anyone.
    again = scheduler.run_once(now=10**9)
    assert again.preempted == 0
    assert [disrupted(read(other.name, p["metadata"]["name"])) for p in spare].count(True) == 1

    # The notice is over: the victim ends Failed (Preempted) and its GPU goes to the preemptor,
    # nominated no more, though an older BestEffort pod (be-late) waits for it too.
    assert db.write(lambda s: pods.end_preempted(s, uid=victim["metadata"]["uid"]))
    ended = read(other.name, victim["metadata"]["name"])
    assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "Preempted")
    placed = scheduler.run_once(now=2 * 10**9)
    assert placed.preempted == 0
    bound = read(ns.name, "paying")
    assert bound["spec"]["nodeName"] == node and "nominatedNodeName" not in bound["status"]
    assert regular["metadata"]["uid"] == bound["metadata"]["uid"]
    survivor = next(v for v in victims if v is not victim)
    assert read(other.name, survivor["metadata"]["name"])["status"]["phase"] == "Running"
    assert "nodeName" not in read(other.name, "be-late")["spec"]


def disrupted(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "DisruptionTarget" for c in pod["status"]["conditions"])


def test_drift_is_the_total_variation_distance_between_workloads() -> None:
    half = (WorkloadShape(0.5, gpus=1), WorkloadShape(0.5, cpu_milli=1000, memory_mib=1024))
    nearly = (WorkloadShape(0.52, gpus=1), WorkloadShape(0.48, cpu_milli=1000, memory_mib=1024))
    other = (WorkloadShape(1.0, vram_mib=20 * 1024, sm_pct=25),)
    assert drift(half, half) == 0
    assert drift(half, nearly) == pytest.approx(0.02)
    assert drift(half, other) == pytest.approx(1.0)


def test_the_workload_is_read_every_few_seconds_and_taken_when_it_moved(db: Database) -> None:
    """The placement rank's caches are kept per workload: a cycle ranks against the workload
    the loop last took, read again at most every `workload_every` seconds and taken only when
    it drifted more than `workload_drift` from it."""
    name = unique("wl-")
    ns = new_tenant(db)
    gpu_node(db, name, gpus=8)
    # the database is shared with other tests: a window of this test's last pods only
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=name, workload_window=4))
    create(db, ns, in_pool(name, manifest("a", cpu="8", memory="64Gi", gpus=1)))
    scheduler.run_once(now=1000.0)
    first = scheduler._workload
    assert first is not None
    # a burst of slices: a different mix, but not read again within `workload_every`
    for i in range(4):
        doc = manifest(f"s{i}", cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)
        create(db, ns, in_pool(name, doc))
    scheduler.run_once(now=1001.0)
    assert scheduler._workload is first

    def one_more(pod_name: str) -> None:  # the workload is read only when a pod waits
        doc = manifest(pod_name, cpu="1", memory="2Gi", gpu_memory="20Gi", gpu_core=25)
        create(db, ns, in_pool(name, doc))

    one_more("s4")
    scheduler.run_once(now=1003.0)  # read again: it moved, so it is taken
    taken = scheduler._workload
    assert taken is not first
    assert [(w.weight, w.sm_pct) for w in taken] == [(1.0, 25)]
    # read again, the same mix: kept as it was (and the caches with it)
    one_more("s5")
    scheduler.run_once(now=1006.0)
    assert scheduler._workload is taken


def test_a_cycle_binds_in_chunks_each_worked_out_before_its_write(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle's placements are bound in writes of about BIND_CHUNK pods (a gang whole in one),
    so creates wait for no long write; each chunk is worked out before its write from the
    mirror's rows, which the chunks before it brought up to date (no chunk is worked out again
    under the lock), and the node's free capacity is its capacity less its pods."""
    import scheduler.loop as module

    monkeypatch.setattr(module, "BIND_CHUNK", 2)
    planned: list[int] = []
    real = pods.plan_binds

    def counted(groups: Any, *args: Any, **kwargs: Any) -> Any:
        planned.append(sum(len(g) for g in groups))
        return real(groups, *args, **kwargs)

    monkeypatch.setattr(pods, "plan_binds", counted)
    pool = unique("chunk-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=8)
    make_group(db, ns, "trio", 3, "node")
    for i in range(3):
        labels = {"tessera.io/pod-group": "trio"}
        create(
            db, ns, in_pool(pool, manifest(f"g{i}", cpu="4", memory="16Gi", gpus=1, labels=labels))
        )
    for i in range(4):
        create(
            db,
            ns,
            in_pool(pool, manifest(f"s{i}", cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25)),
        )
    result = loop(db, pool).run_once()
    assert (result.bound, result.stale) == (7, 0)
    assert sorted(planned) == [2, 2, 3]  # the gang whole; each chunk planned once, before
    free = db.read(lambda s: inventory.get_node_row(s, node))
    assert free["cpu_free_milli"] == 96000 - 3 * 4000 - 4 * 2000
    assert free["memory_free_mib"] == 1024 * 1024 - (3 * 16 + 4 * 8) * 1024


def test_the_mirror_reads_everything_again_every_few_minutes(db: Database) -> None:
    """A change made outside Tessera without a new resourceVersion (an operator's SQL; every
    write of Tessera's takes one) is seen at the latest at the next full read, `resync_every`
    seconds after the last."""
    pool = unique("resync-")
    ns = new_tenant(db)
    node = gpu_node(db, pool, gpus=2)
    scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=pool, resync_every=60.0))
    create(db, ns, in_pool(pool, manifest("first", cpu="8", memory="64Gi", gpus=1)))
    assert scheduler.run_once(now=1000.0).bound == 1
    scheduler.run_once(now=1001.0)  # reads what the bind wrote
    cordon = text("UPDATE nodes SET unschedulable = :t WHERE name = :n")
    db.write(lambda s: s.execute(cordon, {"t": True, "n": node}))
    assert scheduler.mirror.full_reads == 1
    # a minute after the first read, everything is read again: the node is cordoned
    create(db, ns, in_pool(pool, manifest("second", cpu="8", memory="64Gi", gpus=1)))
    result = scheduler.run_once(now=1061.0)
    assert scheduler.mirror.full_reads == 2
    assert (result.bound, result.unschedulable) == (0, 1)
