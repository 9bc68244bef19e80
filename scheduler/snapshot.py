"""The immutable inventory the solver places requests on.

A :class:`Snapshot` is a picture of the pool at one instant: every node and every GPU with what is
still free on it, and the communication cost of each level of the topology tree::

    region
     └─ zone
         └─ rack            (one RDMA leaf switch)
             └─ node        (GPUs talk over PCIe)
                 └─ NVLink domain
                     └─ GPU (slices of one GPU share it)

The solver never changes a snapshot and never reads anything else. The service builds one from the
database for each scheduling cycle, and re-checks the returned plan against the database when it
commits (a stale plan is retried, never forced).

Conventions: CPU in millicores, memory and VRAM in MiB, streaming-multiprocessor share ("SM %", the
``tessera.io/gpu-core`` resource) in whole percent 0..100 of one GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy.typing as npt

    from scheduler.cycle import CycleState


class TopologyLevel(IntEnum):
    """A level of the topology tree, from the tightest (one GPU) to the widest (one region).

    A gang "within level L" has all its members inside one domain of that level.
    """

    GPU = 0
    NVLINK = 1
    NODE = 2
    RACK = 3
    ZONE = 4
    REGION = 5

    @property
    def label(self) -> str:
        return _LEVEL_LABELS[self]


_LEVEL_LABELS = {
    TopologyLevel.GPU: "GPU",
    TopologyLevel.NVLINK: "NVLink domain",
    TopologyLevel.NODE: "node",
    TopologyLevel.RACK: "rack",
    TopologyLevel.ZONE: "zone",
    TopologyLevel.REGION: "region",
}


@dataclass(frozen=True)
class TopologyCosts:
    """Communication cost of one link whose lowest shared domain is the given level.

    The topology cost of a placed gang is the weight of the tree that connects its GPUs: every
    extra child domain used inside a domain of level L adds ``cost(L)``. So a gang inside one
    NVLink domain costs ``nvlink x (GPUs - 1)``; spilling onto a second node of the same rack adds
    ``rack``; onto a second rack of the same zone adds ``zone``, and so on. Costs must not
    decrease going up the tree.
    """

    gpu: int = 0
    nvlink: int = 1
    node: int = 3
    rack: int = 10
    zone: int = 30
    region: int = 100

    def __post_init__(self) -> None:
        values = [self.of(level) for level in TopologyLevel]
        if any(v < 0 for v in values) or values != sorted(values):
            raise ValueError(f"topology costs must be >= 0 and non-decreasing upwards: {values}")

    def of(self, level: TopologyLevel) -> int:
        return int(getattr(self, level.name.lower()))


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node of a host: the CPU and memory still free on it."""

    index: int
    cpu_milli_free: int
    memory_mib_free: int


def _frozen_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Node:
    """A host in the pool.

    ``compute_classes`` are the product classes the node sells (for example ``gpu-h200`` or
    ``cpu-standard``); a pod asking for a class only lands on a node that serves it. A cordoned
    node keeps its running pods but takes no new ones. ``numa_nodes`` may be empty when the host
    does not report NUMA; then pods get no NUMA pinning.
    """

    name: str
    region: str
    zone: str
    rack: str
    cpu_milli_allocatable: int
    cpu_milli_free: int
    memory_mib_allocatable: int
    memory_mib_free: int
    compute_classes: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    cordoned: bool = False
    numa_nodes: tuple[NumaNode, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen_mapping(self.labels))
        object.__setattr__(self, "compute_classes", frozenset(self.compute_classes))
        if not 0 <= self.cpu_milli_free <= self.cpu_milli_allocatable:
            raise ValueError(f"node {self.name}: free CPU outside 0..allocatable")
        if not 0 <= self.memory_mib_free <= self.memory_mib_allocatable:
            raise ValueError(f"node {self.name}: free memory outside 0..allocatable")


@dataclass(frozen=True)
class Gpu:
    """One physical GPU.

    ``index`` is the device index on its node (what the node agent exposes to the container).
    A GPU is *pristine* when it is healthy and nothing is allocated on it: only pristine GPUs can
    be given out whole. ``nvlink_domain`` and ``pcie_switch`` are identifiers local to the node.
    """

    id: str
    node: str
    index: int
    model: str
    vram_mib: int
    sm_count: int
    free_vram_mib: int
    free_sm_pct: int
    healthy: bool = True
    numa_node: int = 0
    pcie_switch: int = 0
    nvlink_domain: int = 0
    rdma_nic: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.free_vram_mib <= self.vram_mib:
            raise ValueError(f"GPU {self.id}: free VRAM outside 0..{self.vram_mib}")
        if not 0 <= self.free_sm_pct <= 100:
            raise ValueError(f"GPU {self.id}: free SM % outside 0..100")

    @property
    def pristine(self) -> bool:
        return self.healthy and self.free_vram_mib == self.vram_mib and self.free_sm_pct == 100


