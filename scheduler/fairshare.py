"""Weighted dominant-resource fair share (DRF) between tenants, for a contended pool. Pure.

When more is pending than is free, which pods a cycle takes decides who gets the pool. DRF
(Ghodsi et al., NSDI 2011) gives the next unit to the tenant whose *dominant share* is lowest:
the largest, over the pool's resources (vCPU, memory, GPU VRAM, GPU SM), of the fraction of the
pool's capacity the tenant holds. With weights, the share is divided by the tenant's weight
(a tenant of weight 2 is entitled to twice the dominant share of one of weight 1). This is
progressive filling: each unit taken adds its demand to its tenant's share before the next
choice, so a tenant with ten thousand pods pending gets one turn per turn of a tenant with one.

Inside a tenant units go by priority (highest first), then age (oldest first). A gang is one
unit of its whole size: all its pending members' demand counts at once.

``fair_order`` orders the units; ``contended`` bounds a batch at what is free and a tail, so a
flood costs a cycle what it may place, not all of it; ``fair_split`` cuts an ordered batch at what is free, so the
solver places the head first and the tail only on what the head leaves (work-conserving: the
tail still gets any capacity the head cannot use). ``pool_capacity``, ``eligible_free`` and
``demand_of`` measure a snapshot and requests in the four resources.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from scheduler.plan import Placement, Plan
from scheduler.requests import PodRequest, Request, members_of
from scheduler.snapshot import Snapshot
from scheduler.solver import SolverConfig, solve

T = TypeVar("T")
SM_PER_GPU = 100  # a whole GPU is 100 % of one GPU's SMs; a slice its tessera.io/gpu-core


@dataclass(frozen=True)
class Resources:
    """Amounts of the four resources fair share is computed over."""

    cpu_milli: int = 0
    memory_mib: int = 0
    vram_mib: int = 0
    sm_pct: int = 0  # hundredths of a GPU's SMs: a whole GPU is 100

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory_mib + other.memory_mib,
            self.vram_mib + other.vram_mib,
            self.sm_pct + other.sm_pct,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory_mib - other.memory_mib,
            self.vram_mib - other.vram_mib,
            self.sm_pct - other.sm_pct,
        )

    def fits_in(self, room: Resources) -> bool:
        return (
            self.cpu_milli <= room.cpu_milli
            and self.memory_mib <= room.memory_mib
            and self.vram_mib <= room.vram_mib
            and self.sm_pct <= room.sm_pct
        )

    def dominant_share(self, capacity: Resources) -> float:
        """The largest fraction of `capacity` these amounts take (resources the pool does not
        have are left out: a CPU pool's shares are over vCPU and memory)."""
        return max(
            (
                used / total
                for used, total in (
                    (self.cpu_milli, capacity.cpu_milli),
                    (self.memory_mib, capacity.memory_mib),
                    (self.vram_mib, capacity.vram_mib),
                    (self.sm_pct, capacity.sm_pct),
                )
                if total > 0
            ),
            default=0.0,
        )


NOTHING = Resources()


@dataclass(frozen=True)
class Unit:
    """What fair share orders: a pod, or a gang as a whole. `tenant` is any hashable id (None:
    pods of no tenant, the operator's); `created` anything ordered (a timestamp)."""

    key: str
    tenant: Hashable
    priority: int
    created: Any
    demand: Resources
    pods: int = 1


def fair_order(
    units: Iterable[Unit],
    *,
    capacity: Resources,
    usage: Mapping[Any, Resources] | None = None,
    weights: Mapping[Any, float] | None = None,
    limit: int | None = None,
) -> list[Unit]:
    """`units` in the order weighted DRF takes them: each time, the next unit (by priority,
    then age) of the tenant whose dominant share divided by its weight is lowest, counting
    what it holds (`usage`) and the units taken before; ties go to the tenant whose next unit
    has the higher priority, then the older one. Weights default to 1. With `limit`, stops
    once the units taken hold that many pods (the last unit may pass it: a gang is not cut).
    """
    usage = usage or {}
    weights = weights or {}
    queues: dict[Hashable, list[Unit]] = {}
    for unit in units:
        queues.setdefault(unit.tenant, []).append(unit)
    for queue in queues.values():
        queue.sort(key=_inside_tenant)
    cap = float("inf") if limit is None else limit
    if len(queues) == 1:  # one tenant: priority, then age
        (queue,) = queues.values()
        return _prefix(queue, cap)
    held = {tenant: usage.get(tenant, NOTHING) for tenant in queues}
    heap: list[tuple[float, tuple[int, Any, str], int, Hashable]] = []
    order = {tenant: i for i, tenant in enumerate(queues)}  # heap ties: never compare tenants

    def push(tenant: Hashable, position: int) -> None:
        head = queues[tenant][position]
        share = held[tenant].dominant_share(capacity) / _weight(weights, tenant)
        heapq.heappush(heap, (share, _inside_tenant(head), order[tenant], tenant))

    positions = dict.fromkeys(queues, 0)
    for tenant in queues:
        push(tenant, 0)
    out: list[Unit] = []
    taken = 0
    while heap and taken < cap:
        *_, tenant = heapq.heappop(heap)
        unit = queues[tenant][positions[tenant]]
        out.append(unit)
        taken += unit.pods
        held[tenant] = held[tenant] + unit.demand
        positions[tenant] += 1
        if positions[tenant] < len(queues[tenant]):
            push(tenant, positions[tenant])
    return out


def _inside_tenant(unit: Unit) -> tuple[int, Any, str]:
    return (-unit.priority, unit.created, unit.key)


def _weight(weights: Mapping[Any, float], tenant: Hashable) -> float:
    weight = weights.get(tenant, 1.0)
    return weight if weight > 0 else 1.0


def _prefix(units: Sequence[Unit], limit: float) -> list[Unit]:
    out: list[Unit] = []
    taken = 0
    for unit in units:
        if taken >= limit:
            break
        out.append(unit)
        taken += unit.pods
    return out


def contended(
    units: Sequence[Unit], free: Resources, tail: int, keep: Collection[str] = ()
) -> list[Unit]:
    """A fair-ordered batch bounded by what is free: every unit, in order, whose demand fits in
    what the units kept before it left of `free` (the head, as ``fair_split`` cuts it), and of
    the rest only the first `tail` pods' worth (a gang whole), in their places. With `free` the
    whole pool's (an upper bound of what any part of it may be given), the head is never cut;
    what the tail leaves out waits untried for a later cycle, so a flood costs a cycle the pods
    it may place and `tail` more (told why they wait, tried for preemption), not all of it.
    The units of `keep` (keys) are kept wherever they are (a nominated preemptor's room is
    taken by its victims until they have stopped)."""
    out: list[Unit] = []
    left = free
    extra = 0
    for unit in units:
        if unit.demand.fits_in(left):
            out.append(unit)
            left = left - unit.demand
        elif unit.key in keep:
            out.append(unit)
        elif extra < tail:
            out.append(unit)
            extra += unit.pods
    return out


def pool_free(snapshot: Snapshot) -> Resources:
    """What is free in the whole pool (nodes that take pods, their healthy GPUs): at least
    what `eligible_free` finds for any batch."""
    cycle = snapshot.cycle
    up = ~cycle.node_cordoned
    gpus = cycle.gpu_healthy & up[cycle.gpu_node]
    return Resources(
        int(cycle.node_cpu_free[up].sum()),
        int(cycle.node_mem_free[up].sum()),
        int(cycle.gpu_free_vram[gpus].sum()),
        int(cycle.gpu_free_sm[gpus].sum()),
    )


def fair_split(
    items: Sequence[T], demand: Callable[[T], Resources], free: Resources
) -> tuple[list[T], list[T]]:
    """An ordered batch cut at what is free: the head is every item, in order, whose demand
    still fits in what the items before it in the head left of `free`; the tail is the rest,
    in order. An item too large for what is left does not stop the head (a smaller one after
    it may fit)."""
    head: list[T] = []
    tail: list[T] = []
    left = free
    for item in items:
        need = demand(item)
        if need.fits_in(left):
            head.append(item)
            left = left - need
        else:
            tail.append(item)
    return head, tail


def pool_capacity(snapshot: Snapshot) -> Resources:
    """What fair shares are fractions of: the allocatable vCPU and memory of the nodes that
    take pods (not cordoned, ready), and the VRAM and SMs of their healthy GPUs."""
    cycle = snapshot.cycle
    up = ~cycle.node_cordoned
    gpus = cycle.gpu_healthy & up[cycle.gpu_node]
    return Resources(
        int(cycle.node_cpu_alloc[up].sum()),
        int(cycle.node_mem_alloc[up].sum()),
        int(cycle.gpu_vram[gpus].sum()),
        SM_PER_GPU * int(gpus.sum()),
    )


def reference_vram(snapshot: Snapshot) -> int:
    """The VRAM a whole GPU counts for: the pool's largest GPU's (as the solver's demand)."""
    return int(snapshot.cycle.gpu_vram.max(initial=0))


def demand_of(request: Request, vram_per_gpu: int) -> Resources:
    """What a pod or a whole gang asks for in the four resources; a whole GPU counts as
    `vram_per_gpu` of VRAM and all of one GPU's SMs."""
    total = NOTHING
    for pod in members_of(request):
        total = total + pod_demand(pod, vram_per_gpu)
    return total


def pod_demand(pod: PodRequest, vram_per_gpu: int) -> Resources:
    if pod.gpu_slice is not None:
        return Resources(
            pod.cpu_milli, pod.memory_mib, pod.gpu_slice.vram_mib, pod.gpu_slice.sm_pct
        )
    return Resources(pod.cpu_milli, pod.memory_mib, pod.gpus * vram_per_gpu, pod.gpus * SM_PER_GPU)


def eligible_free(snapshot: Snapshot, requests: Sequence[Request]) -> Resources:
    """What is free, in all, on the nodes at least one of `requests` may use (not cordoned,
    serving its compute class, matching its node selector; GPUs: healthy ones of a model it
    accepts): an upper bound of what the batch can be given, tight when the batch's pods are
    confined to a part of the pool."""
    cycle = snapshot.cycle
    nodes = np.zeros(cycle.n_nodes, dtype=bool)
    gpus = np.zeros(cycle.n_gpus, dtype=bool)
    seen: set[tuple[Any, ...]] = set()
    up = ~cycle.node_cordoned
    for request in requests:
        for pod in members_of(request):
            key = (
                pod.compute_class,
                tuple(sorted(pod.node_selector.items())),
                pod.gpu_models if pod.uses_gpu else None,
            )
            if key in seen:
                continue
            seen.add(key)
            mask = up.copy()
            if pod.compute_class is not None:
                mask &= cycle.serves_class(pod.compute_class)
            if pod.node_selector:
                mask &= cycle.matches_selector(dict(pod.node_selector))
            nodes |= mask
            if pod.uses_gpu:
                gpus |= mask[cycle.gpu_node] & cycle.gpu_healthy & _of_models(snapshot, pod)
    return Resources(
        int(cycle.node_cpu_free[nodes].sum()),
        int(cycle.node_mem_free[nodes].sum()),
        int(cycle.gpu_free_vram[gpus].sum()),
        int(cycle.gpu_free_sm[gpus].sum()),
    )


def _of_models(snapshot: Snapshot, pod: PodRequest) -> Any:
    cycle = snapshot.cycle
    if not pod.gpu_models:
        return np.ones(cycle.n_gpus, dtype=bool)
    return cycle.has_model(pod.gpu_models)[cycle.gpu_node]


def solve_in_turn(
    snapshot: Snapshot, requests: Sequence[Request], *, config: SolverConfig = SolverConfig()
) -> tuple[Plan, list[Request]]:
    """Solve a batch in fair-share order (``fair_order``) so that its order decides who gets
    what is free: the head (``fair_split`` at what is free to the batch, ``eligible_free``)
    first, then the tail on what the head left. One solve when all of it may fit, or when
    nothing at its head does. Returns the plan and the tail (the requests that came second,
    or every request when nothing fits what is free: the batch was contended all the same)."""
    vram = reference_vram(snapshot)
    head, tail = fair_split(
        requests, lambda r: demand_of(r, vram), eligible_free(snapshot, requests)
    )
    if not tail:
        return solve(snapshot, requests, config=config), []
    if not head:
        return solve(snapshot, requests, config=config), tail
    first = solve(snapshot, head, config=config)
    second = solve(taken(snapshot, first.placements), tail, config=config)
    return (
        Plan(
            placements=first.placements + second.placements,
            unschedulable=first.unschedulable + second.unschedulable,
            stats=first.stats,
        ),
        tail,
    )


def taken(snapshot: Snapshot, placements: Iterable[Placement]) -> Snapshot:
    """The pool once `placements` are placed (``Snapshot.with_free``: the caches carry over)."""
    cycle = snapshot.cycle
    cpu = cycle.node_cpu_free.copy()
    memory = cycle.node_mem_free.copy()
    vram = cycle.gpu_free_vram.copy()
    sm = cycle.gpu_free_sm.copy()
    for placement in placements:
        for pod in placement.pods:
            node = cycle.node_index[pod.node]
            cpu[node] -= pod.cpu_milli
            memory[node] -= pod.memory_mib
            for share in pod.gpus:
                gpu = cycle.gpu_number[share.gpu_id]
                vram[gpu] -= share.vram_mib
                sm[gpu] -= SM_PER_GPU if share.whole else share.sm_pct
    return snapshot.with_free(
        np.maximum(cpu, 0), np.maximum(memory, 0), np.maximum(vram, 0), np.maximum(sm, 0)
    )
