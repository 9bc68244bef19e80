"""Cycle state: numpy views of a snapshot, computed once and shared by every stage.

Nodes are numbered 0..N-1 in snapshot order and GPUs 0..G-1 sorted by (node, device index), so
the GPUs of node ``n`` are the contiguous range ``gpu_start[n] : gpu_start[n] + gpu_count[n]``.
Domains of each topology level get dense integer ids, so per-domain sums are one ``bincount``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler.snapshot import Gpu, Node, NumaNode, Snapshot, TopologyLevel

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _dense_ids(keys: Sequence[tuple[str, ...]]) -> IntArray:
    """Ids 0, 1, ... of the distinct keys, in the order they first appear."""
    ids: dict[tuple[str, ...], int] = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def _dense_pairs(major: IntArray, minor: IntArray) -> IntArray:
    """``_dense_ids`` of the pairs ``(major[i], minor[i])``, in numpy."""
    if not len(major):
        return np.zeros(0, dtype=np.int64)
    low = minor - minor.min()
    key = major * (int(low.max()) + 1) + low
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first), dtype=np.int64)
    return rank[inverse.reshape(-1)]


_NODE_NAME = attrgetter("name")
_NODE_PLACE = attrgetter("region", "zone", "rack")
_NODE_NUMBERS = attrgetter(
    "cpu_milli_free", "memory_mib_free", "cpu_milli_allocatable", "memory_mib_allocatable"
)
_NODE_CORDONED = attrgetter("cordoned")
_GPU_ID = attrgetter("id")
_GPU_NODE = attrgetter("node")
_GPU_NUMBERS = attrgetter(
    "index",
    "vram_mib",
    "free_vram_mib",
    "free_sm_pct",
    "healthy",
    "numa_node",
    "pcie_switch",
    "nvlink_domain",
)


@dataclass(frozen=True, eq=False)
class CycleState:
    """Read-only arrays of one snapshot (see the module docstring for the numbering).

    ``node_info``/``gpu_info`` are the nodes and GPUs (in cycle order) the state was first
    built from: read only their static attributes (names, topology, classes, labels, cordon,
    model, health); the free amounts are the arrays. ``memo`` holds caches of pure functions of
    the snapshot (scores of a shape on a node, keyed by everything they depend on); it is
    shared by the snapshots derived with ``Snapshot.with_free``.
    """

    snapshot: Snapshot
    node_names: tuple[str, ...]
    node_index: Mapping[str, int]
    # Domain id of every node at NODE, RACK, ZONE and REGION level.
    node_domain: Mapping[TopologyLevel, IntArray]
    domain_count: Mapping[TopologyLevel, int]
    node_cpu_free: IntArray
    node_mem_free: IntArray
    node_cpu_alloc: IntArray
    node_mem_alloc: IntArray
    node_cordoned: BoolArray
    node_model: IntArray  # model id of the node's GPUs, -1 for a node without GPUs
    node_gpu_start: IntArray
    node_gpu_count: IntArray
    node_whole_free: IntArray  # pristine GPUs per node
    node_domain_whole_free: IntArray  # pristine GPUs in the node's roomiest NVLink domain
    node_vram: IntArray  # VRAM of one GPU of the node (0 without GPUs)
    node_gpus: IntArray  # (nodes, max GPUs per node): GPU numbers of each node, padded with -1
    gpu_ids: tuple[str, ...]
    gpu_number: Mapping[str, int]  # GPU id -> GPU number
    gpu_node: IntArray
    gpu_index: IntArray
    gpu_vram: IntArray
    gpu_free_vram: IntArray
    gpu_free_sm: IntArray
    gpu_healthy: BoolArray
    gpu_pristine: BoolArray
    gpu_nvlink: IntArray  # global NVLink domain id
    gpu_pcie: IntArray  # global PCIe switch id
    gpu_numa: IntArray
    model_ids: Mapping[str, int]
    node_info: tuple[Node, ...] = ()
    gpu_info: tuple[Gpu, ...] = ()
    has_numa: bool = True
    memo: dict[Hashable, Any] = field(default_factory=dict, repr=False)
    _masks: dict[tuple[str, object], BoolArray] = field(default_factory=dict, repr=False)

    @property
    def cached_entries(self) -> int:
        """Entries of the caches shared with derived states (``memo`` and the node masks)."""
        return len(self.memo) + len(self._masks)

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_ids)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes' static attributes (see ``node_info``)."""
        return self.node_info

    def numa_of(self, node: int) -> tuple[NumaNode, ...]:
        return self.node_info[node].numa_nodes if self.has_numa else ()

    def domain_of(self, level: TopologyLevel, node: int) -> int:
        return int(self.node_domain[level][node])

    def serves_class(self, compute_class: str | None) -> BoolArray:
        """Nodes that serve a compute class (all nodes for None)."""
        key = ("class", compute_class)
        if key not in self._masks:
            self._masks[key] = np.array(
                [compute_class is None or compute_class in n.compute_classes for n in self.nodes],
                dtype=bool,
            )
        return self._masks[key]

    def matches_selector(self, selector: Mapping[str, str]) -> BoolArray:
        """Nodes whose labels contain every ``key=value`` of the selector."""
        items = tuple(sorted(selector.items()))
        key = ("selector", items)
        if key not in self._masks:
            self._masks[key] = np.array(
                [all(n.labels.get(k) == v for k, v in items) for n in self.nodes], dtype=bool
            )
        return self._masks[key]

    def has_model(self, models: frozenset[str]) -> BoolArray:
        """Nodes whose GPUs are of one of the models (any GPU node for an empty set)."""
        if not models:
            return self.node_model >= 0
        ids = [self.model_ids[m] for m in models if m in self.model_ids]
        return np.isin(self.node_model, np.array(ids, dtype=np.int64))

    @classmethod
    def build(cls, snapshot: Snapshot) -> CycleState:
        """Arrays of a snapshot: one C-level pass per attribute group over the nodes and GPUs,
        the rest numpy (a pool of 100,000 GPUs is a few hundred thousand attribute reads)."""
        nodes = snapshot.nodes
        n = len(nodes)
        node_names = tuple(map(_NODE_NAME, nodes))
        node_index = dict(zip(node_names, range(n), strict=True))
        places = list(map(_NODE_PLACE, nodes))
        node_domain = {
            TopologyLevel.NODE: np.arange(n, dtype=np.int64),
            TopologyLevel.RACK: _dense_ids(places),
            TopologyLevel.ZONE: _dense_ids([p[:2] for p in places]),
            TopologyLevel.REGION: _dense_ids([p[:1] for p in places]),
        }
        domain_count = {
            lvl: int(ids.max()) + 1 if len(ids) else 0 for lvl, ids in node_domain.items()
        }
        node_numbers = np.array(list(map(_NODE_NUMBERS, nodes)), dtype=np.int64).reshape(n, 4)

        gpus = list(snapshot.gpus)
        gpu_node = np.array([node_index[x] for x in map(_GPU_NODE, gpus)], dtype=np.int64)
        numbers = np.array(list(map(_GPU_NUMBERS, gpus)), dtype=np.int64).reshape(len(gpus), 8)
        # Cycle order: by (node, device index); the sort is stable, so it is skipped when the
        # snapshot lists its GPUs in that order already (as the service does).
        order = np.lexsort((numbers[:, 0], gpu_node))
        if not np.array_equal(order, np.arange(len(gpus))):
            gpus = [gpus[i] for i in order.tolist()]
            gpu_node, numbers = gpu_node[order], numbers[order]
        gpu_index, gpu_vram, gpu_free_vram, gpu_free_sm, healthy, numa, pcie, nvlink = numbers.T
        gpu_healthy = healthy.astype(bool)
        gpu_pristine = gpu_healthy & (gpu_free_vram == gpu_vram) & (gpu_free_sm == 100)
        gpu_nvlink = _dense_pairs(gpu_node, nvlink)
        gpu_pcie = _dense_pairs(gpu_node, pcie)

        gpu_count = np.bincount(gpu_node, minlength=n).astype(np.int64)
        gpu_start = np.concatenate([[0], np.cumsum(gpu_count)[:-1]]).astype(np.int64)
        node_model = np.full(n, -1, dtype=np.int64)
        node_vram = np.zeros(n, dtype=np.int64)
        model_ids: dict[str, int] = {}
        if gpus:
            # All GPUs of a node are of one model (checked by the snapshot): read the first.
            with_gpus = np.flatnonzero(gpu_count > 0)
            models = [gpus[i].model for i in gpu_start[with_gpus].tolist()]
            model_ids = {m: i for i, m in enumerate(dict.fromkeys(models))}
            node_model[with_gpus] = [model_ids[m] for m in models]
            node_vram[gpu_node] = gpu_vram
        whole_free = np.bincount(gpu_node, weights=gpu_pristine, minlength=n).astype(np.int64)
        domain_free = np.bincount(gpu_nvlink, weights=gpu_pristine).astype(np.int64)
        domain_node = np.zeros(len(domain_free), dtype=np.int64)
        domain_node[gpu_nvlink] = gpu_node
        max_domain_free = np.zeros(n, dtype=np.int64)
        np.maximum.at(max_domain_free, domain_node, domain_free)

        width = int(gpu_count.max()) if n and len(gpus) else 0
        node_gpus = np.full((n, width), -1, dtype=np.int64)
        if len(gpus):
            column = np.arange(len(gpus), dtype=np.int64) - gpu_start[gpu_node]
            node_gpus[gpu_node, column] = np.arange(len(gpus), dtype=np.int64)
        gpu_ids = tuple(map(_GPU_ID, gpus))
        cpu_free, mem_free, cpu_alloc, mem_alloc = node_numbers.T

        return cls(
            snapshot=snapshot,
            node_names=node_names,
            node_index=node_index,
            node_domain=node_domain,
            domain_count=domain_count,
            node_cpu_free=np.ascontiguousarray(cpu_free),
            node_mem_free=np.ascontiguousarray(mem_free),
            node_cpu_alloc=np.ascontiguousarray(cpu_alloc),
            node_mem_alloc=np.ascontiguousarray(mem_alloc),
            node_cordoned=np.fromiter(map(_NODE_CORDONED, nodes), dtype=bool, count=n),
            node_model=node_model,
            node_gpu_start=gpu_start,
            node_gpu_count=gpu_count,
            node_whole_free=whole_free,
            node_domain_whole_free=max_domain_free,
            node_vram=node_vram,
            node_gpus=node_gpus,
            gpu_ids=gpu_ids,
            gpu_number=dict(zip(gpu_ids, range(len(gpu_ids)), strict=True)),
            gpu_node=gpu_node,
            gpu_index=np.ascontiguousarray(gpu_index),
            gpu_vram=np.ascontiguousarray(gpu_vram),
            gpu_free_vram=np.ascontiguousarray(gpu_free_vram),
            gpu_free_sm=np.ascontiguousarray(gpu_free_sm),
            gpu_healthy=gpu_healthy,
            gpu_pristine=gpu_pristine,
            gpu_nvlink=gpu_nvlink,
            gpu_pcie=gpu_pcie,
            gpu_numa=np.ascontiguousarray(numa),
            model_ids=model_ids,
            node_info=tuple(nodes),
            gpu_info=tuple(gpus),
        )

    def with_free(
        self,
        snapshot: Snapshot,
        cpu_milli_free: npt.ArrayLike,
        memory_mib_free: npt.ArrayLike,
        gpu_free_vram_mib: npt.ArrayLike,
        gpu_free_sm_pct: npt.ArrayLike,
    ) -> CycleState:
        """This state with other free amounts (for ``Snapshot.with_free``); checks the bounds."""
        cpu = np.array(cpu_milli_free, dtype=np.int64)
        mem = np.array(memory_mib_free, dtype=np.int64)
        vram = np.array(gpu_free_vram_mib, dtype=np.int64)
        sm = np.array(gpu_free_sm_pct, dtype=np.int64)
        if cpu.shape != (self.n_nodes,) or mem.shape != (self.n_nodes,):
            raise ValueError(f"need {self.n_nodes} free CPU and memory amounts")
        if vram.shape != (self.n_gpus,) or sm.shape != (self.n_gpus,):
            raise ValueError(f"need {self.n_gpus} free VRAM and SM amounts")
        if ((cpu < 0) | (cpu > self.node_cpu_alloc)).any():
            raise ValueError("free CPU outside 0..allocatable")
        if ((mem < 0) | (mem > self.node_mem_alloc)).any():
            raise ValueError("free memory outside 0..allocatable")
        if ((vram < 0) | (vram > self.gpu_vram)).any() or ((sm < 0) | (sm > 100)).any():
            raise ValueError("free VRAM or SM % outside the GPU's capacity")
        n = self.n_nodes
        pristine = self.gpu_healthy & (vram == self.gpu_vram) & (sm == 100)
        whole_free = np.bincount(self.gpu_node, weights=pristine, minlength=n).astype(np.int64)
        max_domain_free = np.zeros(n, dtype=np.int64)
        if self.n_gpus:
            domain_free = np.bincount(self.gpu_nvlink, weights=pristine).astype(np.int64)
            domain_node = np.zeros(len(domain_free), dtype=np.int64)
            domain_node[self.gpu_nvlink] = self.gpu_node
            np.maximum.at(max_domain_free, domain_node, domain_free)
        return replace(
            self,
            snapshot=snapshot,
            node_cpu_free=cpu,
            node_mem_free=mem,
            node_whole_free=whole_free,
            node_domain_whole_free=max_domain_free,
            gpu_free_vram=vram,
            gpu_free_sm=sm,
            gpu_pristine=pristine,
            has_numa=False,
        )
