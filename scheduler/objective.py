"""Score stage: how good one placement is, as one sortable integer key per target.

The objective, in priority order:

1. placed demand, weighted by priority rank (maximised);
2. topology cost of gangs (minimised, see ``TopologyCosts``);
3. the *placement rank* of each pod's target (minimised), below.

The placement rank is the rule the openb trace replay measures (``bench/openb/tessera.py``): the
candidates of a pod are ranked lexicographically by

1. **model reservation** (pods using GPUs): requests restricted to some GPU models (the shapes
   of the workload with ``gpu_models``) put an expected load on each model; while a model's idle
   capacity is below ``RESERVE_FACTOR`` times its share of that load still to come, its nodes
   come last, so flexible requests leave scarce models to the requests that can only run there;
2. **packing loss** (slices): the GPUs' worth of packing efficiency lost by putting the slice in
   the GPU's gap, priced by the LP dual prices of the workload's slice mix
   (:func:`scoring.packing_loss`, :func:`scoring.slice_prices`): a slice goes where it completes
   or continues an optimal pattern;
3. **host stranding**: the increase of the node's idle GPU capacity that lacks its share of CPU
   (the workload's CPU per GPU, :func:`scoring.stranded_idle`);
4. **FGD class**: ``100 - int(100 * sigmoid(-dF / 1000))`` with ``dF`` the growth of the node's
   fragment (:func:`scoring.fragment`, in thousandths of a GPU, against the workload's shapes
   and their model constraints). The coarse integer class is on purpose: ties are left to
   the node order below, which consolidates load (first-fit; ranking by the exact growth
   spreads load and measured much worse in the replay);
5. for CPU-only pods, the node's idle GPU capacity (prefer nodes whose GPUs are in use);
6. a pseudo-random **node order** fixed by the solver's seed;
7. for slices, on the chosen node: a partly used GPU before a pristine one (whole GPUs stay
   whole), then the GPU's position.

Each criterion is quantised and the key packs them into one int64 (comparable only between
targets of one shape). The greedy stage takes the smallest key; CP-SAT gets the *rank* of each
candidate's key among the group's candidates as its objective coefficient.

The keys depend on the snapshot and the ledger (reservation depends on the whole pool's idle
capacity). The expensive part, the FGD class, is cached per shape in ``CycleState.memo`` with the
free amounts each value was computed for, so it is recomputed only for nodes whose free amounts
changed, also across the snapshots derived with ``Snapshot.with_free``. The targets of one node
(what the greedy stage re-ranks after every placement) are ranked in plain Python
(``Ranking.node_keys``, ``onenode``), with the same numbers.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt

# The LP of the slice prices (scoring.slice_prices) needs OR-Tools' linear solver: load it with
# the solver rather than inside the first scheduling cycle that meets a slice.
from ortools.linear_solver import pywraplp  # noqa: F401

from scheduler import onenode, scoring
from scheduler.cycle import BoolArray, CycleState, IntArray
from scheduler.jobs import Job, Kind, Shape
from scheduler.ledger import Ledger
from scheduler.snapshot import Snapshot, WorkloadShape

FloatArray = npt.NDArray[np.float64]

MILLI = 1000  # a whole GPU, in thousandths
RESERVE_FACTOR = 3.0  # safety factor of the model reservation
LOSS_STEP = 0.01  # resolution of the packing loss, GPUs
STRAND_STEP = 100.0  # resolution of the stranding increase, GPU thousandths
IDLE_STEP = 5.0  # resolution of a node's idle GPU capacity (CPU-only pods), GPU thousandths

# Bits of each criterion in the packed key.
_LOSS_BITS = 10
_STRAND_BITS = 9
_FGD_BITS = 7
_IDLE_BITS = 12
_RANK_BITS = 20
_GPU_BITS = 5
_NO_KEY = (1 << 63) - 1
# FGD classes of at most this many targets are computed node by node in plain Python
# (``onenode``, a few microseconds a target), of more vectorised (a few hundred microseconds a
# call, a microsecond or two a target).
PLAIN_TARGETS = 48


@dataclass(frozen=True, eq=False)
class ShapeMix:
    """The target distribution of request shapes, as arrays (weights sum to 1)."""

    weight: FloatArray
    gpus: IntArray  # > 0: whole-GPU shape
    vram_mib: IntArray  # slice shapes
    sm_pct: IntArray
    cpu_milli: IntArray
    memory_mib: IntArray
    gpu_models: tuple[frozenset[str], ...]
    _targets: dict[tuple[int, tuple[tuple[str, int], ...]], scoring.TargetShapes] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(cls, shapes: Sequence[WorkloadShape]) -> ShapeMix:
        kept = [s for s in shapes if s.weight > 0]
        if not any(s.gpus > 0 or s.sm_pct > 0 for s in kept):
            kept = [WorkloadShape(weight=1.0, gpus=1)]
        w = np.array([s.weight for s in kept], dtype=np.float64)
        return cls(
            weight=w / w.sum(),
            gpus=np.array([s.gpus for s in kept], dtype=np.int64),
            vram_mib=np.array([s.vram_mib for s in kept], dtype=np.int64),
            sm_pct=np.array([s.sm_pct for s in kept], dtype=np.int64),
            cpu_milli=np.array([s.cpu_milli for s in kept], dtype=np.int64),
            memory_mib=np.array([s.memory_mib for s in kept], dtype=np.int64),
            gpu_models=tuple(s.gpu_models for s in kept),
        )

    def target(
        self, gpu_vram_mib: int, model_ids: dict[str, int] | None = None
    ) -> scoring.TargetShapes:
        """The shapes in thousandths of one GPU with ``gpu_vram_mib`` of VRAM (1000 = whole),
        with model masks over ``model_ids`` (bit ``i`` = model id ``i``; no ids: any model)."""
        ids = tuple(sorted((model_ids or {}).items()))
        key = (gpu_vram_mib, ids)
        if key not in self._targets:
            whole = self.gpus > 0
            lookup = dict(ids)
            masks = [
                scoring.ANY_MODEL
                if not models or not lookup
                else sum(1 << lookup[m] for m in models if m in lookup)
                for models in self.gpu_models
            ]
            self._targets[key] = scoring.TargetShapes.build(
                cpu=self.cpu_milli,
                mem=self.memory_mib,
                vram=np.where(whole, 1000.0, 1000.0 * self.vram_mib / gpu_vram_mib),
                sm=np.where(whole, 1000.0, 10.0 * self.sm_pct),
                count=np.where(whole, self.gpus, np.where(self.sm_pct > 0, 1, 0)),
                weight=self.weight,
                model_mask=np.array(masks, dtype=np.int64),
            )
        return self._targets[key]


def workload_shapes(
    workload: Sequence[WorkloadShape], jobs: Sequence[Job]
) -> tuple[WorkloadShape, ...]:
    """The snapshot's recent workload, or else the shapes of this batch."""
    if workload:
        return tuple(workload)
    return tuple(
        WorkloadShape(
            weight=float(g.count),
            gpus=g.shape.gpus,
            vram_mib=g.shape.vram_mib,
            sm_pct=g.shape.sm_pct,
            cpu_milli=g.shape.cpu_milli,
            memory_mib=g.shape.memory_mib,
            gpu_models=g.shape.gpu_models,
        )
        for j in jobs
        for g in j.groups
    )


