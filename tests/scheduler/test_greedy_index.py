"""The greedy stage's shortcuts against the straightforward computation they replace.

* ``greedy.TargetIndex`` (the best target of a pod class from per-block minima of the keys,
  re-ranked only where a placement changed the ledger) against a scan that ranks every fitting
  target from scratch for every pod;
* the FGD class (``Ranking.fgd``: cached per node and per ledger, computed once per distinct
  shape of the mix) against the formula evaluated directly on the whole mix, with no cache.

Both must give the same numbers, not just equally good ones: plans are compared exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import greedy, scoring
from scheduler.cycle import CycleState, IntArray
from scheduler.greedy import Assignments, Context, ScoreCache
from scheduler.jobs import Job, Kind, Shape, build_jobs
from scheduler.ledger import Ledger, PodAssignment
from scheduler.objective import Ranking, Rows, _rows, fgd_class
from scheduler.requests import Request
from scheduler.snapshot import Snapshot, WorkloadShape
from scheduler.solver import SolverConfig, _context, solve
from scheduler.synthetic import PoolShape, h200_pool, random_gang, random_pods
from tests.scheduler.factories import (
    PoolSpec,
    pool_specs,
    random_batch,
    random_pod,
    random_pool,
    seeds,
)

specs = pool_specs()
# A recent workload with model-constrained shapes (the model reservation), or none (the mix
# is the batch's own shapes, one per pod class, so the same shape appears once per priority).
WORKLOADS: tuple[tuple[WorkloadShape, ...], ...] = (
    (),
    (
        WorkloadShape(0.3, gpus=1, gpu_models=frozenset({"A100"})),
        WorkloadShape(0.3, gpus=2),
        WorkloadShape(0.4, vram_mib=20 * 1024, sm_pct=25, gpu_models=frozenset({"H100"})),
    ),
)
examples = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the FGD class, straight from the formula -----------------------------------------------------
def direct_fragment(ranking: Ranking, rows: Rows, nodes: IntArray) -> np.ndarray:
    """``scoring.fragment`` of each row against the whole mix (every shape, no shortcuts)."""
    node_vram = rows.vram.max(axis=1, initial=0)
    frag = np.zeros(len(node_vram), dtype=np.float64)
    models = ranking.cycle.node_model[nodes]
    for size in np.unique(node_vram[node_vram > 0]).tolist():
        at = node_vram == size
        target = ranking._target(int(size))
        frag[at] = scoring.fragment(
            1000.0 * rows.free_vram[at] / size,
            10.0 * rows.free_sm[at],
            rows.cpu[at],
            scoring.shape_access(models[at], target),
            target,
            rows.mem[at],
        )
    return frag


def direct_fgd_node(ranking: Ranking, ledger: Ledger, shape: Shape, nodes: IntArray) -> IntArray:
    rows = _rows(ledger, nodes)
    before = direct_fragment(ranking, rows, nodes)
    after_rows = replace(rows, cpu=rows.cpu - shape.cpu_milli, mem=rows.mem - shape.memory_mib)
    if shape.kind is Kind.WHOLE:
        pristine = (rows.vram > 0) & (rows.free_vram == rows.vram) & (rows.free_sm == 100)
        taken = pristine & (np.cumsum(pristine, axis=1) <= shape.gpus)
        after_rows = replace(
            after_rows,
            free_vram=np.where(taken, 0, rows.free_vram),
            free_sm=np.where(taken, 0, rows.free_sm),
        )
    return fgd_class(direct_fragment(ranking, after_rows, nodes) - before)


def direct_fgd_slice(ranking: Ranking, ledger: Ledger, shape: Shape, gpus: IntArray) -> IntArray:
    """The node's summary against the whole mix, then each GPU's contribution."""
    cycle = ranking.cycle
    out = np.zeros(len(gpus), dtype=np.int64)
    nodes, at_node = np.unique(cycle.gpu_node[gpus], return_inverse=True)
    at_node = at_node.ravel()
    rows = _rows(ledger, nodes)
    node_vram = rows.vram.max(axis=1, initial=0)
    for size in np.unique(node_vram[node_vram > 0]).tolist():
        target = ranking._target(int(size))
        in_size = node_vram == size
        u = np.flatnonzero(in_size)
        access = scoring.shape_access(cycle.node_model[nodes[u]], target)
        v_all = 1000.0 * rows.free_vram[u] / size
        s_all = 10.0 * rows.free_sm[u]
        n_fit, stranded, idle = scoring.fragment_stats(v_all, s_all, target)
        before = scoring.fragment_from_stats(
            n_fit, stranded, idle, rows.cpu[u], access, target, rows.mem[u]
        )
        local = np.full(len(nodes), -1, dtype=np.int64)
        local[u] = np.arange(len(u))
        pick = np.flatnonzero(in_size[at_node])
        k = local[at_node[pick]]
        g = gpus[pick]
        v = 1000.0 * ledger.vram[g] / size
        sm = 10.0 * ledger.sm[g]
        v2 = 1000.0 * (ledger.vram[g] - shape.vram_mib) / size
        s2 = 10.0 * (ledger.sm[g] - shape.sm_pct)
        usable = cycle.gpu_healthy[g]
        v, sm = np.where(usable, v, 0.0), np.where(usable, sm, 0.0)
        fit_old = (v[:, None] >= target.vram) & (sm[:, None] >= target.sm)
        fit_new = (v2[:, None] >= target.vram) & (s2[:, None] >= target.sm)
        idle_old, idle_new = (v + sm) / 2.0, (v2 + s2) / 2.0
        after = scoring.fragment_from_stats(
            n_fit[k] + fit_new.astype(np.int64) - fit_old,
            stranded[k] + (~fit_new) * idle_new[:, None] - (~fit_old) * idle_old[:, None],
            idle[k] - (idle_old - idle_new),
            rows.cpu[u][k] - shape.cpu_milli,
            access[k],
            target,
            rows.mem[u][k] - shape.memory_mib,
        )
        out[pick] = fgd_class(after - before[k])
    return out


def direct_fgd(ranking: Ranking, ledger: Ledger, shape: Shape, targets: IntArray) -> IntArray:
    if shape.kind is Kind.SLICE:
        return direct_fgd_slice(ranking, ledger, shape, targets)
    return direct_fgd_node(ranking, ledger, shape, targets)


class DirectRanking(Ranking):
    """The placement rank with the FGD class computed from scratch on every call."""

    def fgd(self, ledger: Ledger, shape: Shape, targets: IntArray) -> IntArray:
        return direct_fgd(self, ledger, shape, targets)


# -- the greedy stage, scanning every target for every pod ----------------------------------------
def scan_place_class(
    ledger: Ledger, ctx: Context, job: Job, cache: ScoreCache
) -> list[PodAssignment]:
    filt = ctx.filters[job.groups[0].shape]
    out: list[PodAssignment] = []
    for pod in job.groups[0].pods:
        targets = greedy._fitting(ledger, filt)
        if len(targets) == 0:
            break
        keys = ctx.ranking.keys(ledger, filt.shape, targets)
        a = greedy._assignment(ledger, filt.shape, pod, int(targets[np.argmin(keys)]))
        ledger.assign(a)
        out.append(a)
    return out


def scan_greedy(ctx: Context, jobs: Sequence[Job], seed: int) -> Assignments:
    """The greedy stage with every pod of a class placed by a scan of every fitting target,
    ranked from scratch (FGD classes included)."""
    direct = DirectRanking(ctx.cycle, ctx.ranking.mix, ctx.ranking.mix_key, seed)
    scan_ctx = replace(ctx, ranking=direct)
    original = greedy.place_class
    greedy.place_class = scan_place_class
    try:
        return greedy.greedy(scan_ctx, jobs)
    finally:
        greedy.place_class = original


def _placed(assignments: Assignments) -> dict[int, list[tuple[str, int, tuple[int, ...]]]]:
    return {job: [(a.pod.key, a.node, a.gpus) for a in pods] for job, pods in assignments.items()}


def _jobs_and_context(
    snapshot: Snapshot, batch: Sequence[Request], seed: int
) -> tuple[list[Job], Context]:
    cycle = snapshot.cycle
    jobs = build_jobs(batch, reference_vram_mib=int(cycle.gpu_vram.max(initial=1)))
    return jobs, _context(snapshot, jobs, SolverConfig(seed=seed))


def classy_batch(seed: int, *, pods: int, gangs: int) -> list[Request]:
    """``pods`` single pods of a few shapes (so pod classes have many pods), then the gangs of
    ``random_batch``."""
    rng = np.random.default_rng(seed)
    templates = [random_pod(rng, "t") for _ in range(4)]
    batch: list[Request] = [
        replace(templates[int(rng.integers(len(templates)))], key=f"p{i}") for i in range(pods)
    ]
    return batch + [r for r in random_batch(seed, pods=0, gangs=gangs)]


def _with_workload(snapshot: Snapshot, workload: tuple[WorkloadShape, ...]) -> Snapshot:
    c = snapshot.cycle
    return snapshot.with_free(
        c.node_cpu_free, c.node_mem_free, c.gpu_free_vram, c.gpu_free_sm, workload=workload
    )


@examples
@given(
    spec=specs,
    pool_seed=seeds,
    batch_seed=seeds,
    seed=st.integers(0, 3),
    workload=st.sampled_from(range(len(WORKLOADS))),
    pods=st.integers(1, 40),
    gangs=st.integers(0, 3),
)
def test_indexed_greedy_places_exactly_like_a_full_scan(
    spec: PoolSpec,
    pool_seed: int,
    batch_seed: int,
    seed: int,
    workload: int,
    pods: int,
    gangs: int,
) -> None:
    snapshot = _with_workload(random_pool(spec, pool_seed), WORKLOADS[workload])
    batch = classy_batch(batch_seed, pods=pods, gangs=gangs)
    jobs, ctx = _jobs_and_context(snapshot, batch, seed)
    assert _placed(greedy.greedy(ctx, jobs)) == _placed(scan_greedy(ctx, jobs, seed))


def test_indexed_greedy_on_a_large_pool_and_derived_snapshots() -> None:
    """A 2,048-GPU pool 60 % full: 300 mixed pods and sliced gangs, on the pool and on a
    derived snapshot whose FGD caches already hold values from the first solve."""
    base = h200_pool(PoolShape(zones=1, racks_per_zone=16, nodes_per_rack=16), fill=0.6, seed=5)
    rng = np.random.default_rng(5)
    batch: list[Request] = [*random_pods(rng, 300)]
    batch += [random_gang(rng, f"gang{i}", gpus=4, sliced=i % 2 == 0) for i in range(4)]
    for snapshot in (base, _with_workload(base, ()), _with_workload(base, WORKLOADS[1][1:])):
        jobs, ctx = _jobs_and_context(snapshot, batch, seed=1)
        assert _placed(greedy.greedy(ctx, jobs)) == _placed(scan_greedy(ctx, jobs, 1))


@examples
@given(
    spec=specs,
    pool_seed=seeds,
    batch_seed=seeds,
    workload=st.sampled_from(range(len(WORKLOADS))),
    taken=st.integers(0, 12),
)
def test_fgd_class_equals_the_formula_on_the_whole_mix(
    spec: PoolSpec, pool_seed: int, batch_seed: int, workload: int, taken: int
) -> None:
    """Every shape of a batch on every node or GPU, on a ledger with some pods placed: the
    cached class (per distinct shape) equals the formula's, also after further placements."""
    snapshot = _with_workload(random_pool(spec, pool_seed), WORKLOADS[workload])
    batch = classy_batch(batch_seed, pods=20, gangs=0)
    jobs, ctx = _jobs_and_context(snapshot, batch, seed=0)
    ranking = ctx.ranking
    placed = greedy.greedy(ctx, jobs)
    ledger = Ledger(ctx.cycle)
    assignments = [a for job in sorted(placed) for a in placed[job]]
    shapes = sorted({g.shape for j in jobs for g in j.groups}, key=repr)
    for step in range(2):
        for a in assignments[step * taken : (step + 1) * taken]:
            ledger.assign(a)
        for shape in shapes:
            everything = _everything(ctx.cycle, shape)
            expected = direct_fgd(ranking, ledger, shape, everything)
            assert ranking.fgd(ledger, shape, everything).tolist() == expected.tolist()


