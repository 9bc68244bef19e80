"""Preemption plans: the cheapest BestEffort victims, checked against brute force on small pools."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.plan import RequestStatus
from scheduler.preempt import (
    NoPreemption,
    PreemptionConfig,
    PreemptionPlan,
    RunningPod,
    plan_preemption,
)
from scheduler.requests import GangRequest, GpuSlice, PodRequest, Qos, Request
from scheduler.snapshot import Gpu, Node, Snapshot, TopologyLevel
from scheduler.solver import SolverConfig, solve
from scheduler.verify import verify
from tests.scheduler.factories import VRAM, make_gpus, make_node

NOW = 10_000
CONFIG = PreemptionConfig(min_runtime_s=60)


def _pool(nodes: int, gpus: int = 4, *, racks: int = 1, cpu: int = 64_000) -> Snapshot:
    made: list[Node] = []
    devices: list[Gpu] = []
    for i in range(nodes):
        rack = f"k{i % racks}"
        made.append(replace(make_node(f"n{i}", rack=rack, cpu=cpu), numa_nodes=()))
        devices += make_gpus(f"n{i}", gpus)
    return Snapshot(tuple(made), tuple(devices))


def _occupy(
    snapshot: Snapshot,
    requests: Sequence[Request],
    *,
    qos: Qos = Qos.BEST_EFFORT,
    started: dict[str, int] | None = None,
    priority: int = 0,
) -> tuple[Snapshot, list[RunningPod]]:
    """Place ``requests`` with the real solver and return the pool with them running."""
    plan = solve(snapshot, requests, config=SolverConfig(use_cpsat=False))
    assert not plan.unschedulable, plan.unschedulable
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    running: list[RunningPod] = []
    for placement in plan.placements:
        gang = placement.key if isinstance(placement.request, GangRequest) else None
        for pod in placement.pods:
            cpu[pod.node] += pod.cpu_milli
            mem[pod.node] += pod.memory_mib
            for share in pod.gpus:
                vram[share.gpu_id] += share.vram_mib
                sm[share.gpu_id] += share.sm_pct
            running.append(
                RunningPod(
                    key=pod.pod_key,
                    node=pod.node,
                    cpu_milli=pod.cpu_milli,
                    memory_mib=pod.memory_mib,
                    gpus=pod.gpus,
                    priority=priority,
                    started_s=(started or {}).get(pod.pod_key, 0),
                    gang=gang,
                    qos=qos,
                )
            )
    used = Snapshot(
        tuple(
            replace(
                n,
                cpu_milli_free=n.cpu_milli_free - cpu[n.name],
                memory_mib_free=n.memory_mib_free - mem[n.name],
            )
            for n in snapshot.nodes
        ),
        tuple(
            replace(
                g,
                free_vram_mib=g.free_vram_mib - vram[g.id],
                free_sm_pct=g.free_sm_pct - sm[g.id],
            )
            for g in snapshot.gpus
        ),
    )
    return used, running


def _be(key: str, **kw: object) -> PodRequest:
    return PodRequest(key, cpu_milli=1000, memory_mib=2048, qos=Qos.BEST_EFFORT, **kw)  # type: ignore[arg-type]


def _slice(vram_gib: int, sm: int) -> GpuSlice:
    return GpuSlice(vram_gib * 1024, sm)


def _released(snapshot: Snapshot, running: Sequence[RunningPod], victims: set[str]) -> Snapshot:
    from scheduler.preempt import _released as released
    from scheduler.preempt import _units

    units, _ = _units([p for p in running if p.key in victims], now_s=NOW, min_runtime_s=0)
    return released(snapshot, units)


def _check_plan(
    snapshot: Snapshot, running: Sequence[RunningPod], plan: PreemptionPlan
) -> Snapshot:
    """Invariants of every plan: BestEffort victims only, gangs whole, a valid placement."""
    by_key = {p.key: p for p in running}
    victims = set(plan.victims)
    for key in victims:
        assert by_key[key].qos is Qos.BEST_EFFORT
        gang = by_key[key].gang
        if gang is not None:
            assert {p.key for p in running if p.gang == gang} <= victims
    freed = _released(snapshot, running, victims)
    from scheduler.plan import Plan, SolveStats

    assert verify(Plan((plan.placement,), (), SolveStats(method="greedy")), freed) == []
    return freed


def test_a_whole_gpu_evicts_the_fewest_slices() -> None:
    """One node, every GPU carrying slices: the preemptor's whole GPU frees the GPU with the fewest."""
    pool = _pool(1, 4)
    slices = [_be(f"s{i}", gpu_slice=_slice(20, 25)) for i in range(13)]  # 4+4+4+1
    used, running = _occupy(pool, slices)
    assert all(g.free_sm_pct < 100 for g in used.gpus)
    preemptor = PodRequest("web", cpu_milli=2000, memory_mib=4096, gpus=1)
    plan = plan_preemption(used, preemptor, running, now_s=NOW, config=CONFIG)
    assert isinstance(plan, PreemptionPlan), plan
    assert len(plan.victims) == 1
    _check_plan(used, running, plan)
    assert plan.nominated_nodes == ("n0",)