def workload_mix(workload: Sequence[WorkloadShape], jobs: Sequence[Job]) -> ShapeMix:
    """The mix of the snapshot's recent workload, or else of the shapes of this batch."""
    return ShapeMix.of(workload_shapes(workload, jobs))


def ranking_for(
    cycle: CycleState, workload: Sequence[WorkloadShape], jobs: Sequence[Job], seed: int
) -> Ranking:
    """The placement rank of one solve; the mix (and the caches keyed by it) is shared by the
    solves on this cycle state and those derived from it with the same workload."""
    shapes = workload_shapes(workload, jobs)
    key = ("mix", shapes)
    hit = cycle.memo.get(key)
    if hit is None:
        hit = cycle.memo[key] = (ShapeMix.of(shapes), ("mix-id", len(cycle.memo)))
    mix, mix_id = hit
    return Ranking(cycle, mix, mix_id, seed)


# -- the measures --------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _prices(
    vram: tuple[int, ...], sm: tuple[int, ...], weight: tuple[float, ...]
) -> scoring.SlicePrices:
    return scoring.slice_prices(vram, sm, weight)


def slice_mix_prices(target: scoring.TargetShapes) -> scoring.SlicePrices:
    """LP prices of the target's slice shapes (one GPU, less than a whole one)."""
    share = (target.count == 1) & (np.maximum(target.vram, target.sm) < MILLI)
    return _prices(
        tuple(int(np.ceil(x)) for x in target.vram[share]),
        tuple(int(np.ceil(x)) for x in target.sm[share]),
        tuple(float(x) for x in target.weight[share]),
    )


def cpu_per_gpu(target: scoring.TargetShapes) -> float:
    """Milli-CPU the target's GPU requests ask per thousandth of a GPU."""
    gpu = target.count > 0
    demand = target.weight[gpu] * target.count[gpu] * (target.vram[gpu] + target.sm[gpu]) / 2.0
    return float((target.weight[gpu] * target.cpu[gpu]).sum() / max(demand.sum(), 1e-12))


def model_load(target: scoring.TargetShapes, model_gpus: FloatArray) -> FloatArray:
    """Per GPU model: constrained demand when the arrived demand equals the pool's capacity, as
    a fraction of the model's capacity. A constrained shape's demand is spread over the models
    it accepts in proportion to their GPUs; unconstrained shapes load no model."""
    n_models = len(model_gpus)
    every = (1 << n_models) - 1
    per_request = target.weight * target.count * (target.vram + target.sm) / 2.0
    load = np.zeros(n_models)
    for m in range(target.size):
        mask = int(target.model_mask[m]) & every
        if target.count[m] == 0 or mask == every:
            continue
        allowed = [k for k in range(n_models) if mask >> k & 1]
        load[allowed] += per_request[m] / max(float(model_gpus[allowed].sum()), 1.0)
    requests_at_capacity = model_gpus.sum() * MILLI / max(float(per_request.sum()), 1e-12)
    return load * requests_at_capacity / MILLI


def fgd_class(delta: FloatArray) -> IntArray:
    """``100 - FGD score`` of a fragment growth ``delta`` (thousandths of a GPU): 0 is best."""
    score = np.trunc(100.0 / (1.0 + np.exp(np.clip(delta, -50_000, 50_000) / 1000.0)))
    return (100 - score).astype(np.int64)


