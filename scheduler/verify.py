"""Verify stage: check a plan against the snapshot, from scratch.

Independent of how the plan was found (it shares no state with the solver's stages), so a bug
in the model, the greedy stage or the GPU choice is caught here and the plan is never returned.
An empty list means the plan is valid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from scheduler.cycle import CycleState
from scheduler.ledger import PodAssignment
from scheduler.plan import Plan, PodPlacement
from scheduler.requests import GangRequest, PodRequest, members_of
from scheduler.snapshot import Gpu, Snapshot
from scheduler.topology import topology_of

T = TypeVar("T")


def verify(plan: Plan, snapshot: Snapshot) -> list[str]:
    """Every way ``plan`` breaks the snapshot's capacity or its requests' constraints."""
    cycle = snapshot.cycle
    # Static attributes from the cycle's node and GPU records, free amounts from its arrays
    # (the snapshot's own data: a ``with_free`` snapshot keeps only those current).
    nodes = _Records(cycle.node_index, cycle.node_info)
    gpus = _Records(cycle.gpu_number, cycle.gpu_info)
    node_cpu_free = cycle.node_cpu_free
    node_mem_free = cycle.node_mem_free
    problems: list[str] = []
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    holders: dict[str, list[bool]] = defaultdict(list)  # GPU id -> whole flag of every share
    numa: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    seen_requests: set[str] = set()
    seen_pods: set[str] = set()

    for item in plan.unschedulable:
        if item.key in seen_requests:
            problems.append(f"request {item.key} appears twice")
        seen_requests.add(item.key)

    for placement in plan.placements:
        request = placement.request
        if request.key in seen_requests:
            problems.append(f"request {request.key} appears twice")
        seen_requests.add(request.key)
        members = members_of(request)
        if [m.key for m in members] != [p.pod_key for p in placement.pods]:
            problems.append(f"{request.key}: placed pods do not match its members (all or nothing)")
            continue
        assignments: list[PodAssignment] = []
        for pod, where in zip(members, placement.pods, strict=True):
            tag = f"{request.key}/{pod.key}"
            if pod.key in seen_pods:
                problems.append(f"{tag}: pod placed twice")
            seen_pods.add(pod.key)
            node = nodes.get(where.node)
            if node is None:
                problems.append(f"{tag}: unknown node {where.node}")
                continue
            if node.cordoned:
                problems.append(f"{tag}: node {node.name} is cordoned")
            if pod.compute_class is not None and pod.compute_class not in node.compute_classes:
                problems.append(f"{tag}: node {node.name} does not serve {pod.compute_class}")
            if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
                problems.append(f"{tag}: node {node.name} does not match the node selector")
            if (where.cpu_milli, where.memory_mib) != (pod.cpu_milli, pod.memory_mib):
                problems.append(f"{tag}: CPU/memory differ from the request")
            cpu[node.name] += pod.cpu_milli
            mem[node.name] += pod.memory_mib
            if where.numa_node is not None:
                if where.numa_node not in {x.index for x in cycle.numa_of(nodes.number[node.name])}:
                    problems.append(f"{tag}: node {node.name} has no NUMA node {where.numa_node}")
                room = numa[(node.name, where.numa_node)]
                room[0] += pod.cpu_milli
                room[1] += pod.memory_mib
            problems += _check_gpus(tag, pod, where, gpus, node.name, cycle)
            for share in where.gpus:
                vram[share.gpu_id] += share.vram_mib
                sm[share.gpu_id] += share.sm_pct
                holders[share.gpu_id].append(share.whole)
            numbers = tuple(cycle.gpu_number[s.gpu_id] for s in where.gpus if s.gpu_id in gpus)
            assignments.append(PodAssignment(pod, cycle.node_index[node.name], numbers))
        level, cost = topology_of(cycle, assignments)
        if (level, cost) != (placement.topology_level, placement.topology_cost):
            problems.append(f"{request.key}: reported topology differs from the placement")
        if isinstance(request, GangRequest):
            regions = {nodes[p.node].region for p in placement.pods if p.node in nodes}
            if len(regions) > 1:
                problems.append(f"{request.key}: gang spans regions {sorted(regions)}")
            if request.required_level is not None and level > request.required_level:
                problems.append(
                    f"{request.key}: needs one {request.required_level.label}, got {level.label}"
                )

    for name, used in cpu.items():
        free = int(node_cpu_free[nodes.number[name]])
        if used > free:
            problems.append(f"node {name}: CPU over capacity ({used} > {free})")
    for name, used in mem.items():
        if used > int(node_mem_free[nodes.number[name]]):
            problems.append(f"node {name}: memory over capacity")
    for gid, flags in holders.items():
        number = gpus.number[gid]
        if vram[gid] > cycle.gpu_free_vram[number] or sm[gid] > cycle.gpu_free_sm[number]:
            problems.append(f"GPU {gid}: over capacity")
        if any(flags) and len(flags) > 1:
            problems.append(f"GPU {gid}: given whole and shared")
    for (name, index), (c, m) in numa.items():
        numa_node = next((x for x in cycle.numa_of(nodes.number[name]) if x.index == index), None)
        if numa_node is not None and (
            c > numa_node.cpu_milli_free or m > numa_node.memory_mib_free
        ):
            problems.append(f"node {name}: NUMA node {index} over capacity")
    return problems


class _Records(Generic[T]):
    """Read-only name -> record lookup over the cycle's records, without building a dict."""

    def __init__(self, number: Mapping[str, int], records: Sequence[T]) -> None:
        self.number = number
        self.records = records

    def get(self, name: str) -> T | None:
        i = self.number.get(name)
        return None if i is None else self.records[i]

    def __getitem__(self, name: str) -> T:
        return self.records[self.number[name]]

    def __contains__(self, name: object) -> bool:
        return name in self.number


