"""Example-based tests of the solver: reasons, statuses, fallbacks, affinity, priorities."""

from __future__ import annotations

from dataclasses import replace

import pytest

import scheduler.solver as solver_module
from scheduler.cpsat import CpsatResult
from scheduler.filter import filter_shape
from scheduler.jobs import Shape
from scheduler.plan import GpuShare, RequestStatus
from scheduler.requests import GangRequest, GpuSlice, PodRequest, Qos
from scheduler.snapshot import Gpu, Snapshot, TopologyLevel, WorkloadShape
from scheduler.solver import SolverConfig, solve
from scheduler.verify import verify
from tests.scheduler.factories import VRAM, make_gpus, make_node


def _pool(nodes: int, gpus: int = 8, **gpu_kwargs: object) -> Snapshot:
    ns = [make_node(f"n{i}", rack=f"k{i // 2}") for i in range(nodes)]
    gs = [g for n in ns for g in make_gpus(n.name, gpus, **gpu_kwargs)]  # type: ignore[arg-type]
    return Snapshot(tuple(ns), tuple(gs))


def test_reason_counts_nodes_per_failed_check() -> None:
    nodes, gpus = [], []
    for i in range(512):
        cordoned = i >= 500
        nodes.append(make_node(f"n{i}", cordoned=cordoned))
        if i < 300:
            gpus += make_gpus(f"n{i}", 2, free_vram=8 * 1024, free_sm=90)
        else:
            gpus += make_gpus(f"n{i}", 2, model="A100")
    snapshot = Snapshot(tuple(nodes), tuple(gpus))
    pod = PodRequest(
        "infer",
        cpu_milli=1000,
        memory_mib=1024,
        gpu_slice=GpuSlice(40 * 1024, 25),
        gpu_models=frozenset({"H100"}),
    )
    plan = solve(snapshot, [pod])
    [item] = plan.unschedulable
    assert item.status is RequestStatus.UNSCHEDULABLE
    assert item.reason == (
        "0/512 nodes are available: 300 insufficient tessera.io/gpu-memory, "
        "200 wrong gpu-model, 12 cordoned."
    )
    assert dict(item.node_reasons)["cordoned"] == 12

    cycle = snapshot.cycle
    filt = filter_shape(cycle, Shape.of(pod))
    assert filt.reason_of(cycle.node_index["n0"]) == "insufficient tessera.io/gpu-memory"
    assert filt.reason_of(cycle.node_index["n300"]) == "wrong gpu-model"
    assert filt.reason_of(cycle.node_index["n511"]) == "cordoned"


def test_gang_that_no_rack_can_hold_says_how_close_it_came() -> None:
    snapshot = _pool(4, gpus=4)  # two racks of two nodes, 8 GPUs per rack
    members = tuple(PodRequest(f"w{i}", cpu_milli=1000, gpus=4) for i in range(3))
    gang = GangRequest("train", members, required_level=TopologyLevel.RACK)
    [item] = solve(snapshot, [gang]).unschedulable
    assert item.reason == (
        "gang needs 3 pods of 1000m cpu, 0Mi memory, 4 nvidia.com/gpu within one rack; "
        "the roomiest rack holds only 2"
    )


def test_higher_priority_wins_and_the_loser_is_told_why() -> None:
    snapshot = _pool(1, gpus=2)
    low = PodRequest("low", cpu_milli=1000, gpus=2, priority=0)
    high = PodRequest("high", cpu_milli=1000, gpus=2, priority=5)
    plan = solve(snapshot, [low, high])
    assert plan.placed_keys == {"high"}
    [item] = plan.unschedulable
    assert item.key == "low" and "other requests in this batch" in item.reason


def test_a_failing_stage_gives_error_status_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(solver_module, "greedy", broken)
    plan = solve(_pool(1), [PodRequest("p", gpus=1)])
    [item] = plan.unschedulable
    assert item.status is RequestStatus.ERROR
    assert "boom" in item.reason


def test_cpsat_without_solution_falls_back_to_greedy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solver_module, "solve_model", lambda *a, **k: CpsatResult("MODEL_INVALID"))
    # Two pods for one GPU: the greedy plan leaves one out, so CP-SAT has a chance to do better.
    plan = solve(_pool(1, gpus=1), [PodRequest("p", gpus=1), PodRequest("q", gpus=1)])
    assert plan.placed_keys == {"p"}
    assert plan.stats.method == "greedy"
    assert plan.stats.fallback_reason == "CP-SAT status MODEL_INVALID"


