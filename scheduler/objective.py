"""Score stage: what one placement costs in the objective's lower tiers.

The objective, in priority order (each tier outweighs the ones below it, see ``cpsat.py``):

1. placed demand, weighted by priority rank (maximised);
2. topology cost of gangs (minimised, see ``TopologyCosts``);
3. fragmentation of what remains (minimised): the growth of the pool's FGD-style fragmentation
   when the pod lands there, against the recent distribution of request shapes;
4. packing (minimised): prefer fuller nodes and GPUs so whole ones stay whole.

Tiers 3 and 4 are folded into one integer *score* per (pod shape, node) or (slice, GPU), used as
the greedy stage's choice and as CP-SAT's linear objective coefficient. The score is the change
for ONE pod on the snapshot as given; several pods on one node are scored independently (a
linear model of a convex cost, accurate enough for ranking and keeps the model linear).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.cycle import IntArray
from scheduler.jobs import Job, Kind, Shape
from scheduler.ledger import Ledger
from scheduler.snapshot import WorkloadShape

FloatArray = npt.NDArray[np.float64]

FRAG_SCALE = 1000  # one whole GPU of fragmentation = 1000 score points
PACK_SCALE = 10  # an empty node or GPU left behind = 10 score points
# A CPU-only pod on a node with free GPUs strands them a little: charged per share of the CPU.
CPU_ON_GPU_NODE = 200


@dataclass(frozen=True)
class ShapeMix:
    """The target distribution of request shapes, as arrays (weights sum to 1)."""

    weight: FloatArray
    gpus: IntArray  # > 0: whole-GPU shape
    vram_mib: IntArray  # slice shapes
    sm_pct: IntArray

    @classmethod
    def of(cls, shapes: Sequence[WorkloadShape]) -> ShapeMix:
        gpu_shapes = [s for s in shapes if s.weight > 0 and (s.gpus > 0 or s.sm_pct > 0)]
        if not gpu_shapes:
            gpu_shapes = [WorkloadShape(weight=1.0, gpus=1)]
        w = np.array([s.weight for s in gpu_shapes], dtype=np.float64)
        return cls(
            weight=w / w.sum(),
            gpus=np.array([s.gpus for s in gpu_shapes], dtype=np.int64),
            vram_mib=np.array([s.vram_mib for s in gpu_shapes], dtype=np.int64),
            sm_pct=np.array([s.sm_pct for s in gpu_shapes], dtype=np.int64),
        )


def workload_mix(workload: Sequence[WorkloadShape], jobs: Sequence[Job]) -> ShapeMix:
    """The snapshot's recent workload, or else the shapes of this batch."""
    if workload:
        return ShapeMix.of(workload)
    shapes = [
        WorkloadShape(
            weight=float(g.count),
            gpus=g.shape.gpus,
            vram_mib=g.shape.vram_mib,
            sm_pct=g.shape.sm_pct,
        )
        for j in jobs
        for g in j.groups
    ]
    return ShapeMix.of(shapes)


def node_fragmentation(
    free_vram: IntArray, free_sm: IntArray, vram: IntArray, mix: ShapeMix
) -> FloatArray:
    """Expected fragmentation of each row of GPUs (one row per node), in GPUs.

    A GPU's free capacity is a fragment for a shape when that shape cannot use it: a slice shape
    needs the VRAM and the SM % on one GPU; a whole-GPU shape needs pristine GPUs, and enough of
    them on the node. The result weighs each shape by its share of the workload (as FGD does),
    with a GPU's free amount the mean of its free VRAM and SM fractions. Padding columns (VRAM 0)
    and unhealthy GPUs (pass free 0) count as nothing.
    """
    has = vram > 0
    amount = np.where(has, (free_vram / np.maximum(vram, 1) + free_sm / 100.0) / 2.0, 0.0)
    pristine = has & (free_vram == vram) & (free_sm == 100)
    total = amount.sum(axis=1)
    count = pristine.sum(axis=1)
    whole = mix.gpus > 0
    # Whole-GPU shapes: the partly used GPUs, or everything when too few GPUs are pristine.
    frag_whole = np.where(
        count[:, None] >= mix.gpus[whole][None, :], (total - count)[:, None], total[:, None]
    )
    # Slice shapes: every GPU whose free VRAM or SM is too small for the slice.
    unusable = (free_vram[:, :, None] < mix.vram_mib[~whole][None, None, :]) | (
        free_sm[:, :, None] < mix.sm_pct[~whole][None, None, :]
    )
    frag_slice = (amount[:, :, None] * unusable).sum(axis=1)
    return frag_whole @ mix.weight[whole] + frag_slice @ mix.weight[~whole]