def _everything(cycle: CycleState, shape: Shape) -> IntArray:
    n = cycle.n_gpus if shape.kind is Kind.SLICE else cycle.n_nodes
    return np.arange(n, dtype=np.int64)


def test_solve_is_unchanged_by_derived_snapshot_caches() -> None:
    """The same batch on a fresh snapshot and on one derived from a pool whose caches were
    filled by other batches: the same plan."""
    shape = PoolShape(zones=1, racks_per_zone=8, nodes_per_rack=16)
    base = h200_pool(shape, fill=0.6, seed=9)
    config = SolverConfig(seed=2, time_limit_s=30.0)
    batch = random_pods(np.random.default_rng(11), 400)
    c = base.cycle
    for other in (12, 13):
        warm = base.with_free(c.node_cpu_free, c.node_mem_free, c.gpu_free_vram, c.gpu_free_sm)
        solve(warm, random_pods(np.random.default_rng(other), 400), config=config)
    derived = base.with_free(c.node_cpu_free, c.node_mem_free, c.gpu_free_vram, c.gpu_free_sm)
    cold = h200_pool(shape, fill=0.6, seed=9)  # its own cycle state: empty caches
    k = cold.cycle
    cold = cold.with_free(k.node_cpu_free, k.node_mem_free, k.gpu_free_vram, k.gpu_free_sm)
    assert solve(derived, batch, config=config) == solve(cold, batch, config=config)


