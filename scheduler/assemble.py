"""Assemble stage: turn pod counts into concrete GPUs, and assignments into a Plan.

CP-SAT decides how many pods of each group go to each node (GPU, for slices). Here slices are
applied first (their GPU is fixed), then whole-GPU pods pick concrete GPUs with the intra-node
affinity rules: gangs that must stay in one NVLink domain first, then the rest in job order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from scheduler.affinity import assign_numa, choose_whole_gpus
from scheduler.explain import explain
from scheduler.greedy import Assignments, Context
from scheduler.jobs import Job, Kind
from scheduler.ledger import Ledger, PodAssignment
from scheduler.plan import GpuShare, Placement, Plan, PodPlacement, SolveStats, Unschedulable
from scheduler.requests import PodRequest, Request, members_of
from scheduler.snapshot import TopologyLevel
from scheduler.topology import topology_of


def materialize(
    ctx: Context, jobs: Sequence[Job], counts: Mapping[tuple[int, int], Mapping[int, int]]
) -> Assignments | None:
    """Concrete pods from ``counts[(job, group)][target]``; None if the GPUs cannot be chosen
    (only possible for gangs confined to one NVLink domain on a node with several)."""
    cycle = ctx.cycle
    ledger = Ledger(cycle)
    chosen: dict[tuple[int, str], PodAssignment] = {}
    whole: list[tuple[Job, PodRequest, int]] = []
    for job in jobs:
        for g, group in enumerate(job.groups):
            pods = iter(group.pods)
            for target, count in sorted(counts.get((job.index, g), {}).items()):
                for _ in range(count):
                    pod = next(pods)
                    if group.shape.kind is Kind.SLICE:
                        node = int(cycle.gpu_node[target])
                        a = PodAssignment(
                            pod, node, (target,), (group.shape.vram_mib,), (group.shape.sm_pct,)
                        )
                        ledger.assign(a)
                        chosen[(job.index, pod.key)] = a
                    elif group.shape.kind is Kind.CPU:
                        a = PodAssignment(pod, target)
                        ledger.assign(a)
                        chosen[(job.index, pod.key)] = a
                    else:
                        whole.append((job, pod, target))

    confined = (TopologyLevel.GPU, TopologyLevel.NVLINK)
    whole.sort(key=lambda item: (item[0].required not in confined, item[0].index))
    near: dict[tuple[int, int], set[int]] = defaultdict(set)
    fixed_domain: dict[tuple[int, int], int] = {}
    for job, pod, node in whole:
        key = (job.index, node)
        domain = None
        if job.required in confined:
            if key not in fixed_domain:
                total = sum(p.gpus for j, p, n in whole if j is job and n == node)
                fixed_domain[key] = _domain_with_room(ledger, node, total)
            domain = fixed_domain[key]
            if domain < 0:
                return None
        gpus = choose_whole_gpus(ledger, node, pod.gpus, near=frozenset(near[key]), domain=domain)
        if gpus is None:
            return None
        a = ledger.whole_assignment(pod, node, gpus)
        ledger.assign(a)
        near[key].update(int(cycle.gpu_nvlink[g]) for g in gpus)
        chosen[(job.index, pod.key)] = a

    out: Assignments = {}
    for job in jobs:
        done = [
            chosen[(job.index, p.key)]
            for grp in job.groups
            for p in grp.pods
            if (job.index, p.key) in chosen
        ]
        if done:
            out[job.index] = done
    return out


def _domain_with_room(ledger: Ledger, node: int, gpus: int) -> int:
    """The NVLink domain of ``node`` with the fewest pristine GPUs that still holds ``gpus``."""
    cycle = ledger.cycle
    start = int(cycle.node_gpu_start[node])
    free: dict[int, int] = defaultdict(int)
    for g in range(start, start + int(cycle.node_gpu_count[node])):
        if ledger.pristine[g]:
            free[int(cycle.gpu_nvlink[g])] += 1
    fitting = [d for d, n in free.items() if n >= gpus]
    return min(fitting, key=lambda d: (free[d], d)) if fitting else -1


def build_plan(
    ctx: Context,
    requests: Sequence[Request],
    jobs: Sequence[Job],
    assignments: Assignments,
    stats: SolveStats,
) -> Plan:
    """The Plan: placements (with NUMA and topology) and reasons, in the batch's request order."""
    cycle = ctx.cycle
    flat = [a for job in jobs for a in assignments.get(job.index, [])]
    numa = dict(zip((a.pod.key for a in flat), assign_numa(cycle, flat), strict=True))

    def pod_placement(a: PodAssignment) -> PodPlacement:
        shares = tuple(
            GpuShare(cycle.gpu_ids[g], int(cycle.gpu_index[g]), v, s, a.whole)
            for g, v, s in zip(a.gpus, a.vram_mib, a.sm_pct, strict=True)
        )
        return PodPlacement(
            pod_key=a.pod.key,
            node=cycle.node_names[a.node],
            cpu_milli=a.pod.cpu_milli,
            memory_mib=a.pod.memory_mib,
            gpus=shares,
            numa_node=numa[a.pod.key],
        )

    placed: dict[str, Placement] = {}
    missing: dict[str, Unschedulable] = {}
    topology_total = 0
    value = 0
    for job in jobs:
        done = assignments.get(job.index, [])
        if job.is_gang:
            request = job.requests[0]
            if done:
                # in member order (as Placement says): a gang of several shapes is assigned
                # shape by shape
                rank = {m.key: i for i, m in enumerate(members_of(request))}
                done = sorted(done, key=lambda a: rank.get(a.pod.key, len(rank)))
                level, cost = topology_of(cycle, done)
                placed[request.key] = Placement(
                    request, tuple(pod_placement(a) for a in done), level, cost
                )
                topology_total += cost
                value += job.value
            else:
                missing[request.key] = explain(ctx, job)
            continue
        by_key = {a.pod.key: a for a in done}
        for pod in job.groups[0].pods:
            a = by_key.get(pod.key)
            if a is None:
                missing[pod.key] = explain(ctx, job, pod=pod)
            else:
                level, cost = topology_of(cycle, [a])
                placed[pod.key] = Placement(pod, (pod_placement(a),), level, cost)
                value += job.value

    order = [r.key for r in requests]
    return Plan(
        placements=tuple(placed[k] for k in order if k in placed),
        unschedulable=tuple(missing[k] for k in order if k in missing),
        stats=replace(stats, placed_value=value, topology_cost=topology_total),
    )
