"""The mutable state of a replay: free resources of every node and GPU, as numpy arrays.

One `ClusterState` is created per replay run and mutated in place by `place`. Each node carries a
``version`` counter, bumped whenever something is placed on it, so that policies can cache
per-node scores and recompute only the nodes that changed (one per placement).

GPU arrays are ``[N, 8]`` with the GPUs a node does not have padded with zero free capacity: they
fit nothing and count as neither free nor idle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.openb.trace import MAX_GPUS_PER_NODE, MILLI, Cluster

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

#: Affinity classes of the GpuClustering baseline: CPU-only, shared GPU, then 1/2/4/8 whole GPUs
#: (any other count gets its own class).
AFFINITY_CLASSES = 9


@dataclass(frozen=True)
class Request:
    """One pod as the policies see it (per-GPU shares in thousandths of a GPU)."""

    index: int  # position in the replay's arrival order
    cpu: int
    mem: int
    num_gpu: int
    vram: int
    sm: int
    spec_mask: int
    demand: float  # GPU-milli counted as allocated when placed (mean of the two dimensions)

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and max(self.vram, self.sm) < MILLI

    @property
    def milli(self) -> int:
        return max(self.vram, self.sm)

    @property
    def affinity(self) -> int:
        """The GpuClustering class of the request (0 = needs no GPU)."""
        if self.num_gpu == 0:
            return 0
        if self.is_share:
            return 1
        return {1: 2, 2: 3, 4: 4, 8: 5}.get(self.num_gpu, 6)


@dataclass(frozen=True)
class Placement:
    node: int
    gpus: tuple[int, ...]


class ClusterState:
    """Free CPU, memory and per-GPU memory/SM shares of every node."""

    def __init__(self, cluster: Cluster) -> None:
        n = cluster.size
        self.cluster = cluster
        self.cpu_cap = cluster.cpu.copy()
        self.mem_cap = cluster.mem.copy()
        self.n_gpu = cluster.n_gpu.copy()
        self.model = cluster.model.copy()
        self.model_bit = np.where(self.model >= 0, np.left_shift(1, np.maximum(self.model, 0)), 0)
        self.cpu_left = cluster.cpu.copy()
        self.mem_left = cluster.mem.copy()
        present = np.arange(MAX_GPUS_PER_NODE)[None, :] < self.n_gpu[:, None]
        self.vram_left: IntArray = np.where(present, MILLI, 0).astype(np.int64)
        self.sm_left: IntArray = self.vram_left.copy()
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.affinity: IntArray = np.zeros((n, AFFINITY_CLASSES), dtype=np.int64)
        self.allocated = 0.0  # GPU-milli of placed requests
        self.capacity = float(cluster.total_gpus * MILLI)

    # ----------------------------------------------------------------- queries
    @property
    def size(self) -> int:
        return int(self.cpu_left.shape[0])

    def gpu_left(self) -> IntArray:
        """The 1-D view of the GPUs: the smaller of the two free dimensions."""
        return np.minimum(self.vram_left, self.sm_left)

    def fits_gpu(self, req: Request, nodes: IntArray | slice = slice(None)) -> BoolArray:
        """``[n, 8]``: GPUs with room for one GPU's worth of `req`."""
        return (self.vram_left[nodes] >= req.vram) & (self.sm_left[nodes] >= req.sm)

    def feasible(self, req: Request) -> BoolArray:
        """Nodes where `req` fits: CPU, memory, model constraint and enough GPUs with room."""
        ok = (self.cpu_left >= req.cpu) & (self.mem_left >= req.mem)
        if req.num_gpu == 0:
            return ok
        ok &= (self.model_bit & req.spec_mask) != 0
        fits = self.fits_gpu(req)
        if req.num_gpu == 1:
            return ok & fits.any(axis=1)
        return ok & (np.count_nonzero(fits, axis=1) >= req.num_gpu)

    def exclusive_gpus(self, node: int, count: int) -> tuple[int, ...]:
        """The `count` lowest-index fully free GPUs of `node`."""
        free = np.flatnonzero((self.vram_left[node] == MILLI) & (self.sm_left[node] == MILLI))
        return tuple(int(g) for g in free[:count])

    def lowest_fitting_gpus(self, node: int, req: Request) -> tuple[int, ...]:
        """The `req.num_gpu` lowest-index GPUs of `node` with room for `req`."""
        fit = np.flatnonzero(self.fits_gpu(req, np.array([node]))[0])
        return tuple(int(g) for g in fit[: req.num_gpu])

    # ---------------------------------------------------------------- mutation
    def place(self, req: Request, placement: Placement) -> None:
        """Reserve `req` on `placement` (asserts it fits: a policy bug must not go unnoticed)."""
        n = placement.node
        if self.cpu_left[n] < req.cpu or self.mem_left[n] < req.mem:
            raise AssertionError(f"node {n} lacks CPU/memory for request {req.index}")
        if len(placement.gpus) != req.num_gpu or len(set(placement.gpus)) != req.num_gpu:
            raise AssertionError(f"request {req.index} needs {req.num_gpu} distinct GPUs")
        if req.num_gpu and not (self.model_bit[n] & req.spec_mask):
            raise AssertionError(f"node {n} model not allowed for request {req.index}")
        for g in placement.gpus:
            if not (0 <= g < self.n_gpu[n]):
                raise AssertionError(f"node {n} has no GPU {g}")
            if self.vram_left[n, g] < req.vram or self.sm_left[n, g] < req.sm:
                raise AssertionError(f"GPU {n}/{g} lacks room for request {req.index}")
        self.cpu_left[n] -= req.cpu
        self.mem_left[n] -= req.mem
        for g in placement.gpus:
            self.vram_left[n, g] -= req.vram
            self.sm_left[n, g] -= req.sm
        self.affinity[n, req.affinity] += 1
        self.version[n] += 1
        self.allocated += req.demand
