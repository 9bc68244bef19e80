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
