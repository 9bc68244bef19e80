"""Prune stage: the few targets per group that the reduced CP-SAT model may choose from.

Hierarchical, so a 10,000-GPU pool becomes a model of a few dozen nodes per job:

* a **gang** first finds the tightest level (up to its required level) at which some domain can
  hold it at all, keeps the best ``candidate_domains`` such domains, and inside each keeps the
  nodes that :func:`topology.descend` would fill first, with some slack;
* a **pod class** keeps its best-scoring nodes (GPUs for slices) until they could hold all its
  pods with some slack, and at least ``candidate_nodes`` of them.

The greedy plan's targets are always added, so the hint is a solution of the reduced model. In
exact mode nothing is pruned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.cpsat import Candidates
from scheduler.cycle import IntArray
from scheduler.greedy import Assignments, Context, ScoreCache, cpu_room
from scheduler.jobs import Job, Kind, Shape
from scheduler.ledger import Ledger
from scheduler.objective import ranks
from scheduler.snapshot import TopologyLevel
from scheduler.topology import NODE_LEVELS, descend, rank_domains


def prune(
    ctx: Context,
    jobs: Sequence[Job],
    hint: Assignments,
    *,
    candidate_nodes: int,
    candidate_domains: int,
    slack: float,
    exact: bool,
) -> dict[tuple[int, int], Candidates]:
    """Candidates for every (job, group) that passed the filter."""
    ledger = Ledger(ctx.cycle)  # the snapshot as given; never changed here
    caches: dict[Shape, ScoreCache] = {}
    out: dict[tuple[int, int], Candidates] = {}
    for job in jobs:
        if not all(ctx.filters[g.shape].eligible.any() for g in job.groups):
            continue
        if job.is_gang:
            nodes = (
                None
                if exact
                else _gang_nodes(ledger, ctx, job, candidate_nodes, candidate_domains, slack)
            )
        else:
            nodes = None
        for g in range(len(job.groups)):
            extra = _hinted_targets(job, g, hint.get(job.index, []))
            shape = job.groups[g].shape
            cache = caches.setdefault(shape, ScoreCache(ledger, shape, ctx.ranking))
            cand = _group_candidates(
                ledger, cache, ctx, job, g, nodes, extra, candidate_nodes, slack, exact
            )
            if cand is not None:
                out[(job.index, g)] = cand
    return out


def _hinted_targets(job: Job, g: int, pods: Sequence) -> set[int]:
    group = job.groups[g]
    keys = {p.key for p in group.pods}
    slice_group = group.shape.kind is Kind.SLICE
    return {(a.gpus[0] if slice_group else a.node) for a in pods if a.pod.key in keys}


def _gang_nodes(
    ledger: Ledger, ctx: Context, job: Job, per_node: int, per_level: int, slack: float
) -> IntArray:
    """Nodes of the best few domains at the tightest level that can hold the gang, and at the
    next level above it that adds nodes (so the model may spill a gang to leave room for others).
    When no more than ``per_node * per_level`` nodes could take part of the gang at all, none
    is pruned: the model is small anyway."""
    primary = job.groups[0]
    within_domain = job.required in (TopologyLevel.GPU, TopologyLevel.NVLINK)
    cap = ledger.node_capacity(ctx.filters[primary.shape], per_domain=within_domain)
    need = primary.count
    usable = np.flatnonzero(cap > 0)
    if len(usable) <= per_node * per_level:
        return usable.astype(np.int64)
    top = max(job.required or TopologyLevel.REGION, TopologyLevel.NODE)
    want = math.ceil(need * (1 + slack))
    chosen: list[int] = []
    levels_used = 0
    for level in NODE_LEVELS:
        if level > top or levels_used == 2:
            break
        domains = rank_domains(ctx.cycle, level, cap, need)
        if not domains:
            continue
        before = len(set(chosen))
        if level == TopologyLevel.NODE:
            chosen += domains[: max(per_node, per_level)]
        else:
            for d in domains[:per_level]:
                order = descend(ctx.cycle, level, d, cap, need)
                running = np.cumsum(cap[order])
                enough = int(np.searchsorted(running, want)) + 1
                chosen += order[: enough + 2]
        if len(set(chosen)) > before:  # a level whose domains are the ones below adds nothing
            levels_used += 1
    return np.array(sorted(set(chosen)), dtype=np.int64)


def _group_candidates(
    ledger: Ledger,
    cache: ScoreCache,
    ctx: Context,
    job: Job,
    g: int,
    gang_nodes: IntArray | None,
    extra: set[int],
    per_job: int,
    slack: float,
    exact: bool,
) -> Candidates | None:
    cycle = ctx.cycle
    group = job.groups[g]
    shape = group.shape
    filt = ctx.filters[shape]
    if shape.kind is Kind.SLICE:
        room = np.minimum(ledger.gpu_capacity(filt), cpu_room(ledger, shape)[cycle.gpu_node])
    else:
        within_domain = job.required in (TopologyLevel.GPU, TopologyLevel.NVLINK)
        room = ledger.node_capacity(filt, per_domain=within_domain)
    allowed = room > 0
    if gang_nodes is not None:
        on_nodes = np.zeros(cycle.n_nodes, dtype=bool)
        on_nodes[gang_nodes] = True
        allowed &= on_nodes[cycle.gpu_node] if shape.kind is Kind.SLICE else on_nodes
    targets = np.flatnonzero(allowed)
    scores = cache.get(targets)
    if not exact and gang_nodes is None:
        order = np.lexsort((targets, scores))
        running = np.cumsum(room[targets][order])
        want = math.ceil(group.count * (1 + slack))
        keep = np.sort(order[: max(per_job, int(np.searchsorted(running, want)) + 1)])
        targets, scores = targets[keep], scores[keep]
    missing = np.array(sorted(extra - set(targets.tolist())), dtype=np.int64)
    if len(missing):
        targets = np.concatenate([targets, missing])
        scores = np.concatenate([scores, cache.get(missing)])
        order = np.argsort(targets, kind="stable")
        targets, scores = targets[order], scores[order]
    if len(targets) == 0:
        return None
    # CP-SAT gets each candidate's rank among the group's candidates, not the packed key. A
    # gang's members get none: CP-SAT only has to beat the greedy plan on placed demand and
    # topology, and rank coefficients on gangs slowed its search for the least topology.
    coefficients = np.zeros(len(targets), dtype=np.int64) if job.is_gang else ranks(scores)
    return Candidates(targets=targets, scores=coefficients, upper=room[targets])