def test_regular_pods_are_never_victims() -> None:
    pool = _pool(1, 2)
    used, regular = _occupy(
        pool, [PodRequest("r0", cpu_milli=1000, memory_mib=1024, gpus=2)], qos=Qos.BURSTABLE
    )
    preemptor = PodRequest("web", cpu_milli=1000, memory_mib=1024, gpus=1)
    result = plan_preemption(used, preemptor, regular, now_s=NOW, config=CONFIG)
    assert isinstance(result, NoPreemption)
    assert "no BestEffort pod" in result.reason


def test_a_best_effort_pod_never_preempts() -> None:
    pool = _pool(1, 1)
    used, running = _occupy(pool, [_be("b0", gpus=1)])
    result = plan_preemption(used, _be("b1", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(result, NoPreemption)
    assert "BestEffort pod never preempts" in result.reason


def test_nothing_is_evicted_for_a_pod_that_fits() -> None:
    pool = _pool(1, 2)
    used, running = _occupy(pool, [_be("b0", gpus=1)])
    result = plan_preemption(used, PodRequest("web", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(result, NoPreemption)
    assert "fits without evicting" in result.reason


def test_no_wasted_eviction_when_it_would_still_not_fit() -> None:
    pool = _pool(2, 2)
    used, running = _occupy(pool, [_be(f"b{i}", gpus=1) for i in range(4)])
    too_big = PodRequest("big", gpus=3)  # no node has 3 GPUs
    result = plan_preemption(used, too_big, running, now_s=NOW, config=CONFIG)
    assert isinstance(result, NoPreemption)
    assert "would not fit even with every evictable" in result.reason


def test_no_eviction_when_pending_pods_ahead_would_take_the_capacity() -> None:
    pool = _pool(1, 1)
    used, running = _occupy(pool, [_be("b0", gpus=1)])
    ahead = PodRequest("ahead", gpus=1, priority=10)
    result = plan_preemption(
        used, PodRequest("web", gpus=1), running, now_s=NOW, competing=[ahead], config=CONFIG
    )
    assert isinstance(result, NoPreemption)
    assert "pending pods ahead" in result.reason


def test_just_started_pods_are_protected() -> None:
    pool = _pool(1, 1)
    used, running = _occupy(pool, [_be("b0", gpus=1)], started={"b0": NOW - 10})
    result = plan_preemption(used, PodRequest("web", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(result, NoPreemption)
    assert "minimum runtime" in result.reason
    plan = plan_preemption(
        used, PodRequest("web", gpus=1), running, now_s=NOW, config=replace(CONFIG, min_runtime_s=5)
    )
    assert isinstance(plan, PreemptionPlan) and plan.victims == ("b0",)


def test_a_best_effort_gang_is_evicted_whole() -> None:
    pool = _pool(2, 2)
    gang = GangRequest("beg", tuple(_be(f"beg-{i}", gpus=1) for i in range(4)), required_level=None)
    used, running = _occupy(pool, [gang])
    plan = plan_preemption(used, PodRequest("web", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(plan, PreemptionPlan)
    assert plan.victims == tuple(f"beg-{i}" for i in range(4))
    _check_plan(used, running, plan)


def test_prefers_less_lost_work_then_newer() -> None:
    pool = _pool(2, 1)
    used, running = _occupy(
        pool, [_be("old", gpus=1), _be("new", gpus=1)], started={"old": 0, "new": NOW - 100}
    )
    plan = plan_preemption(used, PodRequest("web", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(plan, PreemptionPlan) and plan.victims == ("new",)


def test_a_rack_gang_preempts_inside_one_packed_rack() -> None:
    """Two racks, both full of BestEffort work; the gang needs 4 GPUs inside one rack."""
    pool = _pool(4, 2, racks=2)  # racks k0: n0, n2; k1: n1, n3
    bes = [_be(f"b{i}", gpus=1) for i in range(8)]
    started = {f"b{i}": 100 * i for i in range(8)}
    used, running = _occupy(pool, bes, started=started)
    gang = GangRequest(
        "train",
        tuple(PodRequest(f"train-{i}", cpu_milli=1000, memory_mib=1024, gpus=1) for i in range(4)),
        required_level=TopologyLevel.RACK,
    )
    plan = plan_preemption(used, gang, running, now_s=NOW, config=CONFIG)
    assert isinstance(plan, PreemptionPlan), plan
    assert len(plan.victims) == 4
    nodes = {p.node for p in running if p.key in plan.victims}
    racks = {next(n.rack for n in used.nodes if n.name == node) for node in nodes}
    assert len(racks) == 1
    assert {p.node for p in plan.placement.pods} == nodes
    _check_plan(used, running, plan)


# Brute force: every subset of victim units, on pools small enough to enumerate.


def _brute_force(
    snapshot: Snapshot, preemptor: Request, running: Sequence[RunningPod]
) -> tuple[int, int] | None:
    """(victims, lost work) of the cheapest eviction, over every subset of units."""
    from scheduler.preempt import _released as released
    from scheduler.preempt import _total, _units

    units, _ = _units(running, now_s=NOW, min_runtime_s=CONFIG.min_runtime_s)
    best: tuple[int, int] | None = None
    for size in range(1, len(units) + 1):
        for combo in itertools.combinations(units, size):
            plan = solve(released(snapshot, combo), [preemptor], config=CONFIG.solver)
            if plan.status(preemptor.key) is RequestStatus.PLACED:
                cost = _total(combo)
                key = (cost.victims, cost.lost_work)
                best = key if best is None or key < best else best
    return best


@st.composite
def _case(draw: st.DrawFn) -> tuple[Snapshot, list[RunningPod], Request]:
    nodes = draw(st.integers(1, 3))
    gpus = draw(st.integers(1, 3))
    pool = _pool(nodes, gpus, racks=draw(st.integers(1, 2)), cpu=16_000)
    count = draw(st.integers(1, 7))
    bes: list[Request] = []
    for i in range(count):
        kind = draw(st.sampled_from(["whole", "slice", "cpu"]))
        if kind == "whole":
            bes.append(_be(f"b{i}", gpus=1))
        elif kind == "slice":
            bes.append(_be(f"b{i}", gpu_slice=_slice(draw(st.sampled_from([10, 20, 40])), 25)))
        else:
            bes.append(
                PodRequest(
                    f"b{i}",
                    cpu_milli=draw(st.sampled_from([2000, 4000, 8000])),
                    memory_mib=2048,
                    qos=Qos.BEST_EFFORT,
                )
            )
    plan = solve(pool, bes, config=SolverConfig(use_cpsat=False))
    placed = [r for r in bes if r.key in plan.placed_keys]
    if not placed:
        placed = []
    started = {r.key: draw(st.integers(0, NOW - 100)) for r in placed}
    used, running = _occupy(pool, placed, started=started) if placed else (pool, [])
    kind = draw(st.sampled_from(["whole", "two", "slice", "cpu", "gang"]))
    if kind == "whole":
        preemptor: Request = PodRequest("p", cpu_milli=1000, memory_mib=1024, gpus=1)
    elif kind == "two":
        preemptor = PodRequest("p", cpu_milli=1000, memory_mib=1024, gpus=2)
    elif kind == "slice":
        preemptor = PodRequest("p", cpu_milli=1000, memory_mib=1024, gpu_slice=_slice(40, 50))
    elif kind == "cpu":
        preemptor = PodRequest("p", cpu_milli=12_000, memory_mib=4096)
    else:
        preemptor = GangRequest(
            "p",
            tuple(PodRequest(f"p-{i}", cpu_milli=1000, memory_mib=1024, gpus=1) for i in range(2)),
            required_level=draw(st.sampled_from([TopologyLevel.NODE, TopologyLevel.RACK, None])),
        )
    return used, running, preemptor


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_victim_sets_are_minimal_against_brute_force(
    case: tuple[Snapshot, list[RunningPod], Request],
) -> None:
    snapshot, running, preemptor = case
    fits_now = solve(snapshot, [preemptor], config=CONFIG.solver).status(preemptor.key)
    result = plan_preemption(snapshot, preemptor, running, now_s=NOW, config=CONFIG)
    if fits_now is RequestStatus.PLACED:
        assert isinstance(result, NoPreemption)
        return
    best = _brute_force(snapshot, preemptor, running)
    if best is None:
        assert isinstance(result, NoPreemption), result
        return
    assert isinstance(result, PreemptionPlan), (result, best)
    assert (result.cost.victims, result.cost.lost_work) == best
    _check_plan(snapshot, running, result)


def test_gpu_ids_are_what_victims_held() -> None:
    """The freed GPU is pristine again only when every slice on it is a victim."""
    pool = _pool(1, 1)
    used, running = _occupy(
        pool, [_be("a", gpu_slice=_slice(20, 25)), _be("b", gpu_slice=_slice(20, 25))]
    )
    plan = plan_preemption(used, PodRequest("web", gpus=1), running, now_s=NOW, config=CONFIG)
    assert isinstance(plan, PreemptionPlan) and plan.victims == ("a", "b")
    freed = _check_plan(used, running, plan)
    assert freed.gpus[0].free_vram_mib == VRAM and freed.gpus[0].pristine
