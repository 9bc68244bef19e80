"""Factories for scheduler tests: small random pools and batches, built from a seed."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

from scheduler.requests import GangRequest, GpuSlice, PodRequest, Request
from scheduler.snapshot import Gpu, Node, NumaNode, Snapshot, TopologyLevel

VRAM = 80 * 1024


@dataclass(frozen=True)
class PoolSpec:
    zones: int = 1
    racks: int = 2
    nodes: int = 2
    gpus: int = 4
    domains: int = 1
    fill: float = 0.3
    unhealthy: float = 0.1
    cordoned: float = 0.1


seeds = st.integers(0, 2**31 - 1)


def pool_specs(*, racks: int = 3, nodes: int = 4, fill: float = 0.8) -> st.SearchStrategy[PoolSpec]:
    """Random small pools for property tests: 1-2 zones of up to `racks` racks of up to `nodes`
    nodes, 2, 4 or 8 GPUs a node in 1 or 2 NVLink domains, up to `fill` of it taken, up to 30 %
    of the GPUs unhealthy and of the nodes cordoned."""
    return st.builds(
        PoolSpec,
        zones=st.integers(1, 2),
        racks=st.integers(1, racks),
        nodes=st.integers(1, nodes),
        gpus=st.sampled_from([2, 4, 8]),
        domains=st.sampled_from([1, 2]),
        fill=st.floats(0.0, fill),
        unhealthy=st.floats(0.0, 0.3),
        cordoned=st.floats(0.0, 0.3),
    )


def make_node(
    name: str,
    *,
    zone: str = "z0",
    rack: str = "k0",
    cpu: int = 64_000,
    memory: int = 512 * 1024,
    cordoned: bool = False,
    classes: tuple[str, ...] = ("gpu",),
    labels: dict[str, str] | None = None,
    region: str = "r0",
) -> Node:
    return Node(
        name=name,
        region=region,
        zone=zone,
        rack=rack,
        cpu_milli_allocatable=cpu,
        cpu_milli_free=cpu,
        memory_mib_allocatable=memory,
        memory_mib_free=memory,
        compute_classes=frozenset(classes),
        labels=labels or {},
        cordoned=cordoned,
        numa_nodes=(NumaNode(0, cpu // 2, memory // 2), NumaNode(1, cpu // 2, memory // 2)),
    )


def make_gpus(
    node: str,
    count: int,
    *,
    model: str = "H100",
    domains: int = 1,
    free_vram: int = VRAM,
    free_sm: int = 100,
    healthy: bool = True,
) -> list[Gpu]:
    return [
        Gpu(
            id=f"{node}/{i}",
            node=node,
            index=i,
            model=model,
            vram_mib=VRAM,
            sm_count=132,
            free_vram_mib=free_vram,
            free_sm_pct=free_sm,
            healthy=healthy,
            numa_node=0 if i < count // 2 else 1,
            pcie_switch=i // 2,
            nvlink_domain=i * domains // max(count, 1),
        )
        for i in range(count)
    ]


def random_pool(spec: PoolSpec, seed: int) -> Snapshot:
    """A small pool with two GPU models, some CPU-only nodes, partly used GPUs, unhealthy GPUs
    and cordoned nodes."""
    rng = np.random.default_rng(seed)
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    for z in range(spec.zones):
        for k in range(spec.racks):
            for i in range(spec.nodes):
                name = f"z{z}k{k}n{i}"
                cpu = int(rng.choice([16_000, 32_000, 64_000]))
                node = make_node(
                    name,
                    zone=f"z{z}",
                    rack=f"z{z}k{k}",
                    cpu=cpu,
                    cordoned=bool(rng.random() < spec.cordoned),
                )
                cpu_free = int(rng.integers(cpu // 4, cpu + 1))
                half_memory = node.memory_mib_free // 2
                node = replace(
                    node,
                    cpu_milli_free=cpu_free,
                    numa_nodes=(
                        NumaNode(0, cpu_free // 2, half_memory),
                        NumaNode(1, cpu_free // 2, half_memory),
                    ),
                )
                nodes.append(node)
                count = 0 if rng.random() < 0.15 else spec.gpus
                model = "H100" if rng.random() < 0.7 else "A100"
                for g in make_gpus(name, count, model=model, domains=spec.domains):
                    r = rng.random()
                    if r < spec.fill / 2:
                        g = replace(g, free_vram_mib=0, free_sm_pct=0)
                    elif r < spec.fill:
                        g = replace(
                            g,
                            free_vram_mib=int(rng.integers(0, VRAM)),
                            free_sm_pct=int(rng.integers(0, 100)),
                        )
                    if rng.random() < spec.unhealthy:
                        g = replace(g, healthy=False)
                    gpus.append(g)
    return Snapshot(tuple(nodes), tuple(gpus))


def random_pod(rng: np.random.Generator, key: str, *, priority: int | None = None) -> PodRequest:
    kind = rng.random()
    prio = int(rng.integers(0, 3)) if priority is None else priority
    models = frozenset({"H100"}) if rng.random() < 0.3 else frozenset()
    cpu = int(rng.choice([1000, 4000, 8000, 16_000]))
    if kind < 0.4:
        return PodRequest(
            key,
            cpu_milli=cpu,
            memory_mib=8192,
            gpus=int(rng.choice([1, 1, 2, 4])),
            gpu_models=models,
            priority=prio,
        )
    if kind < 0.85:
        piece = GpuSlice(int(rng.choice([10, 20, 40])) * 1024, int(rng.choice([10, 25, 50])))
        return PodRequest(
            key, cpu_milli=cpu, memory_mib=8192, gpu_slice=piece, gpu_models=models, priority=prio
        )
    return PodRequest(key, cpu_milli=cpu, memory_mib=4096, priority=prio)


def random_batch(
    seed: int, *, pods: int = 4, gangs: int = 2, max_members: int = 4
) -> list[Request]:
    rng = np.random.default_rng(seed)
    batch: list[Request] = [random_pod(rng, f"p{i}") for i in range(pods)]
    levels = [
        None,
        None,
        TopologyLevel.NVLINK,
        TopologyLevel.NODE,
        TopologyLevel.RACK,
        TopologyLevel.ZONE,
    ]
    for i in range(gangs):
        size = int(rng.integers(2, max_members + 1))
        prio = int(rng.integers(0, 3))
        template = random_pod(rng, "t", priority=prio)
        members = tuple(
            PodRequest(
                f"g{i}-{m}",
                cpu_milli=template.cpu_milli,
                memory_mib=template.memory_mib,
                gpus=template.gpus,
                gpu_slice=template.gpu_slice,
                gpu_models=template.gpu_models,
                priority=prio,
            )
            for m in range(size)
        )
        required = levels[int(rng.integers(len(levels)))]
        preferred = levels[int(rng.integers(len(levels)))] if rng.random() < 0.3 else None
        batch.append(
            GangRequest(f"g{i}", members, required_level=required, preferred_level=preferred)
        )
    return batch
