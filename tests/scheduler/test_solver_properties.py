"""Property-based tests of the solver over random pools and batches."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler.solver as solver_module
from scheduler.plan import RequestStatus
from scheduler.requests import GangRequest, Request
from scheduler.snapshot import TopologyLevel
from scheduler.solver import SolverConfig, solve
from scheduler.synthetic import PoolShape, h200_pool, random_gang, random_pods
from scheduler.topology import cost_floor
from scheduler.verify import verify
from tests.scheduler.checks import check_plan
from tests.scheduler.factories import PoolSpec, pool_specs, random_batch, random_pool, seeds

CONFIGS = {
    "cpsat": SolverConfig(),
    "greedy": SolverConfig(use_cpsat=False),
}

specs = pool_specs(racks=2, nodes=3)


@contextmanager
def without_cost_floor() -> Iterator[None]:
    """The solver sees no cost floor: every gang above zero cost sends its batch to CP-SAT."""
    real = solver_module.cost_floor
    solver_module.cost_floor = lambda cycle, gpus: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        solver_module.cost_floor = real


quick = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@quick
@given(spec=specs, pool_seed=seeds, batch_seed=seeds, path=st.sampled_from(sorted(CONFIGS)))
def test_plans_never_break_capacity_or_constraints(
    spec: PoolSpec, pool_seed: int, batch_seed: int, path: str
) -> None:
    """No GPU or node over capacity, gangs all-or-nothing, required topology honoured, GPU models
    honoured, unhealthy GPUs and cordoned nodes never used."""
    snapshot = random_pool(spec, pool_seed)
    batch = random_batch(batch_seed, pods=5, gangs=2)
    plan = solve(snapshot, batch, config=CONFIGS[path])
    check_plan(snapshot, batch, plan)
    assert verify(plan, snapshot) == []
    assert all(u.status is RequestStatus.UNSCHEDULABLE for u in plan.unschedulable)


@quick
@given(spec=specs, pool_seed=seeds, batch_seed=seeds, which=st.integers(0, 6))
def test_greedy_and_cpsat_agree_on_feasibility(
    spec: PoolSpec, pool_seed: int, batch_seed: int, which: int
) -> None:
    """One request alone: the greedy fallback places it exactly when exact CP-SAT does."""
    snapshot = random_pool(spec, pool_seed)
    request = random_batch(batch_seed, pods=4, gangs=3)[which]
    by_greedy = solve(snapshot, [request], config=SolverConfig(use_cpsat=False))
    by_cpsat = solve(snapshot, [request], config=SolverConfig(exact=True))
    assert by_greedy.placed_keys == by_cpsat.placed_keys


@settings(max_examples=10, deadline=None)
@given(spec=specs, pool_seed=seeds, batch_seed=seeds)
def test_same_input_same_plan(spec: PoolSpec, pool_seed: int, batch_seed: int) -> None:
    snapshot = random_pool(spec, pool_seed)
    batch = random_batch(batch_seed)
    first = solve(snapshot, batch)
    again = solve(random_pool(spec, pool_seed), batch)
    assert first.placements == again.placements
    assert first.unschedulable == again.unschedulable


@settings(max_examples=12, deadline=None)
@given(
    pool_seed=seeds,
    batch_seed=seeds,
    fill=st.floats(0.2, 0.8),
    nvlink_domains=st.sampled_from([1, 2]),
)
def test_invariants_hold_where_pruning_matters(
    pool_seed: int, batch_seed: int, fill: float, nvlink_domains: int
) -> None:
    """A pool larger than the candidate sets (36 nodes of 8 GPUs), gangs up to 32 GPUs and a mix
    of pods: the pruned CP-SAT path still returns only valid plans."""
    shape = PoolShape(zones=2, racks_per_zone=3, nodes_per_rack=6, nvlink_domains=nvlink_domains)
    snapshot = h200_pool(shape, fill=fill, unhealthy=0.05, cordoned=0.05, seed=pool_seed)
    rng = np.random.default_rng(batch_seed)
    levels = [None, TopologyLevel.NVLINK, TopologyLevel.NODE, TopologyLevel.RACK]
    batch: list[Request] = [
        random_gang(
            rng,
            f"g{i}",
            gpus=int(rng.choice([2, 4, 8, 16, 32])),
            sliced=bool(rng.random() < 0.3),
            required=levels[int(rng.integers(len(levels)))],
            priority=int(rng.integers(0, 3)),
        )
        for i in range(4)
    ]
    batch += random_pods(rng, 30)
    plan = solve(snapshot, batch)
    check_plan(snapshot, batch, plan)
    assert verify(plan, snapshot) == []


@settings(max_examples=40, deadline=None)
@given(spec=specs, pool_seed=seeds, batch_seed=seeds, which=st.integers(0, 2))
def test_cost_floor_is_never_beaten(
    spec: PoolSpec, pool_seed: int, batch_seed: int, which: int
) -> None:
    """`topology.cost_floor` is a lower bound: a gang placed to optimality (exact CP-SAT) never
    costs less than the floor of its GPUs, so a greedy plan at the floor is optimal."""
    snapshot = random_pool(spec, pool_seed)
    gang = [r for r in random_batch(batch_seed, pods=0, gangs=3) if isinstance(r, GangRequest)]
    request = gang[which % len(gang)]
    plan = solve(snapshot, [request], config=SolverConfig(exact=True))
    for placement in plan.placements:
        gpus = {s.gpu_id for pod in placement.pods for s in pod.gpus}
        assert placement.topology_cost >= cost_floor(snapshot.cycle, len(gpus))


@settings(max_examples=25, deadline=None)
@given(
    pool_seed=seeds,
    batch_seed=seeds,
    fill=st.floats(0.0, 0.7),
    nvlink_domains=st.sampled_from([1, 2]),
)
def test_skipping_cpsat_at_the_floor_changes_no_plan(
    pool_seed: int,
    batch_seed: int,
    fill: float,
    nvlink_domains: int,
) -> None:
    """CP-SAT is skipped when the greedy plan's gangs are at their cost floor; the plans are
    the same as when CP-SAT runs on every batch with a gang (its plan is kept only when strictly
    better, and nothing is better than the floor)."""
    shape = PoolShape(zones=2, racks_per_zone=2, nodes_per_rack=4, nvlink_domains=nvlink_domains)
    snapshot = h200_pool(shape, fill=fill, seed=pool_seed)
    rng = np.random.default_rng(batch_seed)
    levels = [TopologyLevel.NODE, TopologyLevel.RACK, None]
    batch: list[Request] = [
        random_gang(
            rng, f"g{i}", gpus=int(rng.choice([2, 4, 8, 16])), required=levels[i % len(levels)]
        )
        for i in range(3)
    ]
    batch += random_pods(rng, 12)
    with_floor = solve(snapshot, batch)
    with without_cost_floor():
        always = solve(snapshot, batch)
    assert with_floor.placements == always.placements
    assert with_floor.unschedulable == always.unschedulable