def test_distinct_shapes_spread_back_exactly() -> None:
    """``TargetShapes.distinct``: one entry per distinct shape, weights summed, and the
    per-shape fragment of the distinct shapes spread back equals the per-shape fragment."""
    rng = np.random.default_rng(3)
    target = scoring.TargetShapes.build(
        cpu=[4000, 4000, 0, 4000, 8000],
        vram=[250, 250, 0, 250, 1000],
        sm=[120, 120, 0, 120, 1000],
        count=[1, 1, 0, 1, 2],
        weight=[0.1, 0.2, 0.3, 0.15, 0.25],
    )
    uniq, inverse = target.distinct
    assert uniq.size == 3
    assert inverse.tolist() == [0, 0, 1, 0, 2]
    assert np.allclose(uniq.weight, [0.45, 0.3, 0.25])
    v = rng.integers(0, 1001, size=(50, 8)).astype(np.float64)
    s = rng.integers(0, 1001, size=(50, 8)).astype(np.float64)
    cpu = rng.integers(0, 64_000, size=50).astype(np.float64)
    access = np.ones((50, target.size), dtype=bool)
    full = scoring.fragment_by_shape(v, s, cpu, access, target)
    part = scoring.fragment_by_shape(v, s, cpu, access[:, : uniq.size], uniq)
    assert (part[:, inverse] == full).all()
    assert (scoring.fragment(v, s, cpu, access, target) == (full @ target.weight)).all()
