"""Fragmentation of GPU nodes measured against a target distribution of request shapes.

This is the measure of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC'23), generalised from one GPU dimension to two.

Vocabulary
----------
- A *shape* ``m`` is a kind of request: ``cpu[m]`` milli-CPU (and optionally ``mem[m]`` MiB of host
  memory), ``count[m]`` GPUs (0 = a CPU-only request), and on each of those GPUs ``vram[m]`` of the
  memory and ``sm[m]`` of the streaming multiprocessors, both as shares of one GPU (thousandths in
  Tessera's bench: 1000 = a whole GPU). ``model_mask[m]`` says which GPU models it accepts.
- The *target* is a set of shapes with probabilities ``weight[m]`` (summing to 1): the recent mix of
  requests, e.g. the most popular shapes covering 95 % of the requests (:func:`target_shapes`).
- A GPU ``g`` has ``vram_free[g]`` and ``sm_free[g]`` left. Its *idle* amount is the mean of the
  two, ``(vram_free + sm_free) / 2``; in the one-dimensional case (``vram == sm`` everywhere) it is
  just the free share of the GPU.
- GPU ``g`` *fits* shape ``m`` when both of its free dimensions cover the shape's per-GPU request.

Definition
----------
The fragment of node ``n`` for shape ``m`` is the idle GPU capacity that a request of shape ``m``
could not use:

- if ``m`` needs no GPU, or the node's model is not accepted, or the node lacks the CPU (or memory)
  for ``m``, or fewer than ``count[m]`` of its GPUs fit ``m``: all of the node's idle GPU capacity;
- otherwise: the idle capacity of the GPUs that do not fit ``m``.

The fragment of the node is the expectation over the target, ``F(n) = sum_m weight[m] * F(n, m)``.
A placement policy (FGD) puts each request where ``F`` grows least. With ``vram == sm`` this is
exactly the paper's definition (its classes Q1, Q2, Q4, "no access" and "CPU-only" count the whole
idle GPU capacity, its class Q3 counts the GPUs whose remainder is below the request).

Everything here is a pure function over numpy arrays with arbitrary leading dimensions (nodes,
candidate placements, ...) and a trailing GPU axis of length ``G``. Nodes with fewer than ``G`` GPUs
pad the missing ones with zero free capacity: they fit nothing and hold no idle capacity, so the
padding changes no result.

The computation is split in two so that callers can update it incrementally:
:func:`fragment_stats` summarises each node's GPUs per shape (how many fit, how much idle capacity
is stranded on the others, the total idle capacity), and :func:`fragment_from_stats` combines those
with the node's free CPU/memory. :func:`fragment` does both.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

ANY_MODEL = -1  # a model mask with every bit set


@dataclass(frozen=True)
class TargetShapes:
    """A distribution of request shapes (parallel arrays of length ``M``)."""

    cpu: FloatArray
    vram: FloatArray
    sm: FloatArray
    count: IntArray
    weight: FloatArray
    model_mask: IntArray
    mem: FloatArray

    @classmethod
    def build(
        cls,
        *,
        cpu: ArrayLike,
        vram: ArrayLike,
        count: ArrayLike,
        weight: ArrayLike,
        sm: ArrayLike | None = None,
        model_mask: ArrayLike | None = None,
        mem: ArrayLike | None = None,
    ) -> TargetShapes:
        """Shapes from array-likes; ``sm`` defaults to ``vram`` (1-D), masks to any model."""
        vram_a = np.asarray(vram, dtype=np.float64)
        size = vram_a.shape[0]
        return cls(
            cpu=np.asarray(cpu, dtype=np.float64),
            vram=vram_a,
            sm=vram_a.copy() if sm is None else np.asarray(sm, dtype=np.float64),
            count=np.asarray(count, dtype=np.int64),
            weight=np.asarray(weight, dtype=np.float64),
            model_mask=(
                np.full(size, ANY_MODEL, dtype=np.int64)
                if model_mask is None
                else np.asarray(model_mask, dtype=np.int64)
            ),
            mem=np.zeros(size) if mem is None else np.asarray(mem, dtype=np.float64),
        )

    @property
    def size(self) -> int:
        return int(self.weight.shape[0])

    @cached_property
    def distinct(self) -> tuple[TargetShapes, IntArray]:
        """The distinct shapes (equal in everything but the weight, which is summed) and the
        position of each shape among them: ``F(n, m) == F_distinct(n, inverse[m])`` exactly, so
        per-shape work is done once per distinct shape (a mix built from a batch has one shape
        per pod class: the same shape once per priority)."""
        rows = zip(
            self.cpu.tolist(),
            self.vram.tolist(),
            self.sm.tolist(),
            self.count.tolist(),
            self.model_mask.tolist(),
            self.mem.tolist(),
            strict=True,
        )
        position: dict[tuple[float, float, float, int, int, float], int] = {}
        inverse = np.array([position.setdefault(r, len(position)) for r in rows], dtype=np.int64)
        pick = np.unique(inverse, return_index=True)[1].astype(np.int64)
        uniq = TargetShapes(
            cpu=self.cpu[pick],
            vram=self.vram[pick],
            sm=self.sm[pick],
            count=self.count[pick],
            weight=np.bincount(inverse, weights=self.weight, minlength=len(pick)).astype(
                np.float64
            ),
            model_mask=self.model_mask[pick],
            mem=self.mem[pick],
        )
        return uniq, inverse


def target_shapes(
    *,
    cpu: ArrayLike,
    vram: ArrayLike,
    count: ArrayLike,
    sm: ArrayLike | None = None,
    model_mask: ArrayLike | None = None,
    label: Sequence[Hashable] | None = None,
    mem: ArrayLike | None = None,
    coverage: float = 0.95,
) -> TargetShapes:
    """The most popular request shapes covering at least `coverage` of the requests.

    Requests (one entry per request in each array) are grouped by identical
    ``(cpu, vram, sm, count, label)`` (``label`` defaults to the model mask; pass e.g. the raw
    model-constraint text to group exactly like the paper). Groups are ranked by count (ties: the
    larger ``(cpu, vram, count, label)`` first), the top ones are kept until their cumulative count
    reaches ``coverage`` of all requests, and their counts are renormalised into probabilities.
    ``mem`` (optional) is averaged within each group.
    """
    cpu_a = np.asarray(cpu, dtype=np.float64)
    vram_a = np.asarray(vram, dtype=np.float64)
    sm_a = vram_a if sm is None else np.asarray(sm, dtype=np.float64)
    count_a = np.asarray(count, dtype=np.int64)
    mask_a = (
        np.full(cpu_a.shape, ANY_MODEL, dtype=np.int64)
        if model_mask is None
        else np.asarray(model_mask, dtype=np.int64)
    )
    mem_a = np.zeros_like(cpu_a) if mem is None else np.asarray(mem, dtype=np.float64)
    labels: Sequence[Hashable] = [int(x) for x in mask_a] if label is None else label

    groups: dict[tuple[float, float, float, int, Hashable], list[int]] = {}
    for i in range(cpu_a.shape[0]):
        key = (float(cpu_a[i]), float(vram_a[i]), float(sm_a[i]), int(count_a[i]), labels[i])
        groups.setdefault(key, []).append(i)
    ranked = sorted(
        groups.items(),
        key=lambda kv: (len(kv[1]), kv[0][0], kv[0][1], kv[0][3], str(kv[0][4]), kv[0][2]),
        reverse=True,
    )
    total = cpu_a.shape[0]
    kept: list[tuple[tuple[float, float, float, int, Hashable], list[int]]] = []
    covered = 0
    for key, members in ranked:
        if covered >= coverage * total:
            break
        kept.append((key, members))
        covered += len(members)
    weight = np.array([len(m) for _, m in kept], dtype=np.float64)
    return TargetShapes.build(
        cpu=[k[0] for k, _ in kept],
        vram=[k[1] for k, _ in kept],
        sm=[k[2] for k, _ in kept],
        count=[k[3] for k, _ in kept],
        weight=weight / weight.sum(),
        model_mask=[int(mask_a[m[0]]) for _, m in kept],
        mem=[float(mem_a[m].mean()) for _, m in kept],
    )


def shape_access(node_model: ArrayLike, shapes: TargetShapes) -> BoolArray:
    """``[..., M]``: whether each node (by model index, -1 = no GPU) accepts each shape's model."""
    model = np.asarray(node_model, dtype=np.int64)
    bit = np.where(model >= 0, np.left_shift(1, np.maximum(model, 0)), 0)
    return np.bitwise_and(bit[..., None], shapes.model_mask) != 0