def test_an_invalid_cpsat_plan_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """CP-SAT 'answers' two 2-GPU pods on a node with 2 GPUs; verify rejects it. (A third pod
    that does not fit makes the solver try CP-SAT at all.)"""
    snapshot = _pool(2, gpus=2)
    pods = [PodRequest("a", gpus=2), PodRequest("b", gpus=2), PodRequest("c", gpus=2)]

    def overbook(pm: object, settings: object) -> CpsatResult:
        counts = {(0, 0): {0: 2}}
        return CpsatResult("OPTIMAL", counts)

    monkeypatch.setattr(solver_module, "solve_model", overbook)
    monkeypatch.setattr(solver_module, "materialize", _naive_materialize)
    plan = solve(snapshot, pods)
    assert plan.stats.method == "greedy"
    assert plan.stats.fallback_reason is not None
    assert "failed verification" in plan.stats.fallback_reason
    assert verify(plan, snapshot) == []
    assert plan.placed_keys == {"a", "b"}


def _naive_materialize(ctx, jobs, counts):  # type: ignore[no-untyped-def]
    """Turns counts into pods without checking capacity (to feed verify a bad plan)."""
    from scheduler.ledger import PodAssignment

    out = {}
    for job in jobs:
        for (j, g), per_target in counts.items():
            if j == job.index:
                pods = iter(job.groups[g].pods)
                out[j] = [
                    PodAssignment(next(pods), t, (0, 1), (VRAM, VRAM), (100, 100), whole=True)
                    for t, n in per_target.items()
                    for _ in range(n)
                ]
    return out


def test_verify_reports_a_double_booked_gpu() -> None:
    snapshot = _pool(1, gpus=2)
    plan = solve(snapshot, [PodRequest("a", gpus=1), PodRequest("b", gpus=1)])
    first, second = plan.placements
    stolen = replace(second.pods[0], gpus=first.pods[0].gpus)
    bad = replace(plan, placements=(first, replace(second, pods=(stolen,))))
    assert any("given whole and shared" in p for p in verify(bad, snapshot))


def test_multi_gpu_pod_stays_in_one_nvlink_domain_with_cpu_on_its_numa() -> None:
    node = make_node("n0")
    gpus = make_gpus("n0", 8, domains=2)  # GPUs 0-3 domain 0 (NUMA 0), 4-7 domain 1 (NUMA 1)
    gpus[1] = replace(gpus[1], free_vram_mib=0, free_sm_pct=0)  # domain 0 has 3 free
    snapshot = Snapshot((node,), tuple(gpus))
    pod = PodRequest("p", cpu_milli=4000, gpus=4, qos=Qos.GUARANTEED)
    [placement] = solve(snapshot, [pod]).placements
    [where] = placement.pods
    assert [s.index for s in where.gpus] == [4, 5, 6, 7]
    assert where.numa_node == 1
    assert placement.topology_level is TopologyLevel.NVLINK


