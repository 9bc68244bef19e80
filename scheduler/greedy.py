"""Greedy stage: a fast, always-valid placement. CP-SAT's hint, and the fallback.

Jobs go one at a time in the order of ``jobs.py`` (priority, QoS, then larger units first:
whole-GPU requests largest first, then the others in arrival order), each onto the ledger as it
stands:

* a **pod class** places its pods one by one, each on the target (node, or GPU for slices) with
  the best placement rank (``objective.Ranking``), found in a :class:`TargetIndex` of the keys
  and re-scored only where a placement changed the ledger;
* a **gang** looks for the tightest level with a domain that can hold it (node, then rack, zone,
  region; only up to its required level), ranks those domains (fewest nodes, then best fit),
  orders each domain's nodes top-down with :func:`topology.descend`, and first-fits its members
  on that order. A gang that does not fit is rolled back whole.

All choices are vectorised over nodes or GPUs with numpy; the placement rank ends with the
node order of the solver's seed and the GPU position, so the result depends only on the
snapshot, the batch and the seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.affinity import choose_whole_gpus
from scheduler.cycle import CycleState, IntArray
from scheduler.filter import ShapeFilter
from scheduler.jobs import Group, Job, Kind, Shape
from scheduler.ledger import Ledger, PodAssignment
from scheduler.objective import Ranking
from scheduler.requests import PodRequest
from scheduler.snapshot import TopologyLevel
from scheduler.topology import NODE_LEVELS, descend, rank_domains


@dataclass(frozen=True, eq=False)
class Context:
    """What every stage of one solve shares: the cycle state, the filters per shape, the
    placement rank (with the target shape mix it is built on), and how many domains the greedy
    stage tries per level."""

    cycle: CycleState
    filters: Mapping[Shape, ShapeFilter]
    ranking: Ranking
    domain_tries: int = 4


Assignments = dict[int, list[PodAssignment]]  # job index -> placed pods, in group/member order


class ScoreCache:
    """Placement keys of one shape on the ledger as it stands (``Ranking.keys``; its costly
    part is cached per node until the node's free amounts change)."""

    def __init__(self, ledger: Ledger, shape: Shape, ranking: Ranking) -> None:
        self.ledger = ledger
        self.shape = shape
        self.ranking = ranking
        self.index: TargetIndex | None = None  # the greedy stage's, once a class needs one

    def get(self, targets: IntArray) -> IntArray:
        return self.ranking.keys(self.ledger, self.shape, targets)

    def best(self, targets: IntArray) -> int:
        """The target with the smallest key."""
        keys = self.ranking.keys(self.ledger, self.shape, targets, best_only=True)
        return int(targets[np.argmin(keys)])


def greedy(ctx: Context, jobs: Sequence[Job]) -> Assignments:
    """Place the jobs in order; returns the pods placed for each (placed) job."""
    ledger = Ledger(ctx.cycle)
    caches: dict[Shape, ScoreCache] = {}
    placed: Assignments = {}
    for job in jobs:
        if not all(ctx.filters[g.shape].eligible.any() for g in job.groups):
            continue
        if job.is_gang:
            pods = place_gang(ledger, ctx, job)
        else:
            shape = job.groups[0].shape
            cache = caches.setdefault(shape, ScoreCache(ledger, shape, ctx.ranking))
            pods = place_class(ledger, ctx, job, cache)
        if pods:
            placed[job.index] = pods
    return placed


# -- pod classes ---------------------------------------------------------------------------------
NO_TARGET = (1 << 63) - 1  # the key of a target the pod does not fit (real keys use 53 bits)


class TargetIndex:
    """The placement keys of one shape on every target (node, or GPU for slices), with the
    smallest key per block of targets, so the best target is found without scanning them all.

    ``keys[t]`` is the key of one more pod of the shape on target ``t``, or ``NO_TARGET`` where
    it does not fit, on the ledger as it stood at the last :meth:`sync`. Built from the keys of
    every fitting target when a class of the shape is first placed, and kept for the shape's
    later classes (other priorities); :meth:`sync`, after every placement and before every
    class, re-ranks the targets of the nodes the ledger changed since (a target's key depends
    only on its own node, except for the model reservation: when that changes, the index is
    built again). The keys end with the node order (a permutation) and, for slices, the GPU's
    position, so no two fitting targets share a key (up to 2**20 nodes and 32 GPUs per node,
    the widths of those fields) and the best one is the one a scan of every fitting target
    finds.
    """

    BLOCK = 256

    def __init__(self, ledger: Ledger, filt: ShapeFilter, cache: ScoreCache) -> None:
        self.ledger = ledger
        self.filt = filt
        self.cache = cache
        self.on_gpus = filt.shape.kind is Kind.SLICE
        self._build()

    def _build(self) -> None:
        ledger = self.ledger
        cycle = ledger.cycle
        size = cycle.n_gpus if self.on_gpus else cycle.n_nodes
        self.keys = np.full(-(-size // self.BLOCK) * self.BLOCK, NO_TARGET, dtype=np.int64)
        targets = _fitting(ledger, self.filt)
        self.keys[targets] = self.cache.get(targets)
        self.block_min = self.keys.reshape(-1, self.BLOCK).min(axis=1)
        self.protected = self.cache.ranking.protected(ledger)
        self.synced = ledger.changes  # the ledger's changes the keys are up to date with

    def best(self) -> int | None:
        """The target with the smallest key, or None when the pod fits nowhere."""
        block = int(np.argmin(self.block_min))
        if self.block_min[block] == NO_TARGET:
            return None
        lo = block * self.BLOCK
        return lo + int(np.argmin(self.keys[lo : lo + self.BLOCK]))

    def sync(self) -> None:
        """Bring the keys up to date with the ledger."""
        ledger = self.ledger
        protected = self.cache.ranking.protected(ledger)
        if protected is not self.protected and not np.array_equal(protected, self.protected):
            self._build()
            return
        changed = ledger.changed_since(self.synced)
        if len(changed) == 1:  # after each placement
            self._refresh_node(changed[0])
        elif changed:
            self._refresh(np.array(changed, dtype=np.int64))
        self.synced = ledger.changes

    def _refresh(self, nodes: IntArray) -> None:
        """Re-rank the targets of ``nodes``."""
        ledger = self.ledger
        cycle = ledger.cycle
        if self.on_gpus:
            idx = cycle.node_gpus[nodes].ravel()
            mine = idx[idx >= 0]
        else:
            mine = nodes
        self.keys[mine] = NO_TARGET
        if len(nodes) == 1:
            fresh = _fitting(ledger, self.filt, node=int(nodes[0]))
        else:
            fits = _fitting(ledger, self.filt)
            changed = np.zeros(cycle.n_nodes, dtype=bool)
            changed[nodes] = True
            fresh = fits[changed[cycle.gpu_node[fits] if self.on_gpus else fits]]
        self.keys[fresh] = self.cache.get(fresh)
        blocks = np.unique(mine // self.BLOCK)
        self.block_min[blocks] = self.keys.reshape(-1, self.BLOCK)[blocks].min(axis=1)

    def _refresh_node(self, node: int) -> None:
        """``_refresh`` of one node (after every placement), in plain Python: its targets are
        one node or its few GPUs, where numpy's per-call cost would dominate."""
        ledger = self.ledger
        cycle = ledger.cycle
        if self.on_gpus:
            lo = int(cycle.node_gpu_start[node])
            hi = lo + int(cycle.node_gpu_count[node])
            fresh = _fitting(ledger, self.filt, node=node).tolist()
        else:
            lo, hi = node, node + 1
            fresh = [node] if ledger.node_fits(self.filt, node) else []
        keys = self.keys
        keys[lo:hi] = NO_TARGET
        for target, key in zip(
            fresh, self.cache.ranking.node_keys(ledger, self.filt.shape, node, fresh), strict=True
        ):
            keys[target] = key
        block = self.BLOCK
        for b in range(lo // block, (hi - 1) // block + 1) if hi > lo else ():
            self.block_min[b] = keys[b * block : (b + 1) * block].min()


def place_class(ledger: Ledger, ctx: Context, job: Job, cache: ScoreCache) -> list[PodAssignment]:
    """As many pods of the class as fit, one by one, each on the best-ranked target.

    The shape's :class:`TargetIndex` (built on its first class of several pods); a single pod
    before that: the best target by a lexicographic filter, without ranking every target.
    """
    filt = ctx.filters[job.groups[0].shape]
    pods = job.groups[0].pods
    if len(pods) == 1 and cache.index is None:
        targets = _fitting(ledger, filt)
        if len(targets) == 0:
            return []
        a = _assignment(ledger, filt.shape, pods[0], cache.best(targets))
        ledger.assign(a)
        return [a]
    if cache.index is None:
        cache.index = TargetIndex(ledger, filt, cache)
    else:
        cache.index.sync()
    index = cache.index
    out: list[PodAssignment] = []
    for pod in pods:
        target = index.best()
        if target is None:
            break
        a = _assignment(ledger, filt.shape, pod, target)
        ledger.assign(a)
        out.append(a)
        index.sync()
    return out


def slice_gpus(ledger: Ledger, filt: ShapeFilter, node: int) -> IntArray:
    """The GPUs of ``node`` that one more slice of the filter's shape fits on."""
    cycle = ledger.cycle
    start = int(cycle.node_gpu_start[node])
    gpus = slice(start, start + int(cycle.node_gpu_count[node]))
    ok = (
        filt.eligible_gpus[gpus]
        & (ledger.vram[gpus] >= filt.shape.vram_mib)
        & (ledger.sm[gpus] >= filt.shape.sm_pct)
    )
    return np.flatnonzero(ok) + start


def _fitting(ledger: Ledger, filt: ShapeFilter, node: int | None = None) -> IntArray:
    """Where one more pod of the shape fits: nodes, or GPUs for a slice (only ``node``'s)."""
    shape = filt.shape
    cycle = ledger.cycle
    if shape.kind is Kind.SLICE:
        if node is None:
            gpu_cap = ledger.gpu_capacity(filt)
            node_room = cpu_room(ledger, shape)
            return np.flatnonzero((gpu_cap > 0) & (node_room[cycle.gpu_node] > 0))
        if not ledger.fits_on_node(shape, node):
            return np.zeros(0, dtype=np.int64)
        return slice_gpus(ledger, filt, node)
    fits = np.flatnonzero(ledger.node_capacity(filt) > 0)
    if node is None:
        return fits
    return fits[fits == node]


def _assignment(ledger: Ledger, shape: Shape, pod: PodRequest, target: int) -> PodAssignment:
    cycle = ledger.cycle
    if shape.kind is Kind.SLICE:
        node = int(cycle.gpu_node[target])
        return PodAssignment(pod, node, (target,), (shape.vram_mib,), (shape.sm_pct,))
    if shape.kind is Kind.WHOLE:
        chosen = choose_whole_gpus(ledger, target, shape.gpus)
        assert chosen is not None  # capacity said so
        return ledger.whole_assignment(pod, target, chosen)
    return PodAssignment(pod, target)


def cpu_room(ledger: Ledger, shape: Shape) -> IntArray:
    """Pods of the shape each node's CPU and memory can still take."""
    room = np.full(ledger.cycle.n_nodes, 1 << 20, dtype=np.int64)
    if shape.cpu_milli:
        room = np.minimum(room, ledger.cpu // shape.cpu_milli)
    if shape.memory_mib:
        room = np.minimum(room, ledger.mem // shape.memory_mib)
    return room


# -- gangs ---------------------------------------------------------------------------------------
def place_gang(ledger: Ledger, ctx: Context, job: Job) -> list[PodAssignment]:
    """All members of the gang in the tightest domain found, or nothing."""
    cycle = ctx.cycle
    primary = job.groups[0]
    filt = ctx.filters[primary.shape]
    within_domain = job.required in (TopologyLevel.GPU, TopologyLevel.NVLINK)
    cap = ledger.node_capacity(filt, per_domain=within_domain)
    top = job.required if job.required is not None else TopologyLevel.REGION
    for level in NODE_LEVELS:
        if level > max(top, TopologyLevel.NODE):
            break
        for domain in rank_domains(cycle, level, cap, primary.count)[: ctx.domain_tries]:
            order = descend(cycle, level, domain, cap, primary.count)
            mark = ledger.mark()
            pods = fill_members(ledger, ctx, job, order)
            if pods is not None:
                return pods
            ledger.rollback(mark)
    return []


def fill_members(
    ledger: Ledger, ctx: Context, job: Job, order: list[int]
) -> list[PodAssignment] | None:
    """First-fit every member of the gang on the nodes in ``order``; None if one does not fit.

    A gang that must stay in one NVLink domain (or on one GPU) is tried on one node and one
    domain at a time.
    """
    if job.required in (TopologyLevel.GPU, TopologyLevel.NVLINK):
        uses_gpus = any(g.shape.kind is not Kind.CPU for g in job.groups)
        for node in order:
            domains = sorted({int(d) for d in _node_domains(ctx.cycle, node)})
            for domain in domains if uses_gpus else [None]:
                mark = ledger.mark()
                pods = _first_fit(ledger, ctx, job, [node], domain)
                if pods is not None and (
                    job.required != TopologyLevel.GPU or len({g for p in pods for g in p.gpus}) <= 1
                ):
                    return pods
                ledger.rollback(mark)
        return None
    return _first_fit(ledger, ctx, job, order, None)


def _node_domains(cycle: CycleState, node: int) -> IntArray:
    start = int(cycle.node_gpu_start[node])
    return cycle.gpu_nvlink[start : start + int(cycle.node_gpu_count[node])]


def _first_fit(
    ledger: Ledger, ctx: Context, job: Job, order: list[int], domain: int | None
) -> list[PodAssignment] | None:
    cycle = ctx.cycle
    near: dict[int, set[int]] = {}  # node -> NVLink domains the gang uses there
    used_gpus: set[int] = set()
    out: list[PodAssignment] = []
    for group in job.groups:
        start = 0  # capacity only shrinks while a gang is placed: never look back
        for pod in group.pods:
            while start < len(order):
                a = _try_node(ledger, ctx, group, pod, order[start], near, used_gpus, domain)
                if a is not None:
                    break
                start += 1
            else:
                return None
            ledger.assign(a)
            out.append(a)
            near.setdefault(a.node, set()).update(int(cycle.gpu_nvlink[g]) for g in a.gpus)
            used_gpus.update(a.gpus)
    return out


def _try_node(
    ledger: Ledger,
    ctx: Context,
    group: Group,
    pod: PodRequest,
    node: int,
    near: dict[int, set[int]],
    used_gpus: set[int],
    domain: int | None,
) -> PodAssignment | None:
    shape = group.shape
    filt = ctx.filters[shape]
    if not filt.eligible[node] or not ledger.fits_on_node(shape, node):
        return None
    cycle = ctx.cycle
    if shape.kind is Kind.WHOLE:
        chosen = choose_whole_gpus(
            ledger, node, shape.gpus, near=frozenset(near.get(node, ())), domain=domain
        )
        return None if chosen is None else ledger.whole_assignment(pod, node, chosen)
    if shape.kind is Kind.SLICE:
        gpus = slice_gpus(ledger, filt, node)
        if domain is not None:
            gpus = gpus[cycle.gpu_nvlink[gpus] == domain]
        if len(gpus) == 0:
            return None
        scores = ctx.ranking.node_keys(ledger, shape, node, gpus.tolist())
        mine = near.get(node, set())
        best = min(
            range(len(gpus)),
            key=lambda i: (
                int(gpus[i]) not in used_gpus,
                int(cycle.gpu_nvlink[gpus[i]]) not in mine,
                int(scores[i]),
                int(gpus[i]),
            ),
        )
        g = int(gpus[best])
        return PodAssignment(pod, node, (g,), (shape.vram_mib,), (shape.sm_pct,))
    return PodAssignment(pod, node)