def gpu_idle(vram_free: ArrayLike, sm_free: ArrayLike) -> FloatArray:
    """Idle capacity of each GPU: the mean of its free memory and free SM shares."""
    return (np.asarray(vram_free, dtype=np.float64) + np.asarray(sm_free, dtype=np.float64)) / 2.0


def shape_fits(vram_free: ArrayLike, sm_free: ArrayLike, shapes: TargetShapes) -> BoolArray:
    """``[..., M, G]``: whether each GPU has room for one GPU's worth of each shape."""
    v = np.asarray(vram_free)[..., None, :]
    s = np.asarray(sm_free)[..., None, :]
    return (v >= shapes.vram[:, None]) & (s >= shapes.sm[:, None])


def fragment_stats(
    vram_free: ArrayLike, sm_free: ArrayLike, shapes: TargetShapes
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Per-shape GPU summary of each node.

    Returns ``(n_fit [..., M], stranded [..., M], idle [...])``: the number of GPUs that fit each
    shape, the idle capacity on the GPUs that do not, and the node's total idle capacity.
    """
    fits = shape_fits(vram_free, sm_free, shapes)
    idle_g = gpu_idle(vram_free, sm_free)
    n_fit = fits.sum(axis=-1, dtype=np.int64)
    stranded = np.einsum("...mg,...g->...m", ~fits, idle_g)
    return n_fit, stranded, idle_g.sum(axis=-1)


def usable(
    n_fit: ArrayLike,
    cpu_free: ArrayLike,
    access: ArrayLike,
    shapes: TargetShapes,
    mem_free: ArrayLike | None = None,
) -> BoolArray:
    """``[..., M]``: whether a request of each shape could be placed on the node right now."""
    cpu = np.asarray(cpu_free)[..., None]
    ok = (
        (shapes.count > 0)
        & np.asarray(access, dtype=bool)
        & (cpu >= shapes.cpu)
        & (np.asarray(n_fit) >= shapes.count)
    )
    if mem_free is not None:
        ok &= np.asarray(mem_free)[..., None] >= shapes.mem
    return ok


def fragment_by_shape_from_stats(
    n_fit: ArrayLike,
    stranded: ArrayLike,
    idle: ArrayLike,
    cpu_free: ArrayLike,
    access: ArrayLike,
    shapes: TargetShapes,
    mem_free: ArrayLike | None = None,
) -> FloatArray:
    """``[..., M]``: ``F(n, m)`` from the summary of :func:`fragment_stats`."""
    ok = usable(n_fit, cpu_free, access, shapes, mem_free)
    total = np.asarray(idle, dtype=np.float64)[..., None]
    return np.where(ok, np.asarray(stranded, dtype=np.float64), total)


def fragment_from_stats(
    n_fit: ArrayLike,
    stranded: ArrayLike,
    idle: ArrayLike,
    cpu_free: ArrayLike,
    access: ArrayLike,
    shapes: TargetShapes,
    mem_free: ArrayLike | None = None,
) -> FloatArray:
    """``[...]``: ``F(n) = sum_m weight[m] F(n, m)`` from the summary of :func:`fragment_stats`."""
    per_shape = fragment_by_shape_from_stats(
        n_fit, stranded, idle, cpu_free, access, shapes, mem_free
    )
    return per_shape @ shapes.weight


def fragment_by_shape(
    vram_free: ArrayLike,
    sm_free: ArrayLike,
    cpu_free: ArrayLike,
    access: ArrayLike,
    shapes: TargetShapes,
    mem_free: ArrayLike | None = None,
) -> FloatArray:
    """``[..., M]``: the fragment ``F(n, m)`` of each node for each shape."""
    n_fit, stranded, idle = fragment_stats(vram_free, sm_free, shapes)
    return fragment_by_shape_from_stats(n_fit, stranded, idle, cpu_free, access, shapes, mem_free)


def fragment(
    vram_free: ArrayLike,
    sm_free: ArrayLike,
    cpu_free: ArrayLike,
    access: ArrayLike,
    shapes: TargetShapes,
    mem_free: ArrayLike | None = None,
) -> FloatArray:
    """``[...]``: the expected fragment ``F(n)`` of each node under the target distribution.

    ``vram_free``/``sm_free`` are ``[..., G]``, ``cpu_free`` (and ``mem_free``) ``[...]``,
    ``access`` ``[..., M]`` (see :func:`shape_access`). Pass ``sm_free = vram_free`` for
    one-dimensional GPUs.
    """
    return fragment_by_shape(vram_free, sm_free, cpu_free, access, shapes, mem_free) @ shapes.weight


# --------------------------------------------------------------------------------------------
# Packing loss: how much of a GPU gap's value a slice wastes, priced by the request mix.
# --------------------------------------------------------------------------------------------
#
# Fragmentation (above) says how much idle capacity is unusable *now*. The packing loss looks
# further: if slices of the target mix keep arriving, which combinations ("patterns") fill a GPU
# best, and does putting this slice into this gap keep the GPU on such a pattern?
#
# The fluid bin-packing LP answers it: choose how many GPUs to fill with each pattern (a multiset
# of slice shapes that fits one GPU in both dimensions) to host the target mix with the fewest
# GPUs. Its dual prices ``price[m]`` are the number of GPUs each slice shape is worth in an
# optimal packing (e.g. 1.0 for a 0.81 slice that nothing but tiny slices can join, 0.5 for a 0.47
# slice that pairs with another). The value of a gap ``V(h)`` is the best total price of slices
# that fit into it (an unbounded knapsack with those prices), and ``V(whole GPU) = 1``. Putting a
# slice of shape ``m`` into a gap ``h`` loses ``V(h) - V(h - m) - price[m] >= 0`` GPUs: zero
# exactly when the slice completes or continues an optimal pattern. The LP is solved by column
# generation (OR-Tools GLOP for the master, a dynamic program over a grid of ``step`` thousandths
# for the knapsack pricing).


@dataclass(frozen=True)
class SlicePrices:
    """LP prices of a slice mix and the value table of GPU gaps (grid of ``step`` thousandths)."""

    vram: IntArray  # [S] slice shapes, in grid units
    sm: IntArray
    price: FloatArray  # [S] GPUs each slice shape is worth
    value: FloatArray  # [K+1, K+1] value of a gap (vram units, sm units)
    step: int
    gpus_per_slice_mix: float  # LP optimum: GPUs per unit of the mix's weight

    @property
    def grid(self) -> int:
        return int(self.value.shape[0] - 1)

    def price_of(self, vram: int, sm: int) -> float:
        """Price of one slice: its LP price, or the value of its own room if not in the mix."""
        a, b = vram // self.step, sm // self.step
        hit = np.flatnonzero((self.vram == a) & (self.sm == b))
        if hit.size:
            return float(self.price[hit[0]])
        return float(self.value[min(a, self.grid), min(b, self.grid)])


def _knapsack(vram: IntArray, sm: IntArray, price: FloatArray, grid: int) -> FloatArray:
    """``V[a, b]``: best total price of slices fitting a gap of ``(a, b)`` grid units."""
    value = np.zeros((grid + 1, grid + 1))
    if (vram == sm).all():  # one-dimensional mix: solve on the diagonal, then extend
        line = np.zeros(grid + 1)
        for h in range(1, grid + 1):
            best = line[h - 1]
            for v, p in zip(vram, price, strict=True):
                if 0 < v <= h:
                    best = max(best, line[h - v] + p)
            line[h] = best
        idx = np.arange(grid + 1)
        return line[np.minimum(idx[:, None], idx[None, :])]
    while True:  # each round may add one more slice to every gap
        new = value.copy()
        for v, s, p in zip(vram, sm, price, strict=True):
            if v <= grid and s <= grid and (v or s):
                new[v:, s:] = np.maximum(new[v:, s:], value[: grid + 1 - v, : grid + 1 - s] + p)
        new = np.maximum.accumulate(np.maximum.accumulate(new, axis=0), axis=1)
        if np.allclose(new, value, rtol=0.0, atol=1e-12):
            return new
        value = new


def _best_pattern(value: FloatArray, vram: IntArray, sm: IntArray, price: FloatArray) -> IntArray:
    """Slice counts of a pattern achieving ``value[K, K]`` (backtracking the knapsack)."""
    counts = np.zeros(vram.shape[0], dtype=np.int64)
    a = b = value.shape[0] - 1
    while a > 0 or b > 0:
        here = value[a, b]
        if a > 0 and np.isclose(value[a - 1, b], here, rtol=0.0, atol=1e-12):
            a -= 1
            continue
        if b > 0 and np.isclose(value[a, b - 1], here, rtol=0.0, atol=1e-12):
            b -= 1
            continue
        for i in range(vram.shape[0]):
            v, s = int(vram[i]), int(sm[i])
            if (
                (v or s)
                and v <= a
                and s <= b
                and np.isclose(value[a - v, b - s] + price[i], here, rtol=0.0, atol=1e-9)
            ):
                counts[i] += 1
                a, b = a - v, b - s
                break
        else:  # value is zero here: nothing more fits profitably
            break
    return counts


def slice_prices(
    vram: ArrayLike,
    sm: ArrayLike,
    weight: ArrayLike,
    *,
    capacity: int = 1000,
    step: int = 10,
    max_iterations: int = 500,
) -> SlicePrices:
    """LP dual prices of a slice mix: per-GPU shares ``vram``/``sm`` of `capacity`, rates `weight`.

    Shares are rounded up to the grid of `step`. Column generation from single-shape patterns;
    stops when no pattern is worth more than one GPU at the current prices.
    """
    from ortools.linear_solver import pywraplp

    grid = capacity // step
    v_units = np.minimum(np.ceil(np.asarray(vram, dtype=np.float64) / step), grid).astype(np.int64)
    s_units = np.minimum(np.ceil(np.asarray(sm, dtype=np.float64) / step), grid).astype(np.int64)
    rate = np.asarray(weight, dtype=np.float64)
    keys = sorted({(int(a), int(b)) for a, b in zip(v_units, s_units, strict=True)})
    sv = np.array([k[0] for k in keys], dtype=np.int64)
    ss = np.array([k[1] for k in keys], dtype=np.int64)
    demand = np.array(
        [rate[(v_units == a) & (s_units == b)].sum() for a, b in keys], dtype=np.float64
    )
    n = len(keys)
    if n == 0:
        return SlicePrices(sv, ss, np.zeros(0), np.zeros((grid + 1, grid + 1)), step, 0.0)
    patterns: list[IntArray] = []
    for i in range(n):
        single = np.zeros(n, dtype=np.int64)
        single[i] = max(1, grid // max(int(sv[i]), int(ss[i]), 1))
        patterns.append(single)
    for _ in range(max_iterations):
        solver = pywraplp.Solver.CreateSolver("GLOP")
        use = [solver.NumVar(0.0, solver.infinity(), f"p{j}") for j in range(len(patterns))]
        rows = [
            solver.Add(
                sum(int(p[i]) * use[j] for j, p in enumerate(patterns) if p[i]) >= float(demand[i])
            )
            for i in range(n)
        ]
        solver.Minimize(sum(use))
        solver.Solve()
        price = np.maximum(np.array([r.dual_value() for r in rows]), 0.0)
        value = _knapsack(sv, ss, price, grid)
        if value[grid, grid] <= 1.0 + 1e-9:
            total = float(solver.Objective().Value()) / max(float(demand.sum()), 1e-12)
            return SlicePrices(sv, ss, price, value, step, total)
        patterns.append(_best_pattern(value, sv, ss, price))
    raise RuntimeError("slice_prices: column generation did not converge")


def packing_loss(
    prices: SlicePrices,
    gap_vram: ArrayLike,
    gap_sm: ArrayLike,
    vram: int,
    sm: int,
) -> FloatArray:
    """GPUs' worth of packing lost by putting a ``(vram, sm)`` slice into each gap (>= 0 if fits).

    ``gap_vram``/``gap_sm`` are free shares (same unit as `slice_prices`'s `capacity`) of any shape;
    gaps smaller than the slice give meaningless values and must be masked by the caller.
    """
    k = prices.grid
    step = prices.step
    a = np.clip(np.asarray(gap_vram) // step, 0, k).astype(np.int64)
    b = np.clip(np.asarray(gap_sm) // step, 0, k).astype(np.int64)
    da, db = -(-vram // step), -(-sm // step)
    after = prices.value[np.clip(a - da, 0, k), np.clip(b - db, 0, k)]
    return prices.value[a, b] - after - prices.price_of(vram, sm)


def stranded_idle(idle: ArrayLike, host_free: ArrayLike, need_per_idle: float) -> FloatArray:
    """Idle GPU capacity that lacks its share of a host resource (CPU or memory).

    A node whose idle GPU capacity ``idle`` would need ``need_per_idle`` of the host resource per
    unit to be usable by the typical request, but has only ``host_free``, strands
    ``min(idle, (need_per_idle * idle - host_free) / need_per_idle)`` of it.
    """
    if need_per_idle <= 0:
        return np.zeros(np.shape(idle))
    idle_a = np.asarray(idle, dtype=np.float64)
    short = np.maximum(0.0, need_per_idle * idle_a - np.asarray(host_free, dtype=np.float64))
    return np.minimum(idle_a, short / need_per_idle)