def test_slices_share_a_partly_used_gpu_and_keep_whole_gpus_whole() -> None:
    node = make_node("n0")
    gpus = make_gpus("n0", 4)
    gpus[2] = replace(gpus[2], free_vram_mib=VRAM // 2, free_sm_pct=50)
    # The recent workload also asks for whole GPUs: breaking a pristine GPU fragments the pool.
    workload = (
        WorkloadShape(weight=0.5, gpus=1),
        WorkloadShape(weight=0.5, vram_mib=10 * 1024, sm_pct=20),
    )
    snapshot = Snapshot((node,), tuple(gpus), workload=workload)
    pods = [PodRequest(f"s{i}", gpu_slice=GpuSlice(10 * 1024, 20)) for i in range(2)]
    plan = solve(snapshot, pods)
    used = {share.gpu_id for p in plan.placements for w in p.pods for share in w.gpus}
    assert used == {"n0/2"}
    assert all(
        isinstance(s, GpuShare) and not s.whole
        for p in plan.placements
        for w in p.pods
        for s in w.gpus
    )


def test_gang_prefers_one_node_over_two() -> None:
    snapshot = _pool(4, gpus=8)
    members = tuple(PodRequest(f"w{i}", cpu_milli=1000, gpus=2) for i in range(4))
    plan = solve(snapshot, [GangRequest("g", members)])
    [placement] = plan.placements
    assert len({w.node for w in placement.pods}) == 1
    assert placement.topology_level is TopologyLevel.NVLINK


def test_unhealthy_gpu_is_never_given_out() -> None:
    node = make_node("n0")
    gpus: list[Gpu] = make_gpus("n0", 2)
    gpus[0] = replace(gpus[0], healthy=False)
    snapshot = Snapshot((node,), tuple(gpus))
    plan = solve(snapshot, [PodRequest("a", gpus=1), PodRequest("b", gpus=1)])
    assert len(plan.placements) == 1
    assert plan.placements[0].pods[0].gpus[0].gpu_id == "n0/1"
    assert "insufficient nvidia.com/gpu" not in plan.unschedulable[0].reason  # it fits alone


def test_duplicate_keys_are_a_caller_error() -> None:
    with pytest.raises(ValueError, match="unique"):
        solve(_pool(1), [PodRequest("a"), PodRequest("a")])


def test_empty_batch_gives_empty_plan() -> None:
    plan = solve(_pool(1), [], config=SolverConfig())
    assert plan.placements == () and plan.unschedulable == ()


def test_gangs_never_span_regions() -> None:
    nodes = [make_node("a", region="east"), make_node("b", region="west")]
    gpus = make_gpus("a", 4) + make_gpus("b", 4)
    snapshot = Snapshot(tuple(nodes), tuple(gpus))
    gang = GangRequest("g", tuple(PodRequest(f"w{i}", cpu_milli=1000, gpus=4) for i in range(2)))
    [item] = solve(snapshot, [gang]).unschedulable
    assert item.reason.endswith("within one region; the roomiest region holds only 1")
    alone = solve(snapshot, [PodRequest("w", gpus=4), PodRequest("v", gpus=4)])
    assert alone.placed_keys == {"w", "v"}  # independent pods may use both regions


def test_slices_required_on_one_gpu_share_it() -> None:
    node = make_node("n0")
    gpus = make_gpus("n0", 2)
    gpus[0] = replace(gpus[0], free_vram_mib=VRAM // 4, free_sm_pct=30)  # too small for three
    snapshot = Snapshot((node,), tuple(gpus))
    members = tuple(
        PodRequest(f"s{i}", cpu_milli=500, gpu_slice=GpuSlice(8 * 1024, 20)) for i in range(3)
    )
    gang = GangRequest("g", members, required_level=TopologyLevel.GPU)
    [placement] = solve(snapshot, [gang]).placements
    assert {s.gpu_id for w in placement.pods for s in w.gpus} == {"n0/1"}
    assert placement.topology_level is TopologyLevel.GPU and placement.topology_cost == 0


def test_preferred_level_keeps_a_gang_in_one_rack_when_it_can() -> None:
    snapshot = _pool(4, gpus=4)  # racks k0 = n0, n1 and k1 = n2, n3
    members = tuple(PodRequest(f"w{i}", cpu_milli=1000, gpus=4) for i in range(2))
    gang = GangRequest("g", members, preferred_level=TopologyLevel.RACK)
    [placement] = solve(snapshot, [gang]).placements
    racks = {w.node for w in placement.pods}
    assert racks in ({"n0", "n1"}, {"n2", "n3"})
    assert placement.topology_level is TopologyLevel.RACK


def test_a_gang_of_several_shapes_is_placed_in_member_order() -> None:
    """A parameter server of 1 GPU listed before workers of 4 (a JobSet's gang): the shapes are
    assigned one after the other, the placement still lists the members in their order (it was
    once refused by the plan's own check: "placed pods do not match its members")."""
    snapshot = _pool(4, gpus=8)
    workers = [PodRequest(f"w{i}", cpu_milli=1000, gpus=4) for i in range(3)]
    members = (PodRequest("ps", cpu_milli=1000, gpus=1), *workers)
    plan = solve(snapshot, [GangRequest("g", members, required_level=TopologyLevel.RACK)])
    [placement] = plan.placements
    assert [p.pod_key for p in placement.pods] == ["ps", "w0", "w1", "w2"]
    assert not plan.unschedulable
    assert verify(plan, snapshot) == []
