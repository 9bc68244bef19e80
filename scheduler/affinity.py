"""Intra-node affinity: which GPUs of a node a pod gets, and which NUMA node its CPUs use.

A multi-GPU pod should sit inside one NVLink domain, and inside one PCIe switch where it can;
members of one gang on the same node prefer the domains the gang already uses. The pod's CPUs go
to the NUMA node of most of its GPUs when that NUMA node has room, else to the roomiest one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scheduler.cycle import CycleState, IntArray
from scheduler.ledger import Ledger, PodAssignment
from scheduler.requests import Qos


def _group(gpus: Sequence[int], key: IntArray) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for g in gpus:
        groups.setdefault(int(key[g]), []).append(g)
    return groups


def _fill(groups: dict[int, list[int]], k: int, near: frozenset[int]) -> list[int]:
    """``k`` GPUs from the groups: one group that holds all of them (preferring ``near``, then
    the tightest fit), else the near and roomiest groups first."""
    fitting = [d for d, members in groups.items() if len(members) >= k]
    if fitting:
        best = min(fitting, key=lambda d: (d not in near, len(groups[d]), d))
        return groups[best][:k]
    chosen: list[int] = []
    for d in sorted(groups, key=lambda d: (d not in near, -len(groups[d]), d)):
        chosen += groups[d][: k - len(chosen)]
        if len(chosen) == k:
            break
    return chosen


def choose_whole_gpus(
    ledger: Ledger,
    node: int,
    k: int,
    *,
    near: frozenset[int] = frozenset(),
    domain: int | None = None,
) -> list[int] | None:
    """``k`` pristine GPUs of ``node``: one NVLink domain and PCIe switch where possible.

    ``near`` are NVLink domains to prefer (the gang's); ``domain`` restricts to one domain.
    Returns None when the node has fewer than ``k`` such GPUs.
    """
    cycle = ledger.cycle
    start = int(cycle.node_gpu_start[node])
    free = [
        g
        for g in range(start, start + int(cycle.node_gpu_count[node]))
        if ledger.pristine[g] and (domain is None or cycle.gpu_nvlink[g] == domain)
    ]
    if len(free) < k:
        return None
    by_domain = _group(free, cycle.gpu_nvlink)
    fitting = [d for d, members in by_domain.items() if len(members) >= k]
    if fitting:
        best = min(fitting, key=lambda d: (d not in near, len(by_domain[d]), d))
        by_switch = _group(by_domain[best], cycle.gpu_pcie)
        return sorted(_fill(by_switch, k, frozenset()))
    return sorted(_fill(by_domain, k, near))


def assign_numa(cycle: CycleState, pods: Sequence[PodAssignment]) -> list[int | None]:
    """The NUMA node for each pod (None: the host reports none, or none has room).

    Guaranteed pods choose first. Each pod prefers the NUMA node of most of its GPUs.
    """
    free: dict[tuple[int, int], list[int]] = {}
    result: list[int | None] = [None] * len(pods)
    order = sorted(range(len(pods)), key=lambda i: (pods[i].pod.qos != Qos.GUARANTEED, i))
    for i in order:
        pod = pods[i]
        numas = cycle.numa_of(pod.node)
        if not numas:
            continue
        for numa in numas:
            free.setdefault((pod.node, numa.index), [numa.cpu_milli_free, numa.memory_mib_free])
        votes = Counter(int(cycle.gpu_numa[g]) for g in pod.gpus)
        preferred = min(votes, key=lambda n: (-votes[n], n)) if votes else None
        ranked = sorted(
            (numa.index for numa in numas),
            key=lambda n: (n != preferred, -free[(pod.node, n)][0], n),
        )
        for n in ranked:
            room = free[(pod.node, n)]
            if room[0] >= pod.pod.cpu_milli and room[1] >= pod.pod.memory_mib:
                room[0] -= pod.pod.cpu_milli
                room[1] -= pod.pod.memory_mib
                result[i] = n
                break
    return result
