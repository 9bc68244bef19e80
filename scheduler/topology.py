"""Topology: the cost of a placement, and choosing domains that keep a gang close together.

Cost model (see ``TopologyCosts``): the leaves of a placement are the GPUs it uses, plus one leaf
per node for CPU-only pods. ``U[L]`` is the number of distinct level-L domains holding a leaf,
and the cost is the weight of the tree joining the leaves::

    cost = sum over L in NVLINK..REGION of  cost(L) * (U[L-1] - U[L])

Hierarchical pruning: a domain can hold a gang only if the capacities of its nodes add up; the
best domains need the fewest nodes, then leave the least capacity unused (best fit). Inside a
domain, :func:`descend` picks children top-down, taking the roomiest first so the gang touches
as few racks and nodes as possible.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from scheduler.cycle import CycleState, IntArray
from scheduler.ledger import PodAssignment
from scheduler.snapshot import TopologyLevel

NODE_LEVELS = (TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.ZONE, TopologyLevel.REGION)


def domain_counts(cycle: CycleState, pods: Iterable[PodAssignment]) -> dict[TopologyLevel, int]:
    """``U[L]`` for every level: how many distinct domains of each level the pods touch."""
    leaves: set[tuple[str, int]] = set()
    nvlink: set[tuple[str, int]] = set()
    nodes: set[int] = set()
    for p in pods:
        nodes.add(p.node)
        if p.gpus:
            leaves.update(("gpu", g) for g in p.gpus)
            nvlink.update(("nvl", int(cycle.gpu_nvlink[g])) for g in p.gpus)
        else:
            leaves.add(("cpu", p.node))
            nvlink.add(("cpu", p.node))
    counts = {TopologyLevel.GPU: len(leaves), TopologyLevel.NVLINK: len(nvlink)}
    for level in NODE_LEVELS:
        counts[level] = len({cycle.domain_of(level, n) for n in nodes})
    return counts


def topology_of(cycle: CycleState, pods: Iterable[PodAssignment]) -> tuple[TopologyLevel, int]:
    """The tightest level holding all pods, and their tree cost."""
    pods = list(pods)
    if len(pods) == 1 and len(pods[0].gpus) <= 1:  # one pod on at most one GPU: a single leaf
        return TopologyLevel.GPU, 0
    counts = domain_counts(cycle, pods)
    costs = cycle.snapshot.costs
    cost = 0
    for level in TopologyLevel:
        if level is not TopologyLevel.GPU:
            cost += costs.of(level) * (counts[TopologyLevel(level - 1)] - counts[level])
    tightest = next((lvl for lvl in TopologyLevel if counts[lvl] <= 1), TopologyLevel.REGION)
    return tightest, cost


def cost_floor(cycle: CycleState, gpus: int) -> int:
    """The least tree cost any placement of ``gpus`` GPUs can have in this pool.

    Rearranged, the cost is ``nvlink * U[GPU] + sum over L in NVLINK..ZONE of (cost(L+1) -
    cost(L)) * U[L] - region * U[REGION]``: with costs non-decreasing upwards, every
    coefficient is >= 0, so the cost is least when each ``U[L]`` is, and ``U[L]`` is at least
    ``gpus`` over the largest number of GPUs one level-L domain of the pool holds (one region:
    gangs never span regions). A lower bound: a gang placed at it cannot be placed closer."""
    if gpus <= 1:
        return 0
    largest = cycle.memo.get(_LARGEST_DOMAINS)
    if largest is None:
        largest = _largest_domains(cycle)
        cycle.memo[_LARGEST_DOMAINS] = largest
    costs = cycle.snapshot.costs
    cost = costs.of(TopologyLevel.NVLINK) * gpus - costs.of(TopologyLevel.REGION)
    for level in (TopologyLevel.NVLINK, *NODE_LEVELS[:-1]):
        step = costs.of(TopologyLevel(level + 1)) - costs.of(level)
        cost += step * -(-gpus // max(largest[level], 1))
    return cost


_LARGEST_DOMAINS = ("topology", "largest GPU domains")


def _largest_domains(cycle: CycleState) -> dict[TopologyLevel, int]:
    """The most GPUs one domain of each level holds (healthy or not: a bound needs no more)."""
    largest = {TopologyLevel.NVLINK: int(np.bincount(cycle.gpu_nvlink).max(initial=0))}
    for level in NODE_LEVELS:
        per_domain = np.bincount(
            cycle.node_domain[level], weights=cycle.node_gpu_count, minlength=1
        )
        largest[level] = int(per_domain.max(initial=0))
    return largest


def nodes_needed(domains: IntArray, cap: IntArray, need: int, n_domains: int) -> IntArray:
    """For every domain, the fewest of its nodes whose capacities add up to ``need``
    (a large number when the domain cannot hold it). Vectorised over all nodes."""
    big = np.iinfo(np.int64).max // 4
    result = np.full(n_domains, big, dtype=np.int64)
    if need <= 0:
        return np.zeros(n_domains, dtype=np.int64)
    keep = cap > 0
    dom, c = domains[keep], cap[keep]
    if len(dom) == 0:
        return result
    order = np.lexsort((-c, dom))
    dom, c = dom[order], c[order]
    starts = np.r_[0, np.flatnonzero(np.diff(dom)) + 1]
    running = np.cumsum(c)
    offset = np.repeat(np.r_[0, running[starts[1:] - 1]], np.diff(np.r_[starts, len(c)]))
    within = running - offset
    rank = np.arange(len(c)) - np.repeat(starts, np.diff(np.r_[starts, len(c)]))
    reached = within >= need
    if reached.any():
        first = np.full(n_domains, big, dtype=np.int64)
        np.minimum.at(first, dom[reached], rank[reached] + 1)
        result = first
    return result


def rank_domains(cycle: CycleState, level: TopologyLevel, cap: IntArray, need: int) -> list[int]:
    """Domains of ``level`` that can hold ``need`` pods, best first: fewest nodes, then best fit."""
    ids = cycle.node_domain[level]
    count = cycle.domain_count[level]
    total = np.bincount(ids, weights=cap, minlength=count).astype(np.int64)
    ok = np.flatnonzero(total >= need)
    if len(ok) == 0:
        return []
    used = nodes_needed(ids, cap, need, count)[ok]
    order = np.lexsort((ok, total[ok] - need, used))
    return [int(d) for d in ok[order]]


def descend(
    cycle: CycleState, level: TopologyLevel, domain: int, cap: IntArray, need: int
) -> list[int]:
    """Nodes of one domain, in the order a gang of ``need`` pods should fill them.

    Top-down: if one child domain holds the rest, take the best such child; otherwise take the
    roomiest children until the remainder fits one child. Nodes of the domain not chosen come
    last (roomiest first), as a fallback for the caller's first fit.
    """
    members = np.flatnonzero((cycle.node_domain[level] == domain) & (cap > 0))
    chosen = _descend(cycle, level, members, cap, need)
    seen = set(chosen)
    rest = sorted((int(n) for n in members if int(n) not in seen), key=lambda n: (-cap[n], n))
    return chosen + rest


def _descend(
    cycle: CycleState, level: TopologyLevel, members: IntArray, cap: IntArray, need: int
) -> list[int]:
    """Chosen nodes among ``members`` (the nodes of one level-``level`` domain)."""
    if need <= 0 or len(members) == 0:
        return []
    if level == TopologyLevel.NODE:
        return [int(members[0])]
    child_level = TopologyLevel(level - 1)
    children, inverse = np.unique(cycle.node_domain[child_level][members], return_inverse=True)
    child_cap = np.bincount(inverse, weights=cap[members]).astype(np.int64)
    available = np.ones(len(children), dtype=bool)
    picks: list[tuple[int, int]] = []  # (child, pods to put there)
    remaining = need
    while remaining > 0 and available.any():
        holds = np.flatnonzero(available & (child_cap >= remaining))
        if len(holds):
            used = nodes_needed(inverse.astype(np.int64), cap[members], remaining, len(children))
            best = holds[np.lexsort((children[holds], child_cap[holds], used[holds]))[0]]
            picks.append((int(best), remaining))
            break
        roomiest = int(np.flatnonzero(available)[np.argmax(child_cap[available])])
        picks.append((roomiest, int(child_cap[roomiest])))
        remaining -= int(child_cap[roomiest])
        available[roomiest] = False
    order: list[int] = []
    for child, share in picks:
        order += _descend(cycle, child_level, members[inverse == child], cap, share)
    return order
