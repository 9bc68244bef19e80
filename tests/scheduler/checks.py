"""An independent check of a plan against a snapshot and a batch (shares no code with the
solver's own ``verify``), used by the property tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from scheduler.plan import Plan
from scheduler.requests import GangRequest, Request, members_of
from scheduler.snapshot import Snapshot, TopologyLevel


def check_plan(snapshot: Snapshot, batch: Sequence[Request], plan: Plan) -> None:
    nodes = {n.name: n for n in snapshot.nodes}
    gpus = {g.id: g for g in snapshot.gpus}
    keys = [p.key for p in plan.placements] + [u.key for u in plan.unschedulable]
    assert sorted(keys) == sorted(r.key for r in batch), "every request answered exactly once"

    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    vram: dict[str, int] = defaultdict(int)
    sm: dict[str, int] = defaultdict(int)
    shares: dict[str, int] = defaultdict(int)
    whole: set[str] = set()
    for placement in plan.placements:
        members = members_of(placement.request)
        assert [m.key for m in members] == [p.pod_key for p in placement.pods], "all or nothing"
        for pod, where in zip(members, placement.pods, strict=True):
            node = nodes[where.node]
            assert not node.cordoned, "cordoned node used"
            if pod.compute_class:
                assert pod.compute_class in node.compute_classes
            cpu[node.name] += pod.cpu_milli
            mem[node.name] += pod.memory_mib
            if pod.gpus:
                assert (
                    len(where.gpus) == pod.gpus and len({s.gpu_id for s in where.gpus}) == pod.gpus
                )
            elif pod.gpu_slice:
                assert len(where.gpus) == 1
                assert where.gpus[0].vram_mib == pod.gpu_slice.vram_mib
                assert where.gpus[0].sm_pct == pod.gpu_slice.sm_pct
            else:
                assert not where.gpus
            for share in where.gpus:
                gpu = gpus[share.gpu_id]
                assert gpu.node == node.name, "GPU on another node"
                assert gpu.healthy, "unhealthy GPU used"
                assert not pod.gpu_models or gpu.model in pod.gpu_models, "wrong GPU model"
                shares[gpu.id] += 1
                if share.whole:
                    whole.add(gpu.id)
                    assert gpu.free_vram_mib == gpu.vram_mib and gpu.free_sm_pct == 100
                vram[gpu.id] += share.vram_mib
                sm[gpu.id] += share.sm_pct
        if isinstance(placement.request, GangRequest):
            _check_gang(snapshot, placement.request, placement.pods)

    for name, used in cpu.items():
        assert used <= nodes[name].cpu_milli_free, f"CPU over capacity on {name}"
        assert mem[name] <= nodes[name].memory_mib_free, f"memory over capacity on {name}"
    for gid in shares:
        assert vram[gid] <= gpus[gid].free_vram_mib, f"VRAM over capacity on {gid}"
        assert sm[gid] <= gpus[gid].free_sm_pct, f"SM over capacity on {gid}"
        assert gid not in whole or shares[gid] == 1, f"{gid} given whole and shared"


def domain_key(
    snapshot: Snapshot, level: TopologyLevel, node_name: str, gpu_id: str | None
) -> tuple:
    node = next(n for n in snapshot.nodes if n.name == node_name)
    if level == TopologyLevel.GPU:
        return ("gpu", gpu_id) if gpu_id else ("cpu", node_name)
    if level == TopologyLevel.NVLINK:
        if gpu_id is None:
            return ("cpu", node_name)
        gpu = next(g for g in snapshot.gpus if g.id == gpu_id)
        return (node_name, gpu.nvlink_domain)
    if level == TopologyLevel.NODE:
        return (node_name,)
    if level == TopologyLevel.RACK:
        return (node.region, node.zone, node.rack)
    if level == TopologyLevel.ZONE:
        return (node.region, node.zone)
    return (node.region,)


def _check_gang(snapshot: Snapshot, gang: GangRequest, pods: Sequence) -> None:
    regions = {domain_key(snapshot, TopologyLevel.REGION, p.node, None) for p in pods}
    assert len(regions) == 1, "gang spans regions"
    if gang.required_level is None:
        return
    domains = set()
    for p in pods:
        for share in p.gpus or [None]:
            gid = share.gpu_id if share is not None else None
            domains.add(domain_key(snapshot, gang.required_level, p.node, gid))
    assert len(domains) == 1, f"gang {gang.key} breaks its required {gang.required_level.label}"