def node_order(cycle: CycleState, seed: int) -> IntArray:
    """Rank of every node in a pseudo-random order fixed by ``seed`` (and the node names, so
    a node keeps its place when others come and go)."""
    key = ("node-order", seed)
    if key not in cycle.memo:
        h = np.array(
            [zlib.crc32(f"{seed}/{name}".encode()) for name in cycle.node_names], dtype=np.int64
        )
        order = np.lexsort((np.arange(cycle.n_nodes), h))
        rank = np.empty(cycle.n_nodes, dtype=np.int64)
        rank[order] = np.arange(cycle.n_nodes, dtype=np.int64)
        cycle.memo[key] = rank
    rank_: IntArray = cycle.memo[key]
    return rank_


@dataclass(frozen=True)
class Rows:
    """The state of some nodes: their GPUs as (nodes, GPUs) matrices, and their CPU and memory."""

    free_vram: IntArray
    free_sm: IntArray
    vram: IntArray
    cpu: IntArray
    mem: IntArray


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


class Ranking:
    """The placement rank of one solve: the mix's derived measures, the node order, and the
    per-shape caches (see the module docstring)."""

    def __init__(self, cycle: CycleState, mix: ShapeMix, mix_key: Hashable, seed: int) -> None:
        self.cycle = cycle
        self.mix = mix
        self.mix_key = mix_key
        self.rank = node_order(cycle, seed)
        self.model_ids = dict(cycle.model_ids)
        sizes = np.unique(cycle.node_vram[cycle.node_vram > 0]).tolist()
        self.targets = {int(s): mix.target(int(s), self.model_ids) for s in sizes}
        self.cpu_per_idle = np.zeros(cycle.n_nodes)
        for size, target in self.targets.items():
            self.cpu_per_idle[cycle.node_vram == size] = cpu_per_gpu(target)
        n_models = len(self.model_ids)
        self.node_model = np.maximum(cycle.node_model, 0)
        usable = cycle.gpu_healthy
        model_gpus = np.bincount(
            self.node_model[cycle.gpu_node[usable]], minlength=n_models
        ).astype(np.float64)
        self.model_cap = model_gpus * MILLI
        reference = self.targets[max(self.targets)] if self.targets else None
        self.load = model_load(reference, model_gpus) if reference is not None else np.zeros(0)
        self.capacity = float(usable.sum()) * MILLI
        self.gpu_column = (
            np.arange(cycle.n_gpus, dtype=np.int64) - cycle.node_gpu_start[cycle.gpu_node]
        )
        self._loss: dict[tuple[int, int, int], IntArray] = {}
        self._plain_mixes: dict[int, onenode.PlainMix] = {}
        self._protected: tuple[weakref.ref[Ledger], int, BoolArray] | None = None
        self.reserving = bool(len(self.load) and self.load.any())  # any model may be reserved
        self._never = np.zeros(len(self.load), dtype=bool)
        self._idle_ledger: Ledger | None = None
        self._idle_changes = -1
        self._idle_cache: tuple[FloatArray, FloatArray] = (np.zeros(0), np.zeros(0))

    # -- pool-wide state ------------------------------------------------------------------------
    def gpu_idle(self, ledger: Ledger) -> FloatArray:
        """Idle capacity of every GPU, thousandths: the mean of its free VRAM and SM shares."""
        return self._idle(ledger)[0]

    def node_idle(self, ledger: Ledger, nodes: IntArray) -> FloatArray:
        """Idle GPU capacity of each node, thousandths of a GPU."""
        out: FloatArray = self._idle(ledger)[1][nodes]
        return out

    def _idle(self, ledger: Ledger) -> tuple[FloatArray, FloatArray]:
        """GPU and node idle capacity of the ledger as it stands: kept until the ledger changes,
        then recomputed for the nodes it changed."""
        if self._idle_ledger is ledger and self._idle_changes == ledger.changes:
            return self._idle_cache
        cycle = self.cycle

        def idle_of(g: IntArray | slice) -> FloatArray:
            raw = MILLI * ledger.vram[g] / np.maximum(cycle.gpu_vram[g], 1) + 10.0 * ledger.sm[g]
            return np.where(cycle.gpu_healthy[g], raw / 2.0, 0.0)

        changed = ledger.changed_since(self._idle_changes) if self._idle_ledger is ledger else None
        if changed is not None and len(changed) <= 64:
            idle, nodes = self._idle_cache
            if len(changed) == 1:  # after each placement: ``idle_of`` in plain Python (the
                # same elementwise operations), the node's sum by numpy on the same padded row
                node = changed[0]
                layout = self._layout()
                start = layout.start[node]
                end = start + layout.count[node]
                gpus = [
                    (MILLI * v / max(size, 1) + 10.0 * s) / 2.0 if ok else 0.0
                    for v, s, size, ok in zip(
                        ledger.vram[start:end].tolist(),
                        ledger.sm[start:end].tolist(),
                        layout.vram[start:end],
                        layout.healthy[start:end],
                        strict=True,
                    )
                ]
                idle[start:end] = gpus
                row = np.zeros((1, layout.width))  # as below: the node's row, padded with 0
                row[0, : len(gpus)] = gpus
                nodes[node] = row.sum(axis=1)[0]
            else:
                idx = cycle.node_gpus[changed]
                g = idx[idx >= 0]
                idle[g] = idle_of(g)
                nodes[changed] = np.where(idx >= 0, idle[np.maximum(idx, 0)], 0.0).sum(axis=1)
        else:
            idle = idle_of(slice(None))
            per_node = np.bincount(cycle.gpu_node, weights=idle, minlength=cycle.n_nodes)
            self._idle_cache = (idle, per_node.astype(np.float64))
        self._idle_ledger = ledger
        self._idle_changes = ledger.changes
        return self._idle_cache

    def protected(self, ledger: Ledger) -> BoolArray:
        """Per model: reserved for the requests constrained to it (see the module docstring).
        Kept until the ledger changes (it is asked for after every placement). Do not modify."""
        if not self.reserving:
            return self._never
        last = self._protected
        if last is not None and last[0]() is ledger and last[1] == ledger.changes:
            return last[2]
        idle = self.gpu_idle(ledger)
        model_idle = np.bincount(
            self.node_model[self.cycle.gpu_node], weights=idle, minlength=len(self.load)
        )
        left = max(0.0, float(idle.sum()) / max(self.capacity, 1.0))
        reserved: BoolArray = model_idle < RESERVE_FACTOR * self.load * self.model_cap * left
        self._protected = (weakref.ref(ledger), ledger.changes, reserved)
        return reserved

    # -- criteria -------------------------------------------------------------------------------
    def _strand(
        self, ledger: Ledger, nodes: IntArray, gpu_taken: FloatArray, cpu_taken: int
    ) -> IntArray:
        """Quantised increase of each node's CPU-stranded idle GPU capacity."""
        k = self.cpu_per_idle[nodes]
        idle = self.node_idle(ledger, nodes)
        cpu = ledger.cpu[nodes].astype(np.float64)

        def stranded(idle_: FloatArray, cpu_: FloatArray) -> FloatArray:
            short = np.maximum(0.0, k * idle_ - cpu_)
            return np.where(k > 0, np.minimum(idle_, short / np.where(k > 0, k, 1.0)), 0.0)

        delta = stranded(idle - gpu_taken, cpu - cpu_taken) - stranded(idle, cpu)
        return np.rint(delta / STRAND_STEP).astype(np.int64)

    def _loss_table(self, size: int, vram: int, sm: int) -> IntArray:
        """Quantised packing loss of a (vram, sm) slice (thousandths) for every gap of the grid."""
        key = (size, vram, sm)
        table = self._loss.get(key)
        if table is None:
            memo_key = ("loss", self.mix_key, key)
            table = self.cycle.memo.get(memo_key)
            if table is None:
                prices = slice_mix_prices(self.targets[size])
                grid = np.arange(prices.grid + 1) * prices.step
                loss = scoring.packing_loss(prices, grid[:, None], grid[None, :], vram, sm)
                table = np.clip(np.rint(loss / LOSS_STEP), 0, (1 << _LOSS_BITS) - 1)
                table = table.astype(np.int64).ravel()
                self.cycle.memo[memo_key] = table
            self._loss[key] = table
        return table

    def _slice_loss(self, ledger: Ledger, shape: Shape, gpus: IntArray) -> IntArray:
        cycle = self.cycle
        step = 10  # the grid of scoring.slice_prices
        width = MILLI // step + 1
        sizes = cycle.gpu_vram[gpus]
        free_v = np.minimum(MILLI * ledger.vram[gpus] // np.maximum(sizes, 1), MILLI)
        free_s = np.minimum(10 * ledger.sm[gpus], MILLI)
        gap = (free_v // step) * width + free_s // step
        if len(self.targets) == 1:
            [size] = self.targets
            v = -(-MILLI * shape.vram_mib // size)
            one: IntArray = self._loss_table(size, int(v), 10 * shape.sm_pct)[gap]
            return one
        out = np.zeros(len(gpus), dtype=np.int64)
        for size in self.targets:
            at = sizes == size
            v = -(-MILLI * shape.vram_mib // size)
            out[at] = self._loss_table(size, int(v), 10 * shape.sm_pct)[gap[at]]
        return out

    def keys(
        self, ledger: Ledger, shape: Shape, targets: IntArray, *, best_only: bool = False
    ) -> IntArray:
        """Packed placement rank of one pod of ``shape`` on each target (nodes; GPUs for a
        slice); lower is better. ``targets`` must be places where the pod fits.

        ``best_only``: only the smallest key matters (the greedy choice). The criteria are then
        applied one at a time, each only to the targets that tie on those before it, as a
        lexicographic filter; the targets filtered out get the largest possible key. The
        smallest key is the same either way.
        """
        targets = np.asarray(targets, dtype=np.int64)
        if len(targets) == 0:
            return np.zeros(0, dtype=np.int64)
        idx = np.arange(len(targets))
        key = np.zeros(len(targets), dtype=np.int64)
        for bits, criterion in self._criteria(ledger, shape, targets):
            value = np.minimum(np.maximum(criterion(idx), 0), (1 << bits) - 1)
            key = (key << bits) | value.astype(np.int64, copy=False)
            if best_only and len(idx) > 1:
                tie = key == key.min()
                idx, key = idx[tie], key[tie]
        if not best_only:
            return key
        out = np.full(len(targets), _NO_KEY, dtype=np.int64)
        out[idx] = key
        return out

    def node_keys(self, ledger: Ledger, shape: Shape, node: int, targets: list[int]) -> list[int]:
        """``keys`` of targets of ONE node (the node, or GPUs of it for a slice) in plain
        Python: what the greedy stage asks after every placement, where numpy's per-call cost
        would dominate. The criteria of ``_criteria`` one target at a time, with the same
        numbers (``tests/scheduler/test_onenode.py`` compares them on random ledgers): the
        float operations are elementwise, which round alike in Python and in numpy, and the
        FGD class comes from the same cache (``_node_fgd``)."""
        if not targets:
            return []
        kind = shape.kind
        idle = float(self._idle(ledger)[1][node])
        cpu = float(ledger.cpu[node])
        k = float(self.cpu_per_idle[node])
        half = 1 << (_STRAND_BITS - 1)
        rank = int(self.rank[node])
        fgd = self._node_fgd(ledger, shape, node, targets)
        if kind is Kind.CPU:
            strand = _plain_strand(k, idle, cpu, 0.0, shape.cpu_milli) + half
            idle_step = round(idle / IDLE_STEP)
            return [
                _pack(
                    (_STRAND_BITS, strand),
                    (_FGD_BITS, f),
                    (_IDLE_BITS, idle_step),
                    (_RANK_BITS, rank),
                )
                for f in fgd
            ]
        prot = int(self.protected(ledger)[self.node_model[node]]) if self.reserving else 0
        if kind is Kind.WHOLE:
            taken = float(MILLI * shape.gpus)
            strand = _plain_strand(k, idle, cpu, taken, shape.cpu_milli) + half
            return [
                _pack((1, prot), (_STRAND_BITS, strand), (_FGD_BITS, f), (_RANK_BITS, rank))
                for f in fgd
            ]
        layout = self._layout()
        start = layout.start[node]
        end = start + layout.count[node]
        free_v = ledger.vram[start:end].tolist()
        free_s = ledger.sm[start:end].tolist()
        pristine = ledger.pristine[start:end].tolist()
        # GPUs in one state share every criterion but their position (the last one).
        ranked: dict[tuple[int, int, int, bool, int], int] = {}
        out = []
        for g, f in zip(targets, fgd, strict=True):
            column = g - start  # ``gpu_column``
            state = (layout.vram[g], free_v[column], free_s[column], pristine[column], f)
            high = ranked.get(state)
            if high is None:
                size = layout.vram[g]
                taken = (MILLI * shape.vram_mib / max(size, 1) + 10.0 * shape.sm_pct) / 2.0
                high = ranked[state] = _pack(
                    (1, prot),
                    (_LOSS_BITS, self._plain_loss(shape, free_v[column], free_s[column], size)),
                    (_STRAND_BITS, _plain_strand(k, idle, cpu, taken, shape.cpu_milli) + half),
                    (_FGD_BITS, f),
                    (_RANK_BITS, rank),
                    (1, int(pristine[column])),
                )
            out.append(_pack((_GPU_BITS, column), high=high))
        return out

    def _plain_loss(self, shape: Shape, free_vram: int, free_sm: int, size: int) -> int:
        """``_slice_loss`` of one GPU of ``size`` MiB with these free amounts."""
        step = 10  # the grid of scoring.slice_prices
        free_v = min(MILLI * free_vram // max(size, 1), MILLI)
        free_s = min(10 * free_sm, MILLI)
        gap = (free_v // step) * (MILLI // step + 1) + free_s // step
        if len(self.targets) == 1:
            [size] = self.targets
        elif size not in self.targets:
            return 0
        v = -(-MILLI * shape.vram_mib // size)
        return int(self._loss_table(size, int(v), 10 * shape.sm_pct)[gap])

    def _criteria(
        self, ledger: Ledger, shape: Shape, targets: IntArray
    ) -> list[tuple[int, Callable[[IntArray], IntArray]]]:
        """The criteria of the shape's kind, in order: (bits, values for ``targets[idx]``)."""
        cycle = self.cycle
        kind = shape.kind
        nodes = cycle.gpu_node[targets] if kind is Kind.SLICE else targets
        half = 1 << (_STRAND_BITS - 1)

        def rank(i: IntArray) -> IntArray:
            return self.rank[nodes[i]]

        def fgd(i: IntArray) -> IntArray:
            return self.fgd(ledger, shape, targets[i])

        def prot(i: IntArray) -> IntArray:
            protected = self.protected(ledger)
            if not protected.any():
                return np.zeros(len(i), dtype=np.int64)
            out: IntArray = protected[self.node_model[nodes[i]]].astype(np.int64)
            return out

        if kind is Kind.CPU:

            def strand_cpu(i: IntArray) -> IntArray:
                return self._strand(ledger, nodes[i], np.zeros(len(i)), shape.cpu_milli) + half

            def idle(i: IntArray) -> IntArray:
                return np.rint(self.node_idle(ledger, nodes[i]) / IDLE_STEP).astype(np.int64)

            return [
                (_STRAND_BITS, strand_cpu),
                (_FGD_BITS, fgd),
                (_IDLE_BITS, idle),
                (_RANK_BITS, rank),
            ]
        if kind is Kind.WHOLE:

            def strand_whole(i: IntArray) -> IntArray:
                taken = np.full(len(i), float(MILLI * shape.gpus))
                return self._strand(ledger, nodes[i], taken, shape.cpu_milli) + half

            return [(1, prot), (_STRAND_BITS, strand_whole), (_FGD_BITS, fgd), (_RANK_BITS, rank)]

        def loss(i: IntArray) -> IntArray:
            return self._slice_loss(ledger, shape, targets[i])

        def strand_slice(i: IntArray) -> IntArray:
            size = cycle.gpu_vram[targets[i]]
            taken = (MILLI * shape.vram_mib / np.maximum(size, 1) + 10.0 * shape.sm_pct) / 2.0
            return self._strand(ledger, nodes[i], taken, shape.cpu_milli) + half

        def pristine(i: IntArray) -> IntArray:
            return ledger.pristine[targets[i]].astype(np.int64)

        def column(i: IntArray) -> IntArray:
            return self.gpu_column[targets[i]]

        return [
            (1, prot),
            (_LOSS_BITS, loss),
            (_STRAND_BITS, strand_slice),
            (_FGD_BITS, fgd),
            (_RANK_BITS, rank),
            (1, pristine),
            (_GPU_BITS, column),
        ]

    # -- FGD class, cached ----------------------------------------------------------------------
    def _fgd_cache(self, shape: Shape) -> _FgdCache:
        cycle = self.cycle
        key = (
            "fgd",
            self.mix_key,
            shape.kind,
            shape.gpus,
            shape.vram_mib,
            shape.sm_pct,
            shape.cpu_milli,
            shape.memory_mib,
        )
        cache: _FgdCache | None = cycle.memo.get(key)
        if cache is None:
            cache = cycle.memo[key] = _FgdCache(cycle, shape.kind is Kind.SLICE)
        return cache

    def fgd(self, ledger: Ledger, shape: Shape, targets: IntArray) -> IntArray:
        """FGD class of one pod of the shape on each target, from the cache where still valid."""
        cycle = self.cycle
        cache = self._fgd_cache(shape)
        nodes = cycle.gpu_node[targets] if cache.on_gpus else targets
        stale_node = cache.stale(ledger)
        missing = stale_node[nodes] | ~cache.known[targets]
        if missing.any():
            changed = _unique_nodes(cycle, nodes[stale_node[nodes]])
            if len(changed):
                cache.stamp(ledger, changed)
            wanted = targets[missing]
            cache.values[wanted] = self._fgd_values(ledger, shape, wanted, nodes[missing])
            cache.known[wanted] = True
        values: IntArray = cache.values[targets]
        return values

    def _node_fgd(self, ledger: Ledger, shape: Shape, node: int, targets: list[int]) -> list[int]:
        """``fgd`` of targets of one node, on the same cache kept the same way."""
        cache = self._fgd_cache(shape)
        if cache.stale(ledger)[node]:
            cache.stamp_node(ledger, node)
            wanted = targets
        else:
            known = cache.known
            wanted = [t for t in targets if not known[t]]
        if wanted:
            found = self._plain_fgd(ledger, shape, node, wanted)
            if found is None:
                found = self._fgd_vectorised(ledger, shape, np.array(wanted)).tolist()
            cache.values[wanted] = found
            cache.known[wanted] = True
            if wanted is targets:
                return found
        out: list[int] = cache.values[targets].tolist()
        return out

    def _fgd_values(
        self, ledger: Ledger, shape: Shape, wanted: IntArray, owners: IntArray
    ) -> IntArray:
        """FGD classes of ``wanted`` (on the nodes ``owners``), afresh: node by node in plain
        Python when they are few and every class is certain (``onenode``), else vectorised."""
        if len(wanted) > PLAIN_TARGETS:
            return self._fgd_vectorised(ledger, shape, wanted)
        by_node: dict[int, list[int]] = {}  # node -> positions in ``wanted``
        for i, node in enumerate(owners.tolist()):
            by_node.setdefault(node, []).append(i)
        out = np.zeros(len(wanted), dtype=np.int64)
        targets = wanted.tolist()
        for node, at in by_node.items():
            found = self._plain_fgd(ledger, shape, node, [targets[i] for i in at])
            if found is None:
                return self._fgd_vectorised(ledger, shape, wanted)
            out[at] = found
        return out

    def _fgd_vectorised(self, ledger: Ledger, shape: Shape, wanted: IntArray) -> IntArray:
        if shape.kind is Kind.SLICE:
            return self._fgd_slice(ledger, shape, wanted)
        return self._fgd_node(ledger, shape, wanted)

    def _plain_fgd(
        self, ledger: Ledger, shape: Shape, node: int, wanted: list[int]
    ) -> list[int] | None:
        """``onenode.fgd_classes``: None where it is not certain."""
        layout = self._layout()
        size = layout.size[node]
        mix = self._plain_mix(size) if size else None
        return onenode.fgd_classes(layout, mix, ledger, shape, node, wanted)

    def _layout(self) -> onenode.Layout:
        layout: onenode.Layout | None = self.cycle.memo.get("layout")
        if layout is None:
            layout = self.cycle.memo["layout"] = onenode.Layout.of(self.cycle)
        return layout

    def _plain_mix(self, size: int) -> onenode.PlainMix:
        mix = self._plain_mixes.get(size)
        if mix is None:  # shared by the solves on this cycle state and those derived from it
            key = ("plain-mix", self.mix_key, size)
            mix = self.cycle.memo.get(key)
            if mix is None:
                mix = self.cycle.memo[key] = onenode.PlainMix.of(self._target(size), size)
            self._plain_mixes[size] = mix
        return mix

    def _target(self, size: int) -> scoring.TargetShapes:
        """The mix in thousandths of a GPU of ``size`` MiB of VRAM (precomputed per size)."""
        return self.targets.get(size) or self.mix.target(size, self.model_ids)

    def _fragment(self, rows: Rows, nodes: IntArray) -> FloatArray:
        """Fragment of each row (thousandths of a GPU), against the mix and its model masks."""
        return self._fragments(rows, nodes)[0]

    def _fragments(
        self, rows: Rows, nodes: IntArray, after: Rows | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """``_fragment`` of ``rows`` and of ``after`` (the same nodes in another state; the
        GPU summary is computed once when their GPU arrays are the same objects).

        ``scoring.fragment``, with the per-shape work done once per distinct shape of the mix
        (``TargetShapes.distinct``) and spread back over the mix's shapes before the weighted
        sum: the same numbers."""
        node_vram = rows.vram.max(axis=1, initial=0)
        frag = np.zeros(len(node_vram), dtype=np.float64)
        frag_after = np.zeros(len(node_vram), dtype=np.float64)
        models = self.cycle.node_model[nodes]
        same_gpus = (
            after is not None
            and after.free_vram is rows.free_vram
            and after.free_sm is rows.free_sm
        )
        for size in np.unique(node_vram[node_vram > 0]).tolist():
            at = node_vram == size
            target = self._target(int(size))
            uniq = target.distinct[0]
            access = scoring.shape_access(models[at], uniq)
            stats = _summary(rows, at, size, uniq)
            frag[at] = _weighted(rows, at, stats, access, target)
            if after is not None:
                stats_after = stats if same_gpus else _summary(after, at, size, uniq)
                frag_after[at] = _weighted(after, at, stats_after, access, target)
        return frag, frag_after

    def _fgd_node(self, ledger: Ledger, shape: Shape, nodes: IntArray) -> IntArray:
        """Whole-GPU pods take the lowest-index pristine GPUs; CPU-only pods only CPU/memory."""
        rows = _rows(ledger, nodes)
        after_rows = replace(rows, cpu=rows.cpu - shape.cpu_milli, mem=rows.mem - shape.memory_mib)
        if shape.kind is Kind.WHOLE:
            pristine = (rows.vram > 0) & (rows.free_vram == rows.vram) & (rows.free_sm == 100)
            taken = pristine & (np.cumsum(pristine, axis=1) <= shape.gpus)
            after_rows = replace(
                after_rows,
                free_vram=np.where(taken, 0, rows.free_vram),
                free_sm=np.where(taken, 0, rows.free_sm),
            )
        before, after = self._fragments(rows, nodes, after_rows)
        return fgd_class(after - before)

    def _fgd_slice(self, ledger: Ledger, shape: Shape, gpus: IntArray) -> IntArray:
        """A slice changes one GPU: the node's fragment summary (``scoring.fragment_stats``)
        once per node, then only that GPU's contribution per candidate GPU (per distinct shape
        of the mix, as in ``_fragments``)."""
        cycle = self.cycle
        out = np.zeros(len(gpus), dtype=np.int64)
        owners = cycle.gpu_node[gpus]
        nodes = _unique_nodes(cycle, owners)
        position = np.zeros(cycle.n_nodes, dtype=np.int64)
        position[nodes] = np.arange(len(nodes), dtype=np.int64)
        at_node = position[owners]  # the position of each GPU's node in ``nodes``
        rows = _rows(ledger, nodes)
        node_vram = rows.vram.max(axis=1, initial=0)
        for size in np.unique(node_vram[node_vram > 0]).tolist():
            target = self._target(int(size))
            uniq, inverse = target.distinct
            in_size = node_vram == size
            u = np.flatnonzero(in_size)
            access = scoring.shape_access(cycle.node_model[nodes[u]], uniq)
            v_all = 1000.0 * rows.free_vram[u] / size
            s_all = 10.0 * rows.free_sm[u]
            n_fit, stranded, idle = scoring.fragment_stats(v_all, s_all, uniq)
            before_shape = scoring.fragment_by_shape_from_stats(
                n_fit, stranded, idle, rows.cpu[u], access, uniq, rows.mem[u]
            )
            before = _spread(before_shape, inverse) @ target.weight
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
            fit_old = (v[:, None] >= uniq.vram) & (sm[:, None] >= uniq.sm)
            fit_new = (v2[:, None] >= uniq.vram) & (s2[:, None] >= uniq.sm)
            idle_old, idle_new = (v + sm) / 2.0, (v2 + s2) / 2.0
            after_shape = scoring.fragment_by_shape_from_stats(
                n_fit[k] + fit_new.astype(np.int64) - fit_old,
                stranded[k] + (~fit_new) * idle_new[:, None] - (~fit_old) * idle_old[:, None],
                idle[k] - (idle_old - idle_new),
                rows.cpu[u][k] - shape.cpu_milli,
                access[k],
                uniq,
                rows.mem[u][k] - shape.memory_mib,
            )
            after = _spread(after_shape, inverse) @ target.weight
            out[pick] = fgd_class(after - before[k])
        return out


def _pack(*criteria: tuple[int, int], high: int = 0) -> int:
    """The key of ``(bits, value)`` criteria, most significant first (as ``Ranking.keys``),
    after those packed in ``high``."""
    key = high
    for bits, value in criteria:
        key = (key << bits) | min(max(value, 0), (1 << bits) - 1)
    return key


def _plain_stranded(k: float, idle: float, cpu: float) -> float:
    """``scoring.stranded_idle`` of one node (as ``Ranking._strand`` computes it)."""
    return min(idle, max(0.0, k * idle - cpu) / k) if k > 0 else 0.0


def _plain_strand(k: float, idle: float, cpu: float, gpu_taken: float, cpu_taken: int) -> int:
    """``Ranking._strand`` of one node."""
    delta = _plain_stranded(k, idle - gpu_taken, cpu - cpu_taken) - _plain_stranded(k, idle, cpu)
    return round(delta / STRAND_STEP)


def _unique_nodes(cycle: CycleState, nodes: IntArray) -> IntArray:
    """``np.unique(nodes)`` (node numbers), without sorting them when there are many."""
    if len(nodes) <= 256:
        out: IntArray = np.unique(nodes)
        return out
    seen = np.zeros(cycle.n_nodes, dtype=bool)
    seen[nodes] = True
    return np.flatnonzero(seen)


Stats = tuple[IntArray, FloatArray, FloatArray]  # scoring.fragment_stats: n_fit, stranded, idle


def _summary(rows: Rows, at: BoolArray, size: int, shapes: scoring.TargetShapes) -> Stats:
    """``scoring.fragment_stats`` of the rows ``at`` (GPUs of ``size`` MiB) for ``shapes``."""
    return scoring.fragment_stats(
        1000.0 * rows.free_vram[at] / size, 10.0 * rows.free_sm[at], shapes
    )


def _weighted(
    rows: Rows, at: BoolArray, stats: Stats, access: BoolArray, target: scoring.TargetShapes
) -> FloatArray:
    """``F(n)`` of the rows ``at`` from their summary for the target's distinct shapes."""
    uniq, inverse = target.distinct
    per_shape = scoring.fragment_by_shape_from_stats(
        *stats, rows.cpu[at], access, uniq, rows.mem[at]
    )
    out: FloatArray = _spread(per_shape, inverse) @ target.weight
    return out


def _spread(per_distinct: FloatArray, inverse: IntArray) -> FloatArray:
    """Per-shape values ``[N, M]`` from those of the distinct shapes ``[N, M']``, C-ordered like
    the per-shape arrays of ``scoring`` (a fancy index would give a Fortran-ordered array, and
    the weighted sum, BLAS's, can round differently on it)."""
    out: FloatArray = np.take(per_distinct, inverse, axis=1)
    return out


class _FgdCache:
    """FGD classes of one shape on every node (GPU, for slices), with the free amounts of the
    node each value was computed for: a value is valid while they are unchanged. Only the
    values asked for are computed (``known``): for a slice, the GPUs it fits on.

    Comparing every amount is linear in the pool, so it is done once per ledger; after that,
    only the nodes the ledger changed since (``Ledger.changed_since``) are marked stale.
    """

    def __init__(self, cycle: CycleState, on_gpus: bool) -> None:
        self.cycle = cycle
        self.values = np.zeros(cycle.n_gpus if on_gpus else cycle.n_nodes, dtype=np.int64)
        self.known = np.zeros(len(self.values), dtype=bool)  # computed for the stamped amounts
        self.on_gpus = on_gpus
        self.cpu = np.full(cycle.n_nodes, -1, dtype=np.int64)
        self.mem = np.full(cycle.n_nodes, -1, dtype=np.int64)
        self.vram = np.full(cycle.n_gpus, -1, dtype=np.int64)
        self.sm = np.full(cycle.n_gpus, -1, dtype=np.int64)
        self._ledger: weakref.ref[Ledger] | None = None  # the ledger ``_stale`` is about
        self._changes = -1
        self._stale = np.zeros(0, dtype=bool)

    def stale(self, ledger: Ledger) -> BoolArray:
        """Nodes whose free amounts may differ from those their values were computed for (a
        node the ledger changed and changed back counts as stale). Do not modify."""
        if self._ledger is not None and self._ledger() is ledger:
            if ledger.changes != self._changes:
                self._stale[ledger.changed_since(self._changes)] = True
                self._changes = ledger.changes
            return self._stale
        stale: BoolArray = (self.cpu != ledger.cpu) | (self.mem != ledger.mem)
        gpu_changed = (self.vram != ledger.vram) | (self.sm != ledger.sm)
        if gpu_changed.any():
            stale[self.cycle.gpu_node[gpu_changed]] = True
        self._ledger = weakref.ref(ledger)
        self._changes = ledger.changes
        self._stale = stale
        return stale

    def stamp_node(self, ledger: Ledger, node: int) -> None:
        """``stamp`` of one node."""
        start = int(self.cycle.node_gpu_start[node])
        end = start + int(self.cycle.node_gpu_count[node])
        if self.on_gpus:
            self.known[start:end] = False
        else:
            self.known[node] = False
        self.cpu[node] = ledger.cpu[node]
        self.mem[node] = ledger.mem[node]
        self.vram[start:end] = ledger.vram[start:end]
        self.sm[start:end] = ledger.sm[start:end]
        if self._ledger is not None and self._ledger() is ledger:
            self._stale[node] = False

    def stamp(self, ledger: Ledger, nodes: IntArray) -> None:
        """Record the ledger's amounts of ``nodes``, forgetting their values (to be computed
        for these amounts)."""
        idx = self.cycle.node_gpus[nodes].ravel()
        idx = idx[idx >= 0]
        self.known[idx if self.on_gpus else nodes] = False
        self.cpu[nodes] = ledger.cpu[nodes]
        self.mem[nodes] = ledger.mem[nodes]
        self.vram[idx] = ledger.vram[idx]
        self.sm[idx] = ledger.sm[idx]
        if self._ledger is not None and self._ledger() is ledger:
            self._stale[nodes] = False


def ranks(keys: IntArray) -> IntArray:
    """Dense ranks of packed keys (0 = best): small integers for CP-SAT's objective."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    out: IntArray = np.unique(keys, return_inverse=True)[1].astype(np.int64).ravel()
    return out


def node_fragments(snapshot: Snapshot) -> FloatArray:
    """``F(n)`` of every node of the snapshot, in thousandths of a GPU: the idle GPU capacity
    that the snapshot's recent workload could not use, the measure placement keeps low (zero
    for every node when there is no recent workload to measure against)."""
    cycle = snapshot.cycle
    nodes = np.arange(cycle.n_nodes)
    if not snapshot.workload or not len(nodes):
        return np.zeros(len(nodes), dtype=np.float64)
    ranking = ranking_for(cycle, snapshot.workload, (), seed=0)
    return ranking._fragment(_rows(Ledger(cycle), nodes), nodes)