def _rows(ledger: Ledger, nodes: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Free VRAM, free SM and VRAM of the nodes' GPUs as (nodes, GPUs) matrices."""
    cycle = ledger.cycle
    idx = cycle.node_gpus[nodes]
    pad = idx < 0
    safe = np.where(pad, 0, idx)
    usable = ~pad & cycle.gpu_healthy[safe]
    free_vram = np.where(usable, ledger.vram[safe], 0)
    free_sm = np.where(usable, ledger.sm[safe], 0)
    vram = np.where(pad, 0, cycle.gpu_vram[safe])
    return free_vram, free_sm, vram


def whole_scores(ledger: Ledger, nodes: IntArray, gpus: int, mix: ShapeMix) -> IntArray:
    """Score of one pod taking ``gpus`` pristine GPUs on each node (lower is better)."""
    if len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)
    free_vram, free_sm, vram = _rows(ledger, nodes)
    before = node_fragmentation(free_vram, free_sm, vram, mix)
    pristine = (vram > 0) & (free_vram == vram) & (free_sm == 100)
    taken = pristine & (np.cumsum(pristine, axis=1) <= gpus)
    after = node_fragmentation(
        np.where(taken, 0, free_vram), np.where(taken, 0, free_sm), vram, mix
    )
    count = np.maximum(ledger.cycle.node_gpu_count[nodes], 1)
    left = (ledger.whole[nodes] - gpus) / count
    return np.rint(FRAG_SCALE * (after - before) + PACK_SCALE * left).astype(np.int64)


def slice_scores(
    ledger: Ledger, gpus: IntArray, vram_mib: int, sm_pct: int, mix: ShapeMix
) -> IntArray:
    """Score of one slice on each GPU (lower is better)."""
    if len(gpus) == 0:
        return np.zeros(0, dtype=np.int64)
    cycle = ledger.cycle
    nodes = cycle.gpu_node[gpus]
    free_vram, free_sm, vram = _rows(ledger, nodes)
    before = node_fragmentation(free_vram, free_sm, vram, mix)
    column = gpus - cycle.node_gpu_start[nodes]
    rows = np.arange(len(gpus))
    free_vram[rows, column] -= vram_mib
    free_sm[rows, column] -= sm_pct
    after = node_fragmentation(free_vram, free_sm, vram, mix)
    left = (free_vram[rows, column] / cycle.gpu_vram[gpus] + free_sm[rows, column] / 100.0) / 2
    return np.rint(FRAG_SCALE * (after - before) + PACK_SCALE * left).astype(np.int64)


def cpu_scores(ledger: Ledger, nodes: IntArray, cpu_milli: int, memory_mib: int) -> IntArray:
    """Score of one CPU-only pod on each node: pack, and keep CPU beside free GPUs."""
    cycle = ledger.cycle
    alloc = np.maximum(cycle.node_cpu_alloc[nodes], 1)
    left = (ledger.cpu[nodes] - cpu_milli) / alloc
    strands = (ledger.whole[nodes] > 0) * cpu_milli / alloc
    return np.rint(CPU_ON_GPU_NODE * strands + PACK_SCALE * left).astype(np.int64)


def score(ledger: Ledger, shape: Shape, targets: IntArray, mix: ShapeMix) -> IntArray:
    """Score of one pod of the shape on each target (nodes; GPUs for a slice). Lower is better."""
    if shape.kind is Kind.WHOLE:
        return whole_scores(ledger, targets, shape.gpus, mix)
    if shape.kind is Kind.SLICE:
        return slice_scores(ledger, targets, shape.vram_mib, shape.sm_pct, mix)
    return cpu_scores(ledger, targets, shape.cpu_milli, shape.memory_mib)