def _check_gpus(
    tag: str,
    pod: PodRequest,
    where: PodPlacement,
    gpus: _Records[Gpu],
    node: str,
    cycle: CycleState,
) -> list[str]:
    problems: list[str] = []
    ids = [s.gpu_id for s in where.gpus]
    if len(set(ids)) != len(ids):
        problems.append(f"{tag}: a GPU is listed twice")
    for share in where.gpus:
        gpu = gpus.get(share.gpu_id)
        if gpu is None or gpu.node != node:
            problems.append(f"{tag}: GPU {share.gpu_id} is not on node {node}")
            continue
        if not gpu.healthy:
            problems.append(f"{tag}: GPU {gpu.id} is unhealthy")
        if pod.gpu_models and gpu.model not in pod.gpu_models:
            problems.append(f"{tag}: GPU {gpu.id} is a {gpu.model}")
        if share.index != gpu.index:
            problems.append(f"{tag}: GPU {gpu.id} has device index {gpu.index}")
        if share.whole and not (
            cycle.gpu_pristine[gpus.number[gpu.id]]
            and share.vram_mib == gpu.vram_mib
            and share.sm_pct == 100
        ):
            problems.append(f"{tag}: GPU {gpu.id} is not free to give whole")
    if pod.gpus:
        if len(where.gpus) != pod.gpus or not all(s.whole for s in where.gpus):
            problems.append(f"{tag}: wants {pod.gpus} whole GPUs")
    elif pod.gpu_slice is not None:
        s = pod.gpu_slice
        shares = [(x.vram_mib, x.sm_pct, x.whole) for x in where.gpus]
        if shares != [(s.vram_mib, s.sm_pct, False)]:
            problems.append(f"{tag}: wants one slice of {s.vram_mib} MiB and {s.sm_pct} % SM")
    elif where.gpus:
        problems.append(f"{tag}: CPU-only pod was given GPUs")
    return problems
