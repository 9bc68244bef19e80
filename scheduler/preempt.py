"""Preemption: the cheapest set of BestEffort pods whose eviction lets a regular request fit.

Pure, like the rest of the solver: ``plan_preemption(snapshot, preemptor, running)`` reads only
its arguments and returns a :class:`PreemptionPlan` (victims, and where the preemptor will go once
they are gone) or a :class:`NoPreemption` that says why nothing should be evicted.

The rules:

- Only BestEffort pods are victims, and only for a request that is not BestEffort itself.
- A BestEffort gang is evicted whole (a *unit*), never left below its ``minMember``.
- Pods younger than ``min_runtime_s`` are protected (no thrashing on just-started work).
- Topology counts: a request that must stay inside one domain of a required level (a gang in one
  rack, a pod on one node) is given capacity freed inside one such domain, and the solver itself
  decides whether the freed GPUs are the right ones (NVLink, whole GPUs pristine again).
- No wasted evictions: the whole placement is simulated on the pool with the victims released,
  together with the ``competing`` requests the scheduler would place first; if the preemptor would
  still not be placed, nothing is evicted.
- Order of preference between victim sets: fewer victim pods, less lost work (seconds run x size),
  lower priority, newer.

Search, per candidate domain: the domain's victim units are tried as subsets in that order of
preference, each first checked against a necessary condition (enough CPU, memory, VRAM, SM share
and whole GPUs released), then by solving the preemptor on the domain alone. With up to
``exhaustive_units`` units in a domain the first subset that fits is the optimum for the domain;
with more, units are added cheapest first until it fits and then every unit that is not needed is
dropped again (a minimal set: no victim can be spared, though a different, smaller set may
exist).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from scheduler.plan import GpuShare, Placement, RequestStatus
from scheduler.requests import GangRequest, PodRequest, Qos, Request, members_of
from scheduler.snapshot import Gpu, Node, Snapshot, TopologyLevel
from scheduler.solver import SolverConfig, solve

#: Work that a victim loses: seconds it ran times its size (whole GPUs count 1000, a slice its
#: larger share of one GPU in thousandths, every vCPU 1): the same units as the solver's demand.
GPU_UNIT = 1000


@dataclass(frozen=True)
class RunningPod:
    """A BestEffort pod that holds capacity now, as the scheduler sees it.

    ``gang`` is the key of the gang it belongs to (evicted whole), ``started_s`` when it started
    running, in seconds on the caller's clock (the same clock as ``now_s``).
    """

    key: str
    node: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuShare, ...] = ()
    priority: int = 0
    started_s: int = 0
    gang: str | None = None
    qos: Qos = Qos.BEST_EFFORT


@dataclass(frozen=True)
class PreemptionConfig:
    """``min_runtime_s`` protects just-started pods; ``exhaustive_units`` bounds the subsets tried
    per domain (2**N); ``solver`` is used for every feasibility check and the final placement."""

    min_runtime_s: int = 60
    exhaustive_units: int = 12
    solver: SolverConfig = field(default_factory=lambda: SolverConfig(use_cpsat=False))


@dataclass(frozen=True)
class Cost:
    """Why one victim set is preferred to another, compared in this order."""

    victims: int
    lost_work: int
    top_priority: int
    newness: int  # minus the sum of start times: evicting newer pods is cheaper

    def key(self) -> tuple[int, int, int, int]:
        return (self.victims, self.lost_work, self.top_priority, self.newness)


@dataclass(frozen=True)
class PreemptionPlan:
    """Evict ``victims`` (pod keys, whole gangs included); the preemptor then goes to
    ``placement`` (its nodes are the ``nominatedNodeName`` to reserve until it binds)."""

    preemptor: Request
    victims: tuple[str, ...]
    placement: Placement
    cost: Cost

    @property
    def nominated_nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.node for p in self.placement.pods))


@dataclass(frozen=True)
class NoPreemption:
    """Nothing is evicted, and why (in words for the pod's events)."""

    preemptor: Request
    reason: str


@dataclass(frozen=True)
class _Unit:
    """Victims evicted together: one pod, or a whole gang."""

    keys: tuple[str, ...]
    pods: tuple[RunningPod, ...]
    cost: Cost


def plan_preemption(
    snapshot: Snapshot,
    preemptor: Request,
    running: Sequence[RunningPod],
    *,
    now_s: int,
    competing: Sequence[Request] = (),
    config: PreemptionConfig = PreemptionConfig(),
) -> PreemptionPlan | NoPreemption:
    """The cheapest eviction that lets ``preemptor`` be placed, or why there is none.

    ``snapshot`` is the pool as it is (the running pods' capacity in use). ``competing`` are the
    pending requests the scheduler would place before the preemptor (higher priority, or older at
    equal priority): the freed capacity must still go to the preemptor once they are placed.
    """
    members = members_of(preemptor)
    if any(m.qos is Qos.BEST_EFFORT for m in members):
        return NoPreemption(preemptor, "a BestEffort pod never preempts another pod")
    if _placed(snapshot, preemptor, competing, config.solver) is not None:
        return NoPreemption(preemptor, "it fits without evicting anything")

    units, protected = _units(running, now_s=now_s, min_runtime_s=config.min_runtime_s)
    if not units:
        why = "no BestEffort pod holds capacity it could use"
        if protected:
            why += f" ({protected} ran less than the minimum runtime of {config.min_runtime_s}s)"
        return NoPreemption(preemptor, why)
    if _placed(_released(snapshot, units), preemptor, competing, config.solver) is None:
        return NoPreemption(
            preemptor,
            "it would not fit even with every evictable BestEffort pod gone"
            + (
                " (the other pending pods ahead of it would take the capacity)" if competing else ""
            ),
        )

    best: tuple[tuple[int, int, int, int], list[_Unit]] | None = None
    for domain in _domains(snapshot, preemptor):
        local = [u for u in units if any(p.node in domain for p in u.pods)]
        if not local:
            continue
        sub = restricted(snapshot, domain)
        found = _cheapest(sub, preemptor, local, config)
        if found is None:
            continue
        key = _total(found).key()
        if best is None or key < best[0]:
            best = (key, found)
    if best is None:
        return NoPreemption(
            preemptor, "no single domain it may use can be freed enough by evicting BestEffort pods"
        )

    chosen = best[1]
    placement = _placed(_released(snapshot, chosen), preemptor, competing, config.solver)
    if placement is None:  # the domain's plan does not survive the others: evict nothing
        return NoPreemption(preemptor, "the pending pods ahead of it would take the freed capacity")
    victims = tuple(sorted(k for u in chosen for k in u.keys))
    return PreemptionPlan(preemptor, victims, placement, _total(chosen))


def _units(
    running: Iterable[RunningPod], *, now_s: int, min_runtime_s: int
) -> tuple[list[_Unit], int]:
    """Victim units (gangs whole) that may be evicted, and how many pods were protected."""
    grouped: dict[str, list[RunningPod]] = defaultdict(list)
    for pod in running:
        if pod.qos is Qos.BEST_EFFORT:
            grouped[pod.gang if pod.gang is not None else f"pod:{pod.key}"].append(pod)
    units: list[_Unit] = []
    protected = 0
    for group in grouped.values():
        if any(now_s - p.started_s < min_runtime_s for p in group):
            protected += len(group)
            continue
        pods = tuple(sorted(group, key=lambda p: p.key))
        units.append(_Unit(tuple(p.key for p in pods), pods, _cost(pods, now_s)))
    units.sort(key=lambda u: (u.cost.key(), u.keys))
    return units, protected


def _size(pod: RunningPod) -> int:
    gpu = 0
    for share in pod.gpus:
        gpu += GPU_UNIT if share.whole else max(share.sm_pct * 10, 1)
    return gpu + pod.cpu_milli // 1000


def _cost(pods: Sequence[RunningPod], now_s: int) -> Cost:
    return Cost(
        victims=len(pods),
        lost_work=sum(max(now_s - p.started_s, 0) * _size(p) for p in pods),
        top_priority=max(p.priority for p in pods),
        newness=-sum(p.started_s for p in pods),
    )


def _total(units: Sequence[_Unit]) -> Cost:
    return Cost(
        victims=sum(u.cost.victims for u in units),
        lost_work=sum(u.cost.lost_work for u in units),
        top_priority=max(u.cost.top_priority for u in units),
        newness=sum(u.cost.newness for u in units),
    )


def _placed(
    snapshot: Snapshot, preemptor: Request, competing: Sequence[Request], solver: SolverConfig
) -> Placement | None:
    plan = solve(snapshot, [*competing, preemptor], config=solver)
    if plan.status(preemptor.key) is not RequestStatus.PLACED:
        return None
    return plan.placement(preemptor.key)


def _domains(snapshot: Snapshot, preemptor: Request) -> list[frozenset[str]]:
    """Sets of nodes inside which the preemptor must be placed whole, in a fixed order.

    A single pod runs on one node; a gang with a required level inside one domain of that level
    (an NVLink domain lies inside one node, so the node is the domain to free); any other gang
    inside one region.
    """
    if isinstance(preemptor, PodRequest):
        level = TopologyLevel.NODE
    elif isinstance(preemptor, GangRequest) and preemptor.required_level is not None:
        level = max(preemptor.required_level, TopologyLevel.NODE)
    else:
        level = TopologyLevel.REGION
    groups: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for node in snapshot.nodes:
        groups[_domain_key(node, level)].add(node.name)
    return [frozenset(groups[k]) for k in sorted(groups)]


def _domain_key(node: Node, level: TopologyLevel) -> tuple[str, ...]:
    path = (node.region, node.zone, node.rack, node.name)
    depth = {
        TopologyLevel.NODE: 4,
        TopologyLevel.RACK: 3,
        TopologyLevel.ZONE: 2,
        TopologyLevel.REGION: 1,
    }[level]
    return path[:depth]


def restricted(snapshot: Snapshot, nodes: frozenset[str]) -> Snapshot:
    """The pool cut down to ``nodes`` (a domain, or a preemptor's nominated nodes)."""
    return Snapshot(
        nodes=tuple(n for n in snapshot.nodes if n.name in nodes),
        gpus=tuple(g for g in snapshot.gpus if g.node in nodes),
        costs=snapshot.costs,
        workload=snapshot.workload,
    )


def _released(snapshot: Snapshot, units: Iterable[_Unit]) -> Snapshot:
    """The pool with the units' capacity given back (on the nodes this snapshot holds)."""
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    whole: set[str] = set()
    for unit in units:
        for pod in unit.pods:
            cpu[pod.node] += pod.cpu_milli
            mem[pod.node] += pod.memory_mib
            for share in pod.gpus:
                if share.whole:
                    whole.add(share.gpu_id)
                else:
                    vram[share.gpu_id] += share.vram_mib
                    sm[share.gpu_id] += share.sm_pct

    def node(n: Node) -> Node:
        if n.name not in cpu and n.name not in mem:
            return n
        return replace(
            n,
            cpu_milli_free=min(n.cpu_milli_free + cpu[n.name], n.cpu_milli_allocatable),
            memory_mib_free=min(n.memory_mib_free + mem[n.name], n.memory_mib_allocatable),
            numa_nodes=(),  # which NUMA node a victim used is not known: no pinning
        )

    def gpu(g: Gpu) -> Gpu:
        if g.id in whole:
            return replace(g, free_vram_mib=g.vram_mib, free_sm_pct=100)
        if g.id not in vram and g.id not in sm:
            return g
        return replace(
            g,
            free_vram_mib=min(g.free_vram_mib + vram[g.id], g.vram_mib),
            free_sm_pct=min(g.free_sm_pct + sm[g.id], 100),
        )

    return Snapshot(
        nodes=tuple(node(n) for n in snapshot.nodes),
        gpus=tuple(gpu(g) for g in snapshot.gpus),
        costs=snapshot.costs,
        workload=snapshot.workload,
    )


def reserved(
    snapshot: Snapshot, placements: Iterable[Placement], *, held_nodes: Iterable[str] = ()
) -> Snapshot:
    """The pool left for every other request once nominated preemptors have had their turn:
    what ``placements`` take is taken, and ``held_nodes`` (being freed for a preemptor that
    cannot be placed yet: its victims are still stopping) take nothing new until it binds."""
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    for placement in placements:
        for pod in placement.pods:
            cpu[pod.node] += pod.cpu_milli
            mem[pod.node] += pod.memory_mib
            for share in pod.gpus:
                vram[share.gpu_id] += share.vram_mib
                sm[share.gpu_id] += 100 if share.whole else share.sm_pct
    held = frozenset(held_nodes)

    def node(n: Node) -> Node:
        if n.name not in cpu and n.name not in held:
            return n
        return replace(
            n,
            cpu_milli_free=max(0, n.cpu_milli_free - cpu[n.name]),
            memory_mib_free=max(0, n.memory_mib_free - mem[n.name]),
            cordoned=n.cordoned or n.name in held,
            numa_nodes=(),
        )

    def gpu(g: Gpu) -> Gpu:
        if g.id not in vram:
            return g
        return replace(
            g,
            free_vram_mib=max(0, g.free_vram_mib - vram[g.id]),
            free_sm_pct=max(0, g.free_sm_pct - sm[g.id]),
        )

    return Snapshot(
        nodes=tuple(node(n) for n in snapshot.nodes),
        gpus=tuple(gpu(g) for g in snapshot.gpus),
        costs=snapshot.costs,
        workload=snapshot.workload,
    )


def _cheapest(
    domain: Snapshot, preemptor: Request, units: list[_Unit], config: PreemptionConfig
) -> list[_Unit] | None:
    """The cheapest subset of ``units`` that lets the preemptor fit inside ``domain``."""
    if _placed(_released(domain, units), preemptor, (), config.solver) is None:
        return None
    need = _Need.of(domain, preemptor)

    def fits(subset: Sequence[_Unit]) -> bool:
        return need.covered_by(subset) and (
            _placed(_released(domain, subset), preemptor, (), config.solver) is not None
        )

    if len(units) <= config.exhaustive_units:
        subsets = [
            list(combo)
            for size in range(1, len(units) + 1)
            for combo in itertools.combinations(units, size)
        ]
        subsets.sort(key=lambda s: (_total(s).key(), [u.keys for u in s]))
        return next((s for s in subsets if fits(s)), None)

    chosen: list[_Unit] = []
    for unit in units:  # cheapest first
        chosen.append(unit)
        if fits(chosen):
            break
    for unit in sorted(chosen, key=lambda u: u.cost.key(), reverse=True):  # drop what is not needed
        rest = [u for u in chosen if u is not unit]
        if rest and fits(rest):
            chosen = rest
    return chosen


@dataclass(frozen=True)
class _Need:
    """What the victims must release at the least (a cheap filter before solving)."""

    cpu_milli: int
    memory_mib: int
    vram_mib: int
    sm_pct: int
    whole_gpus: int
    free_whole: int

    @classmethod
    def of(cls, domain: Snapshot, request: Request) -> _Need:
        members = members_of(request)
        cpu = sum(m.cpu_milli for m in members)
        mem = sum(m.memory_mib for m in members)
        vram = sum(m.gpu_slice.vram_mib for m in members if m.gpu_slice is not None)
        sm = sum(m.gpu_slice.sm_pct for m in members if m.gpu_slice is not None)
        whole = sum(m.gpus for m in members)
        usable = [n for n in domain.nodes if not n.cordoned]
        names = {n.name for n in usable}
        healthy = [g for g in domain.gpus if g.healthy and g.node in names]
        return cls(
            cpu_milli=max(cpu - sum(n.cpu_milli_free for n in usable), 0),
            memory_mib=max(mem - sum(n.memory_mib_free for n in usable), 0),
            vram_mib=max(vram - sum(g.free_vram_mib for g in healthy), 0),
            sm_pct=max(sm - sum(g.free_sm_pct for g in healthy), 0),
            whole_gpus=whole,
            free_whole=sum(1 for g in healthy if g.pristine),
        )

    def covered_by(self, units: Sequence[_Unit]) -> bool:
        pods = [p for u in units for p in u.pods]
        if sum(p.cpu_milli for p in pods) < self.cpu_milli:
            return False
        if sum(p.memory_mib for p in pods) < self.memory_mib:
            return False
        shares = [s for p in pods for s in p.gpus]
        if sum(s.vram_mib for s in shares) < self.vram_mib:
            return False
        if sum(s.sm_pct for s in shares) < self.sm_pct:
            return False
        touched = {s.gpu_id for s in shares}
        return self.free_whole + len(touched) >= self.whole_gpus
