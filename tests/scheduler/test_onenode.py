"""The placement rank of ONE node's targets in plain Python (``Ranking.node_keys`` and
``scheduler/onenode.py``, what the greedy stage computes after every placement) against the
vectorised forms it stands in for: the same numbers, not just close ones, since plans must not
change.

* the FGD class of ``onenode.fgd_classes`` against ``Ranking._fgd_node``/``_fgd_slice`` on the
  same targets, wherever it answers, on random pools and ledgers, and on nodes built so that
  the fragment does not change (``dF == 0``, where the last bits decide the class);
* the keys of ``Ranking.node_keys`` against ``Ranking.keys`` with every FGD class vectorised;
* ``onenode.certain_class`` against ``fgd_class`` over the interval it vouches for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import objective, onenode
from scheduler.greedy import Context, greedy, slice_gpus
from scheduler.jobs import Kind, Shape, build_jobs
from scheduler.ledger import Ledger
from scheduler.objective import fgd_class
from scheduler.requests import GpuSlice, PodRequest, Request
from scheduler.snapshot import Snapshot, WorkloadShape
from scheduler.solver import SolverConfig, _context
from scheduler.synthetic import PoolShape, h200_pool, random_gang, random_pods
from tests.scheduler.factories import (
    PoolSpec,
    make_gpus,
    make_node,
    pool_specs,
    random_batch,
    random_pool,
    seeds,
)

specs = pool_specs(fill=0.9)
WORKLOADS: tuple[tuple[WorkloadShape, ...], ...] = (
    (),  # the batch's own shapes
    (  # model-constrained shapes: the model reservation
        WorkloadShape(0.3, gpus=1, cpu_milli=4000, gpu_models=frozenset({"A100"})),
        WorkloadShape(0.3, gpus=2, cpu_milli=8000, memory_mib=65536),
        WorkloadShape(
            0.4, vram_mib=20 * 1024, sm_pct=25, cpu_milli=2000, gpu_models=frozenset({"H100"})
        ),
    ),
    (  # a burst: CPU-only pods, slices, whole GPUs
        WorkloadShape(0.5, cpu_milli=2000, memory_mib=4096),
        WorkloadShape(0.3, vram_mib=20480, sm_pct=25, cpu_milli=2000, memory_mib=8192),
        WorkloadShape(0.2, gpus=1, cpu_milli=8000, memory_mib=65536),
    ),
    (  # slices only, as in the trace replay's GPU-sharing mixes
        WorkloadShape(0.5, vram_mib=10 * 1024, sm_pct=10),
        WorkloadShape(0.3, vram_mib=40 * 1024, sm_pct=50, cpu_milli=1000),
        WorkloadShape(0.2, vram_mib=5 * 1024, sm_pct=25),
    ),
)
examples = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pools_batches_and_workloads = given(
    spec=specs, pool_seed=seeds, batch_seed=seeds, workload=st.sampled_from(range(len(WORKLOADS)))
)


def _with_workload(snapshot: Snapshot, workload: tuple[WorkloadShape, ...]) -> Snapshot:
    c = snapshot.cycle
    return snapshot.with_free(
        c.node_cpu_free, c.node_mem_free, c.gpu_free_vram, c.gpu_free_sm, workload=workload
    )


def _ledgers(snapshot: Snapshot, batch: Sequence[Request], steps: int) -> Iterator[Ledger]:
    """Ledgers with more and more of the greedy plan of ``batch`` placed on them."""
    ctx, jobs = _setup(snapshot, batch)
    placed = greedy(ctx, jobs)
    assignments = [a for job in sorted(placed) for a in placed[job]]
    ledger = Ledger(ctx.cycle)
    per_step = -(-len(assignments) // steps)
    yield ledger
    for step in range(steps):
        for a in assignments[step * per_step : (step + 1) * per_step]:
            ledger.assign(a)
        yield ledger


def _setup(snapshot: Snapshot, batch: Sequence[Request]) -> tuple[Context, list]:
    cycle = snapshot.cycle
    jobs = build_jobs(batch, reference_vram_mib=int(cycle.gpu_vram.max(initial=1)))
    return _context(snapshot, jobs, SolverConfig(seed=3)), jobs


def _targets(ctx: Context, ledger: Ledger, shape: Shape, node: int) -> list[int]:
    """Where one more pod of the shape fits on ``node`` (the node, or GPUs of it)."""
    filt = ctx.filters[shape]
    if shape.kind is Kind.SLICE:
        if not ledger.fits_on_node(shape, node):
            return []
        return slice_gpus(ledger, filt, node).tolist()
    return [node] if ledger.node_fits(filt, node) else []


def _compare_fgd(ctx: Context, ledger: Ledger, shapes: Sequence[Shape]) -> tuple[int, int]:
    """Plain against vectorised FGD classes on every node: (answered, asked)."""
    ranking = ctx.ranking
    answered = asked = 0
    for shape in shapes:
        for node in range(ctx.cycle.n_nodes):
            targets = _targets(ctx, ledger, shape, node)
            if not targets:
                continue
            plain = ranking._plain_fgd(ledger, shape, node, targets)
            asked += 1
            if plain is not None:
                answered += 1
                expected = ranking._fgd_vectorised(ledger, shape, np.array(targets))
                assert plain == expected.tolist(), (shape, node)
    return answered, asked


def _shapes(ctx: Context) -> list[Shape]:
    return sorted(ctx.filters, key=repr)


@examples
@pools_batches_and_workloads
def test_plain_fgd_class_equals_the_vectorised_one(
    spec: PoolSpec, pool_seed: int, batch_seed: int, workload: int
) -> None:
    snapshot = _with_workload(random_pool(spec, pool_seed), WORKLOADS[workload])
    batch = random_batch(batch_seed, pods=30, gangs=2)
    for ledger in _ledgers(snapshot, batch, steps=3):
        ctx, _ = _setup(snapshot, batch)
        _compare_fgd(ctx, ledger, _shapes(ctx))


def test_plain_fgd_class_on_a_large_pool_answers_nearly_always() -> None:
    """An H200 pool 60 % full, a mix with CPU-only shapes (as recent workloads have): the plain
    form answers for nearly every node (it falls back only within ~1e-10 of a class boundary)
    and agrees everywhere."""
    base = h200_pool(PoolShape(zones=1, racks_per_zone=4, nodes_per_rack=16), fill=0.6, seed=4)
    rng = np.random.default_rng(4)
    batch: list[Request] = [*random_pods(rng, 200)]
    batch += [random_gang(rng, f"gang{i}", gpus=4, sliced=i % 2 == 0) for i in range(3)]
    for workload in (WORKLOADS[2], WORKLOADS[2][:1] + WORKLOADS[3]):
        snapshot = _with_workload(base, workload)
        answered = asked = 0
        for ledger in _ledgers(snapshot, batch, steps=2):
            ctx, _ = _setup(snapshot, batch)
            a, b = _compare_fgd(ctx, ledger, _shapes(ctx))
            answered, asked = answered + a, asked + b
        assert asked > 1000
        assert answered >= 0.97 * asked


def _one_node(free: Sequence[tuple[int, int]], workload: tuple[WorkloadShape, ...]) -> Snapshot:
    node = make_node("n", cpu=64_000, memory=512 * 1024)
    gpus = [
        replace(g, free_vram_mib=v, free_sm_pct=s)
        for g, (v, s) in zip(make_gpus("n", len(free)), free, strict=True)
    ]
    return Snapshot((node,), tuple(gpus), workload=workload)


@pytest.mark.parametrize(
    "free",
    [
        [(80 * 1024, 100)] * 8,  # pristine
        [(80 * 1024, 100)] * 5 + [(0, 0)] * 3,
        [(80 * 1024, 100)] * 2 + [(40 * 1024, 50), (20 * 1024, 75), (0, 0)] * 2,
    ],
)
def test_a_fragment_that_does_not_change_gives_the_vectorised_class(
    free: list[tuple[int, int]],
) -> None:
    """Pods that change no shape's fragment (``dF == 0`` exactly): a CPU-only pod with CPU to
    spare, a whole GPU or a slice against a mix of small slices that every GPU with room
    still fits. The plain form answers 50 where it can prove it, else leaves it to the
    vectorised form; either way the same class."""
    mix = (WorkloadShape(0.6, vram_mib=1024, sm_pct=1), WorkloadShape(0.4, vram_mib=2048, sm_pct=2))
    snapshot = _one_node(free, mix)
    batch: list[Request] = [
        PodRequest("cpu", cpu_milli=1000, memory_mib=1024),
        PodRequest("whole", cpu_milli=1000, gpus=1),
        PodRequest("slice", cpu_milli=1000, gpu_slice=GpuSlice(1024, 1)),
    ]
    ctx, _ = _setup(snapshot, batch)
    ledger = Ledger(ctx.cycle)
    for shape in _shapes(ctx):
        targets = _targets(ctx, ledger, shape, 0)
        if not targets:
            continue
        plain = ctx.ranking._plain_fgd(ledger, shape, 0, targets)
        expected = ctx.ranking._fgd_vectorised(ledger, shape, np.array(targets)).tolist()
        assert plain is None or plain == expected
        if shape.kind is not Kind.SLICE:
            assert plain == expected == [50]


@examples
@pools_batches_and_workloads
def test_node_keys_equal_the_vectorised_keys(
    spec: PoolSpec, pool_seed: int, batch_seed: int, workload: int
) -> None:
    """``node_keys`` on one cycle state, ``keys`` with every FGD class vectorised on another
    built from the same pool (caches of their own): the same keys on every node."""
    batch = random_batch(batch_seed, pods=30, gangs=2)
    plain_snapshot = _with_workload(random_pool(spec, pool_seed), WORKLOADS[workload])
    vector_snapshot = _with_workload(random_pool(spec, pool_seed), WORKLOADS[workload])
    plain_ctx, _ = _setup(plain_snapshot, batch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(objective, "PLAIN_TARGETS", 0)
        for plain_ledger, vector_ledger in zip(
            _ledgers(plain_snapshot, batch, steps=3),
            _ledgers(vector_snapshot, batch, steps=3),
            strict=True,
        ):
            vector_ctx, _ = _setup(vector_snapshot, batch)
            for shape in _shapes(plain_ctx):
                for node in range(plain_ctx.cycle.n_nodes):
                    targets = _targets(plain_ctx, plain_ledger, shape, node)
                    got = plain_ctx.ranking.node_keys(plain_ledger, shape, node, targets)
                    want = vector_ctx.ranking.keys(vector_ledger, shape, np.array(targets))
                    assert got == want.tolist(), (shape, node)


@settings(max_examples=300, deadline=None)
@given(
    delta=st.one_of(
        st.floats(-60_000, 60_000),
        st.sampled_from([0.0, 1e-12, -1e-12, 2.0, -2.0]),  # near 0 and a class boundary
    ),
    tol=st.floats(0.0, 1.0),
)
def test_certain_class_is_the_class_of_the_whole_interval(delta: float, tol: float) -> None:
    found = onenode.certain_class(delta, tol)
    if found is not None:
        points = np.linspace(delta - tol, delta + tol, 17)
        assert set(fgd_class(points).tolist()) == {found}
    assert onenode.certain_class(0.0, 1e-10) is None  # 50, or 49/51 as the last bits fall


def test_changed_since_lists_the_nodes_changed_in_order() -> None:
    snapshot = random_pool(PoolSpec(nodes=4, gpus=4, unhealthy=0.0, fill=0.0), seed=1)
    ledger = Ledger(snapshot.cycle)
    gpu = int(snapshot.cycle.node_gpu_start[2])
    ledger.take_node(3, 100, 100)
    mark = ledger.changes
    ledger.take_gpu(gpu, 1024, 10)
    ledger.take_node(1, 100, 100)
    assert ledger.changed_since(0) == [1, 2, 3]
    assert ledger.changed_since(mark) == [1, 2]
    undo = ledger.mark()
    ledger.take_node(0, 1, 1)
    ledger.rollback(undo)
    assert ledger.changed_since(mark) == [0, 1, 2]


@examples
@given(spec=specs, pool_seed=seeds, batch_seed=seeds)
def test_idle_capacity_kept_up_after_each_placement(
    spec: PoolSpec, pool_seed: int, batch_seed: int
) -> None:
    """``Ranking._idle`` brings one changed node up to date in plain Python: the GPUs' idle
    shares as numpy computes them for the whole pool, the node's as the padded row's sum."""
    snapshot = random_pool(spec, pool_seed)
    batch = random_batch(batch_seed, pods=30, gangs=2)
    ctx, jobs = _setup(snapshot, batch)
    placed = greedy(ctx, jobs)
    cycle = ctx.cycle
    ledger = Ledger(cycle)
    ranking = ctx.ranking
    ranking._idle(ledger)
    for a in [a for job in sorted(placed) for a in placed[job]]:
        ledger.assign(a)
        gpu_idle, node_idle = ranking._idle(ledger)
        raw = 1000 * ledger.vram / np.maximum(cycle.gpu_vram, 1) + 10.0 * ledger.sm
        assert gpu_idle.tolist() == np.where(cycle.gpu_healthy, raw / 2.0, 0.0).tolist()
        idx = cycle.node_gpus[[a.node]]
        row = np.where(idx >= 0, gpu_idle[np.maximum(idx, 0)], 0.0)
        assert node_idle[a.node] == row.sum(axis=1)[0]
