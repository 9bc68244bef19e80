"""Small cases checked against brute force: every way to place every pod is enumerated."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler.jobs import build_jobs
from scheduler.requests import GangRequest, PodRequest, Request, members_of
from scheduler.snapshot import Snapshot, TopologyLevel
from scheduler.solver import SolverConfig, solve
from tests.scheduler.checks import domain_key
from tests.scheduler.factories import PoolSpec, random_batch, random_pool

Option = tuple[str, str | None]  # (node, GPU id for a slice; None for whole GPUs and CPU-only)


def _options(snapshot: Snapshot, pod: PodRequest) -> list[Option]:
    out: list[Option] = []
    for node in snapshot.nodes:
        if node.cordoned:
            continue
        gpus = [g for g in snapshot.gpus if g.node == node.name and g.healthy]
        gpus = [g for g in gpus if not pod.gpu_models or g.model in pod.gpu_models]
        if pod.gpu_slice is not None:
            out += [(node.name, g.id) for g in gpus]
        elif pod.gpus:
            if len([g for g in gpus if g.pristine]) >= pod.gpus:
                out.append((node.name, None))
        else:
            out.append((node.name, None))
    return out


def _feasible(snapshot: Snapshot, chosen: list[tuple[PodRequest, Option]]) -> bool:
    nodes = {n.name: n for n in snapshot.nodes}
    gpus = {g.id: g for g in snapshot.gpus}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    for pod, (node, gpu) in chosen:
        cpu[node] += pod.cpu_milli
        mem[node] += pod.memory_mib
        whole[node] += pod.gpus
        if gpu is not None and pod.gpu_slice is not None:
            vram[gpu] += pod.gpu_slice.vram_mib
            sm[gpu] += pod.gpu_slice.sm_pct
    if any(cpu[n] > nodes[n].cpu_milli_free or mem[n] > nodes[n].memory_mib_free for n in cpu):
        return False
    if any(vram[g] > gpus[g].free_vram_mib or sm[g] > gpus[g].free_sm_pct for g in vram):
        return False
    for n, count in whole.items():  # whole GPUs come from pristine GPUs no slice touched
        if count:
            untouched = [
                g for g in snapshot.gpus if g.node == n and g.pristine and g.id not in vram
            ]
            models = {p.gpu_models for p, (node, _) in chosen if node == n and p.gpus}
            allowed = [g for g in untouched if all(not m or g.model in m for m in models)]
            if len(allowed) < count:
                return False
    return True


def _gang_cost(snapshot: Snapshot, placed: list[tuple[PodRequest, Option]]) -> int:
    """Tree cost with one NVLink domain per node (the pools used here)."""
    leaves: set[tuple] = set()
    for i, (pod, (node, gpu)) in enumerate(placed):
        if pod.gpus:
            leaves.update(("whole", i, k, node) for k in range(pod.gpus))
        elif gpu is not None:
            leaves.add(("gpu", gpu, node))
        else:
            leaves.add(("cpu", node, node))
    count = {TopologyLevel.GPU: len(leaves)}
    count[TopologyLevel.NVLINK] = len({(leaf[0] == "cpu", leaf[-1]) for leaf in leaves})
    for level in (TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.ZONE, TopologyLevel.REGION):
        count[level] = len({domain_key(snapshot, level, n, None) for _, (n, _) in placed})
    costs = snapshot.costs
    return sum(
        costs.of(lvl) * (count[TopologyLevel(lvl - 1)] - count[lvl])
        for lvl in TopologyLevel
        if lvl is not TopologyLevel.GPU
    )


def _meets_level(snapshot: Snapshot, gang: GangRequest, placed: list) -> bool:
    if len({domain_key(snapshot, TopologyLevel.REGION, n, None) for _, (n, _) in placed}) > 1:
        return False
    if gang.required_level is None:
        return True
    keys = {domain_key(snapshot, gang.required_level, n, g) for _, (n, g) in placed}
    return len(keys) == 1


def brute_force(snapshot: Snapshot, batch: Sequence[Request]) -> tuple[int, int]:
    """Best (placed value, then least gang topology cost) over every placement."""
    values = {}
    for job in build_jobs(batch, reference_vram_mib=max(g.vram_mib for g in snapshot.gpus)):
        for request in job.requests:
            values.update(
                {m.key: job.value for m in members_of(request)} if not job.is_gang else {}
            )
        if job.is_gang:
            values[job.key] = job.value
    best = (0, 0)
    per_request = [
        [None, *itertools.product(*(_options(snapshot, m) for m in members_of(r)))] for r in batch
    ]
    for combo in itertools.product(*per_request):
        chosen: list[tuple[PodRequest, Option]] = []
        value = cost = 0
        ok = True
        for request, where in zip(batch, combo, strict=True):
            if where is None:
                continue
            placed = list(zip(members_of(request), where, strict=True))
            if isinstance(request, GangRequest):
                if not _meets_level(snapshot, request, placed):
                    ok = False
                    break
                cost += _gang_cost(snapshot, placed) if len(placed) > 1 else 0
            value += values[request.key]
            chosen += placed
        if ok and _feasible(snapshot, chosen) and (value, -cost) > (best[0], -best[1]):
            best = (value, cost)
    return best


tiny = st.builds(
    PoolSpec,
    zones=st.just(1),
    racks=st.integers(1, 2),
    nodes=st.integers(1, 2),
    gpus=st.just(2),
    domains=st.just(1),
    fill=st.floats(0.0, 0.6),
    unhealthy=st.floats(0.0, 0.2),
    cordoned=st.floats(0.0, 0.2),
)


@settings(max_examples=60, deadline=None)
@given(spec=tiny, pool_seed=st.integers(0, 10**6), batch_seed=st.integers(0, 10**6))
@example(  # a zone-level gang that must spill across racks of one node each to leave room
    spec=PoolSpec(zones=1, racks=2, nodes=1, gpus=2, domains=1, fill=0.6),
    pool_seed=10202,
    batch_seed=326889,
)
def test_exact_mode_matches_brute_force(spec: PoolSpec, pool_seed: int, batch_seed: int) -> None:
    snapshot = random_pool(spec, pool_seed)
    if not snapshot.gpus:
        return
    batch = random_batch(batch_seed, pods=2, gangs=1, max_members=2)
    value, cost = brute_force(snapshot, batch)
    exact = solve(snapshot, batch, config=SolverConfig(exact=True))
    assert exact.stats.placed_value == value
    assert exact.stats.topology_cost == cost
    default = solve(snapshot, batch)
    assert default.stats.placed_value == value