@dataclass(frozen=True)
class WorkloadShape:
    """One request shape of the recent workload and how often it was seen.

    The objective measures placements against these shapes (fragmentation as the FGD policy
    does, slice packing, host stranding, model reservation). ``gpus`` > 0 is a whole-GPU shape;
    ``vram_mib``/``sm_pct`` > 0 is a slice of one GPU; neither is a CPU-only shape.
    ``gpu_models`` restricts the GPU models the shape may run on (empty: any), as
    ``PodRequest.gpu_models`` does.
    """

    weight: float
    gpus: int = 0
    vram_mib: int = 0
    sm_pct: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The pool at one instant. Build it once per cycle; never mutate it.

    Invariants (checked here): node names and GPU ids are unique, every GPU belongs to a listed
    node with a unique device index, and all GPUs of one node are of one model.
    ``workload`` is the recent distribution of request shapes; when empty, the solver measures
    fragmentation against the shapes of the batch it is solving.
    """

    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    costs: TopologyCosts = TopologyCosts()
    workload: tuple[WorkloadShape, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "gpus", tuple(self.gpus))
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        known = set(names)
        seen_ids: set[str] = set()
        seen_slots: set[tuple[str, int]] = set()
        models: dict[str, str] = {}
        for gpu in self.gpus:
            if gpu.node not in known:
                raise ValueError(f"GPU {gpu.id} is on unknown node {gpu.node}")
            if gpu.id in seen_ids or (gpu.node, gpu.index) in seen_slots:
                raise ValueError(f"GPU {gpu.id} ({gpu.node}/{gpu.index}) is listed twice")
            seen_ids.add(gpu.id)
            seen_slots.add((gpu.node, gpu.index))
            if models.setdefault(gpu.node, gpu.model) != gpu.model:
                raise ValueError(f"node {gpu.node} mixes GPU models; split it into two nodes")

    @cached_property
    def cycle(self) -> CycleState:
        """Array views of this snapshot, built once and shared by every stage of a solve."""
        from scheduler.cycle import CycleState

        return CycleState.build(self)

    def with_free(
        self,
        cpu_milli_free: npt.ArrayLike,
        memory_mib_free: npt.ArrayLike,
        gpu_free_vram_mib: npt.ArrayLike,
        gpu_free_sm_pct: npt.ArrayLike,
        *,
        workload: tuple[WorkloadShape, ...] | None = None,
    ) -> Snapshot:
        """The same pool with other free amounts, built in O(nodes + GPUs) numpy work.

        Arrays are in cycle order: nodes as listed in ``nodes``, GPUs sorted by (node, device
        index). Everything static (nodes, GPUs, topology, health, labels, the costs and, unless
        given, the workload) is shared with this snapshot; the free amounts are checked against
        the capacities. NUMA free amounts cannot be carried over, so the new snapshot reports no
        NUMA nodes (pods get no NUMA pinning). ``nodes`` and ``gpus`` of the new snapshot are
        only built if read; the solver reads the cycle state's arrays instead.
        """
        snap = object.__new__(Snapshot)
        object.__setattr__(snap, "costs", self.costs)
        object.__setattr__(snap, "workload", self.workload if workload is None else workload)
        cycle = self.cycle.with_free(
            snap, cpu_milli_free, memory_mib_free, gpu_free_vram_mib, gpu_free_sm_pct
        )
        snap.__dict__["cycle"] = cycle
        return snap

    def __getattr__(self, name: str) -> object:
        # Only reached for the lazily built ``nodes``/``gpus`` of a ``with_free`` snapshot.
        if name not in ("nodes", "gpus") or "cycle" not in self.__dict__:
            raise AttributeError(name)
        cycle = self.__dict__["cycle"]
        nodes = tuple(
            replace(
                n,
                cpu_milli_free=int(cycle.node_cpu_free[i]),
                memory_mib_free=int(cycle.node_mem_free[i]),
                numa_nodes=(),
            )
            for i, n in enumerate(cycle.node_info)
        )
        gpus = tuple(
            replace(
                g,
                free_vram_mib=int(cycle.gpu_free_vram[i]),
                free_sm_pct=int(cycle.gpu_free_sm[i]),
            )
            for i, g in enumerate(cycle.gpu_info)
        )
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "gpus", gpus)
        return nodes if name == "nodes" else gpus
