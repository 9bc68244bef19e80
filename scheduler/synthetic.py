"""Synthetic pools and batches, for the tests and the benchmarks.

An H200 pool: 8 GPUs per node in one NVLink domain (NVSwitch), two PCIe switches per NUMA node,
racks of 16 nodes under one RDMA leaf, racks grouped into zones. ``fill`` uses part of the pool:
each node draws how busy it is (a Beta distribution, so some nodes are empty, some full, most in
between, as in a real pool), and a share of its busy GPUs are only partly used by slices.
Everything is drawn from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.requests import GangRequest, GpuSlice, PodRequest
from scheduler.snapshot import Gpu, Node, NumaNode, Snapshot, TopologyCosts, TopologyLevel

H200_VRAM_MIB = 141 * 1024
H200_SM = 132
H200_CPU_MILLI = 192_000
H200_MEMORY_MIB = 2 * 1024 * 1024


@dataclass(frozen=True)
class PoolShape:
    """Size of a synthetic pool: ``zones x racks_per_zone x nodes_per_rack`` nodes of
    ``gpus_per_node`` GPUs split into ``nvlink_domains`` NVLink domains."""

    zones: int = 2
    racks_per_zone: int = 2
    nodes_per_rack: int = 16
    gpus_per_node: int = 8
    nvlink_domains: int = 1
    regions: int = 1

    @property
    def nodes(self) -> int:
        return self.regions * self.zones * self.racks_per_zone * self.nodes_per_rack

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def h200_pool(
    shape: PoolShape = PoolShape(),
    *,
    fill: float = 0.0,
    sliced: float = 0.3,
    unhealthy: float = 0.0,
    cordoned: float = 0.0,
    seed: int = 0,
    costs: TopologyCosts = TopologyCosts(),
) -> Snapshot:
    """A pool of H200 nodes with about ``fill`` of its GPUs in use (``sliced`` of the busy GPUs
    partly used), ``unhealthy`` of GPUs failed and ``cordoned`` of nodes cordoned."""
    rng = np.random.default_rng(seed)
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    g_per = shape.gpus_per_node
    concentration = 2.0
    for r in range(shape.regions):
        for z in range(shape.zones):
            for k in range(shape.racks_per_zone):
                for i in range(shape.nodes_per_rack):
                    name = f"r{r}-z{z}-k{k:02d}-n{i:02d}"
                    level = (
                        rng.beta(
                            max(fill, 1e-6) * concentration, max(1 - fill, 1e-6) * concentration
                        )
                        if 0 < fill < 1
                        else fill
                    )
                    busy = round(float(level) * g_per)
                    state = np.zeros(g_per, dtype=np.int64)  # 0 free, 1 full, 2 partial
                    state[rng.permutation(g_per)[:busy]] = 1
                    partial = (state == 1) & (rng.random(g_per) < sliced)
                    state[partial] = 2
                    cpu_used = int(H200_CPU_MILLI * 0.8 * busy / g_per)
                    mem_used = int(H200_MEMORY_MIB * 0.8 * busy / g_per)
                    nodes.append(
                        Node(
                            name=name,
                            region=f"region-{r}",
                            zone=f"zone-{r}-{z}",
                            rack=f"rack-{r}-{z}-{k:02d}",
                            cpu_milli_allocatable=H200_CPU_MILLI,
                            cpu_milli_free=H200_CPU_MILLI - cpu_used,
                            memory_mib_allocatable=H200_MEMORY_MIB,
                            memory_mib_free=H200_MEMORY_MIB - mem_used,
                            compute_classes=frozenset({"gpu-h200"}),
                            labels={"tessera.io/gpu-model": "H200"},
                            cordoned=bool(rng.random() < cordoned),
                            numa_nodes=(
                                NumaNode(
                                    0,
                                    (H200_CPU_MILLI - cpu_used) // 2,
                                    (H200_MEMORY_MIB - mem_used) // 2,
                                ),
                                NumaNode(
                                    1,
                                    (H200_CPU_MILLI - cpu_used) // 2,
                                    (H200_MEMORY_MIB - mem_used) // 2,
                                ),
                            ),
                        )
                    )
                    for j in range(g_per):
                        free_vram, free_sm = H200_VRAM_MIB, 100
                        if state[j] == 1:
                            free_vram, free_sm = 0, 0
                        elif state[j] == 2:
                            free_vram = int(H200_VRAM_MIB * rng.choice([0.25, 0.5, 0.75]))
                            free_sm = int(rng.choice([25, 50, 75]))
                        gpus.append(
                            Gpu(
                                id=f"{name}-gpu{j}",
                                node=name,
                                index=j,
                                model="H200",
                                vram_mib=H200_VRAM_MIB,
                                sm_count=H200_SM,
                                free_vram_mib=free_vram,
                                free_sm_pct=free_sm,
                                healthy=bool(rng.random() >= unhealthy),
                                numa_node=0 if j < g_per // 2 else 1,
                                pcie_switch=j // max(1, g_per // 4),
                                nvlink_domain=j * shape.nvlink_domains // g_per,
                                rdma_nic=f"mlx5_{j // 2}",
                            )
                        )
    return Snapshot(tuple(nodes), tuple(gpus), costs)


SLICES = (
    GpuSlice(18 * 1024, 12),  # small inference: memory-light
    GpuSlice(35 * 1024, 25),
    GpuSlice(70 * 1024, 25),  # memory-heavy inference
    GpuSlice(24 * 1024, 50),  # compute-heavy
    GpuSlice(70 * 1024, 50),
)


def random_gang(
    rng: np.random.Generator,
    key: str,
    *,
    gpus: int,
    sliced: bool = False,
    required: TopologyLevel | None = None,
    preferred: TopologyLevel | None = None,
    priority: int = 0,
) -> GangRequest:
    """A gang of ``gpus`` GPUs: whole-GPU members of 1, 2, 4 or 8 GPUs, or one slice each."""
    if sliced:
        piece = SLICES[int(rng.integers(len(SLICES)))]
        members = [
            PodRequest(
                f"{key}-{i}",
                cpu_milli=4000,
                memory_mib=32 * 1024,
                gpu_slice=piece,
                priority=priority,
            )
            for i in range(gpus)
        ]
    else:
        per_pod = int(rng.choice([p for p in (1, 2, 4, 8) if gpus % p == 0]))
        members = [
            PodRequest(
                f"{key}-{i}",
                cpu_milli=16_000 * per_pod,
                memory_mib=128 * 1024 * per_pod,
                gpus=per_pod,
                gpu_models=frozenset({"H200"}),
                priority=priority,
            )
            for i in range(gpus // per_pod)
        ]
    return GangRequest(key, tuple(members), required_level=required, preferred_level=preferred)


def random_pods(rng: np.random.Generator, count: int, *, prefix: str = "pod") -> list[PodRequest]:
    """A mix of single pods: whole GPUs (1, 2, 4, 8), slices and CPU-only, three priorities."""
    pods: list[PodRequest] = []
    for i in range(count):
        kind = rng.random()
        priority = int(rng.choice([0, 0, 0, 1, 1, 2]))
        key = f"{prefix}-{i}"
        if kind < 0.45:
            n = int(rng.choice([1, 1, 1, 2, 2, 4, 8]))
            pods.append(
                PodRequest(
                    key, cpu_milli=16_000 * n, memory_mib=128 * 1024 * n, gpus=n, priority=priority
                )
            )
        elif kind < 0.9:
            piece = SLICES[int(rng.integers(len(SLICES)))]
            pods.append(
                PodRequest(
                    key, cpu_milli=4000, memory_mib=32 * 1024, gpu_slice=piece, priority=priority
                )
            )
        else:
            pods.append(
                PodRequest(
                    key,
                    cpu_milli=int(rng.choice([2000, 4000, 8000])),
                    memory_mib=16 * 1024,
                    priority=priority,
                )
            )
    return pods
