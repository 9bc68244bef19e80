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
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from scheduler import scoring
from scheduler.cycle import IntArray
from scheduler.jobs import Job, Kind, Shape
from scheduler.ledger import Ledger
from scheduler.snapshot import WorkloadShape

FloatArray = npt.NDArray[np.float64]

FRAG_SCALE = 1000  # one whole GPU of fragmentation = 1000 score points
PACK_SCALE = 10  # an empty node or GPU left behind = 10 score points


@dataclass(frozen=True, eq=False)
class ShapeMix:
    """The target distribution of GPU request shapes, as arrays (weights sum to 1)."""

    weight: FloatArray
    gpus: IntArray  # > 0: whole-GPU shape
    vram_mib: IntArray  # slice shapes
    sm_pct: IntArray
    cpu_milli: IntArray
    memory_mib: IntArray
    _targets: dict[int, scoring.TargetShapes] = field(default_factory=dict, repr=False)

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
            cpu_milli=np.array([s.cpu_milli for s in gpu_shapes], dtype=np.int64),
            memory_mib=np.array([s.memory_mib for s in gpu_shapes], dtype=np.int64),
        )

    def target(self, gpu_vram_mib: int) -> scoring.TargetShapes:
        """The shapes in thousandths of one GPU with ``gpu_vram_mib`` of VRAM (1000 = whole)."""
        if gpu_vram_mib not in self._targets:
            whole = self.gpus > 0
            self._targets[gpu_vram_mib] = scoring.TargetShapes.build(
                cpu=self.cpu_milli,
                mem=self.memory_mib,
                vram=np.where(whole, 1000.0, 1000.0 * self.vram_mib / gpu_vram_mib),
                sm=np.where(whole, 1000.0, 10.0 * self.sm_pct),
                count=np.where(whole, self.gpus, 1),
                weight=self.weight,
            )
        return self._targets[gpu_vram_mib]


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
            cpu_milli=g.shape.cpu_milli,
            memory_mib=g.shape.memory_mib,
        )
        for j in jobs
        for g in j.groups
    ]
    return ShapeMix.of(shapes)


@dataclass(frozen=True)
class Rows:
    """The state of some nodes: their GPUs as (nodes, GPUs) matrices, and their CPU and memory."""

    free_vram: IntArray
    free_sm: IntArray
    vram: IntArray
    cpu: IntArray
    mem: IntArray


def node_fragmentation(rows: Rows, mix: ShapeMix) -> FloatArray:
    """Expected fragmentation of each node, in GPUs: ``scheduler.scoring.fragment`` (the FGD
    measure in two dimensions) on the free VRAM and SM of each GPU as thousandths of that GPU,
    against the target shapes. GPU-model constraints of the shapes are not modelled (every node
    accepts every shape); padding columns and unhealthy GPUs count as no capacity."""
    node_vram = rows.vram.max(axis=1, initial=0)
    frag = np.zeros(len(node_vram), dtype=np.float64)
    for size in np.unique(node_vram[node_vram > 0]).tolist():
        at = node_vram == size
        access = np.ones((int(at.sum()), len(mix.weight)), dtype=bool)
        frag[at] = scoring.fragment(
            1000.0 * rows.free_vram[at] / size,
            10.0 * rows.free_sm[at],
            rows.cpu[at],
            access,
            mix.target(int(size)),
            rows.mem[at],
        )
    return frag / 1000.0


def _rows(ledger: Ledger, nodes: IntArray) -> Rows:
    cycle = ledger.cycle
    idx = cycle.node_gpus[nodes]
    pad = idx < 0
    safe = np.where(pad, 0, idx)
    usable = ~pad & cycle.gpu_healthy[safe]
    return Rows(
        free_vram=np.where(usable, ledger.vram[safe], 0),
        free_sm=np.where(usable, ledger.sm[safe], 0),
        vram=np.where(pad, 0, cycle.gpu_vram[safe]),
        cpu=ledger.cpu[nodes].copy(),
        mem=ledger.mem[nodes].copy(),
    )


def _taking(rows: Rows, cpu_milli: int, memory_mib: int) -> Rows:
    return replace(rows, cpu=rows.cpu - cpu_milli, mem=rows.mem - memory_mib)


def whole_scores(ledger: Ledger, nodes: IntArray, shape: Shape, mix: ShapeMix) -> IntArray:
    """Score of one pod taking ``shape.gpus`` pristine GPUs on each node (lower is better)."""
    if len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)
    rows = _rows(ledger, nodes)
    before = node_fragmentation(rows, mix)
    pristine = (rows.vram > 0) & (rows.free_vram == rows.vram) & (rows.free_sm == 100)
    taken = pristine & (np.cumsum(pristine, axis=1) <= shape.gpus)
    after_rows = replace(
        _taking(rows, shape.cpu_milli, shape.memory_mib),
        free_vram=np.where(taken, 0, rows.free_vram),
        free_sm=np.where(taken, 0, rows.free_sm),
    )
    after = node_fragmentation(after_rows, mix)
    count = np.maximum(ledger.cycle.node_gpu_count[nodes], 1)
    left = (ledger.whole[nodes] - shape.gpus) / count
    return np.rint(FRAG_SCALE * (after - before) + PACK_SCALE * left).astype(np.int64)


def slice_scores(ledger: Ledger, gpus: IntArray, shape: Shape, mix: ShapeMix) -> IntArray:
    """Score of one slice of the shape on each GPU (lower is better)."""
    if len(gpus) == 0:
        return np.zeros(0, dtype=np.int64)
    cycle = ledger.cycle
    nodes = cycle.gpu_node[gpus]
    rows = _rows(ledger, nodes)
    before = node_fragmentation(rows, mix)
    column = gpus - cycle.node_gpu_start[nodes]
    at = np.arange(len(gpus))
    after_rows = replace(
        _taking(rows, shape.cpu_milli, shape.memory_mib),
        free_vram=rows.free_vram.copy(),
        free_sm=rows.free_sm.copy(),
    )
    after_rows.free_vram[at, column] -= shape.vram_mib
    after_rows.free_sm[at, column] -= shape.sm_pct
    after = node_fragmentation(after_rows, mix)
    vram_left = after_rows.free_vram[at, column] / cycle.gpu_vram[gpus]
    left = (vram_left + after_rows.free_sm[at, column] / 100.0) / 2
    return np.rint(FRAG_SCALE * (after - before) + PACK_SCALE * left).astype(np.int64)


def cpu_scores(ledger: Ledger, nodes: IntArray, shape: Shape, mix: ShapeMix) -> IntArray:
    """Score of one CPU-only pod on each node: the fragmentation its CPU and memory cause
    (GPUs stranded without CPU), then packing."""
    if len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)
    rows = _rows(ledger, nodes)
    before = node_fragmentation(rows, mix)
    after = node_fragmentation(_taking(rows, shape.cpu_milli, shape.memory_mib), mix)
    alloc = np.maximum(ledger.cycle.node_cpu_alloc[nodes], 1)
    left = (ledger.cpu[nodes] - shape.cpu_milli) / alloc
    return np.rint(FRAG_SCALE * (after - before) + PACK_SCALE * left).astype(np.int64)


def score(ledger: Ledger, shape: Shape, targets: IntArray, mix: ShapeMix) -> IntArray:
    """Score of one pod of the shape on each target (nodes; GPUs for a slice). Lower is better."""
    if shape.kind is Kind.WHOLE:
        return whole_scores(ledger, targets, shape, mix)
    if shape.kind is Kind.SLICE:
        return slice_scores(ledger, targets, shape, mix)
    return cpu_scores(ledger, targets, shape, mix)
