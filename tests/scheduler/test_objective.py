"""The placement rank (``scheduler/objective.py``) on hand-made pools, and ``with_free``."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.jobs import build_jobs
from scheduler.objective import fgd_class, ranks
from scheduler.plan import Plan
from scheduler.requests import GpuSlice, PodRequest
from scheduler.snapshot import Gpu, Snapshot, WorkloadShape
from scheduler.solver import SolverConfig, solve
from scheduler.synthetic import PoolShape, h200_pool, random_pods
from scheduler.verify import verify
from tests.scheduler.factories import make_node


def _gpus(node: str, free: list[int], model: str = "H100") -> list[Gpu]:
    """GPUs of 1000 MiB (one MiB = one thousandth), ``free[i]`` thousandths free in both."""
    return [
        Gpu(
            id=f"{node}/{i}",
            node=node,
            index=i,
            model=model,
            vram_mib=1000,
            sm_count=100,
            free_vram_mib=f,
            free_sm_pct=f // 10,
        )
        for i, f in enumerate(free)
    ]


def _where(plan: Plan, key: str) -> str:
    placement = plan.placement(key)
    assert placement is not None
    [pod] = placement.pods
    return pod.gpus[0].gpu_id if pod.gpus else pod.node


def _node(plan: Plan, key: str) -> str:
    placement = plan.placement(key)
    assert placement is not None
    return placement.pods[0].node


SLICE_MIX = (
    WorkloadShape(weight=0.5, vram_mib=470, sm_pct=47),
    WorkloadShape(weight=0.5, vram_mib=320, sm_pct=32),
)


@pytest.mark.parametrize("seed", range(4))
def test_a_slice_goes_where_it_completes_an_optimal_pattern(seed: int) -> None:
    """LP prices of the mix: a 0.47 slice is worth 1/2 GPU (0.47 + 0.47), a 0.32 one 1/3
    (3 x 0.32). A 0.47 fills the 0.53 gap exactly; in the 0.65 gap it would waste the room of
    two 0.32s. And the other way round for a 0.32."""
    snapshot = Snapshot(
        (make_node("n0"),), tuple(_gpus("n0", [650, 530, 0, 0])), workload=SLICE_MIX
    )
    config = SolverConfig(seed=seed)
    big = PodRequest("big", gpu_slice=GpuSlice(470, 47))
    small = PodRequest("small", gpu_slice=GpuSlice(320, 32))
    assert _where(solve(snapshot, [big], config=config), "big") == "n0/1"
    assert _where(solve(snapshot, [small], config=config), "small") == "n0/0"


def _two_model_pool() -> Snapshot:
    nodes = [make_node(f"t{i}") for i in range(6)] + [make_node("a0")]
    gpus = [g for i in range(6) for g in _gpus(f"t{i}", [1000] * 8, model="T4")]
    gpus += _gpus("a0", [1000] * 8, model="A100")
    return Snapshot(tuple(nodes), tuple(gpus))


@pytest.mark.parametrize("seed", range(8))
def test_a_flexible_request_leaves_a_scarce_constrained_model_alone(seed: int) -> None:
    """Half of the expected GPU demand can only run on the one A100 node: while its idle
    capacity is below three times that load, flexible requests go elsewhere."""
    pool = _two_model_pool()
    constrained = WorkloadShape(weight=0.5, gpus=1, gpu_models=frozenset({"A100"}))
    workload = (WorkloadShape(weight=0.5, gpus=1), constrained)
    snapshot = Snapshot(pool.nodes, pool.gpus, workload=workload)
    config = SolverConfig(seed=seed)
    plan = solve(snapshot, [PodRequest("flex", gpus=1)], config=config)
    assert _node(plan, "flex").startswith("t")
    tied = solve(snapshot, [PodRequest("a100", gpus=1, gpu_models={"A100"})], config=config)
    assert _node(tied, "a100") == "a0"


def test_without_model_constraints_the_node_order_decides() -> None:
    """The same pool with an unconstrained workload: some seed puts the pod on the A100 node,
    so the reservation above is what keeps it free."""
    pool = _two_model_pool()
    snapshot = Snapshot(pool.nodes, pool.gpus, workload=(WorkloadShape(weight=1.0, gpus=1),))
    nodes = {
        _node(solve(snapshot, [PodRequest("p", gpus=1)], config=SolverConfig(seed=s)), "p")
        for s in range(40)
    }
    assert "a0" in nodes and len(nodes) > 2


def test_a_cpu_only_pod_prefers_a_node_whose_gpus_are_in_use() -> None:
    nodes = (make_node("idle"), make_node("busy"))
    gpus = _gpus("idle", [1000] * 4) + _gpus("busy", [0, 0, 0, 1000])
    snapshot = Snapshot(nodes, tuple(gpus), workload=(WorkloadShape(weight=1.0, gpus=1),))
    for seed in range(6):
        plan = solve(snapshot, [PodRequest("c", cpu_milli=1000)], config=SolverConfig(seed=seed))
        assert _node(plan, "c") == "busy"


def test_whole_gpu_units_go_first_largest_first_then_arrival_order() -> None:
    batch = [
        PodRequest("s", gpu_slice=GpuSlice(100, 10)),
        PodRequest("c", cpu_milli=100),
        PodRequest("one", gpus=1),
        PodRequest("eight", gpus=8),
    ]
    jobs = build_jobs(batch, reference_vram_mib=1000)
    assert [j.key for j in jobs] == ["eight", "one", "s", "c"]


def test_fgd_class_and_ranks() -> None:
    assert fgd_class(np.array([0.0, 250.0, -250.0])).tolist() == [50, 57, 44]
    assert ranks(np.array([40, 7, 40, 1 << 60])).tolist() == [1, 0, 1, 2]


def _free_arrays(snapshot: Snapshot) -> tuple[np.ndarray, ...]:
    c = snapshot.cycle
    return (c.node_cpu_free, c.node_mem_free, c.gpu_free_vram, c.gpu_free_sm)


def test_with_free_equals_a_snapshot_built_from_scratch() -> None:
    """Solving on a chain of with_free snapshots (sharing the score caches) gives exactly the
    plans of fresh snapshots with the same free amounts."""
    pool = h200_pool(
        PoolShape(zones=1, racks_per_zone=2, nodes_per_rack=6),
        fill=0.4,
        unhealthy=0.05,
        cordoned=0.1,
        seed=3,
    )
    derived = pool.with_free(*_free_arrays(pool))
    fresh = Snapshot(derived.nodes, derived.gpus, pool.costs, pool.workload)  # no NUMA either
    config = SolverConfig(seed=5)
    rng = np.random.default_rng(11)
    for step in range(4):
        batch = random_pods(rng, 12, prefix=f"step{step}-")
        a = solve(fresh, batch, config=config)
        b = solve(derived, batch, config=config)
        assert verify(b, derived) == []
        assert [(p.key, p.pods) for p in a.placements] == [(p.key, p.pods) for p in b.placements]
        # apply the plan: the next snapshot has less free
        cpu, mem, vram, sm = (x.copy() for x in _free_arrays(fresh))
        cycle = fresh.cycle
        for placement in a.placements:
            for pod in placement.pods:
                cpu[cycle.node_index[pod.node]] -= pod.cpu_milli
                mem[cycle.node_index[pod.node]] -= pod.memory_mib
                for share in pod.gpus:
                    vram[cycle.gpu_number[share.gpu_id]] -= share.vram_mib
                    sm[cycle.gpu_number[share.gpu_id]] -= share.sm_pct
        derived = derived.with_free(cpu, mem, vram, sm)
        fresh = Snapshot(derived.nodes, derived.gpus, fresh.costs, fresh.workload)
        assert [n.numa_nodes for n in derived.nodes] == [()] * len(derived.nodes)


def test_with_free_checks_the_amounts() -> None:
    snapshot = Snapshot((make_node("n0"),), tuple(_gpus("n0", [1000, 500])))
    cpu, mem, vram, sm = _free_arrays(snapshot)
    with pytest.raises(ValueError):
        snapshot.with_free(cpu, mem, vram + 1, sm)
    with pytest.raises(ValueError):
        snapshot.with_free(cpu[:0], mem, vram, sm)
    derived = snapshot.with_free(cpu, mem, np.array([1000, 0]), np.array([100, 0]))
    assert derived.cycle.node_whole_free.tolist() == [1]
    assert [g.free_vram_mib for g in derived.gpus] == [1000, 0]


@pytest.mark.parametrize("seed", range(3))
def test_a_class_placed_incrementally_equals_ranking_every_pod_afresh(seed: int) -> None:
    """The greedy stage keeps a class's keys and re-ranks only the node a placement changed;
    ranking every target again before every pod gives the same placements."""
    from scheduler import solver as solver_module
    from scheduler.greedy import ScoreCache, _assignment, _fitting, place_class
    from scheduler.ledger import Ledger

    pool = h200_pool(PoolShape(zones=1, racks_per_zone=2, nodes_per_rack=4), fill=0.5, seed=seed)
    rng = np.random.default_rng(seed)
    batch = [p for p in random_pods(rng, 60) if p.priority == 0]
    jobs = build_jobs(batch, reference_vram_mib=int(pool.cycle.gpu_vram.max()))
    ctx = solver_module._context(pool, jobs, SolverConfig(seed=seed))
    fast, slow = Ledger(pool.cycle), Ledger(pool.cycle)
    for job in jobs:
        shape = job.groups[0].shape
        got = place_class(fast, ctx, job, ScoreCache(fast, shape, ctx.ranking))
        want = []
        cache = ScoreCache(slow, shape, ctx.ranking)
        for pod in job.groups[0].pods:
            targets = _fitting(slow, ctx.filters[shape])
            if len(targets) == 0:
                break
            a = _assignment(slow, shape, pod, cache.best(targets))
            slow.assign(a)
            want.append(a)
        assert [(a.node, a.gpus) for a in got] == [(a.node, a.gpus) for a in want]
