"""The ledger: free capacity as it changes while a plan is being built.

The cycle state is the snapshot and never changes; the ledger starts as a copy of its free
capacity and records every pod assignment made by the greedy stage or by turning a CP-SAT
solution into concrete GPUs. An undo log lets the greedy stage try a gang and roll it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.cycle import BoolArray, CycleState, IntArray
from scheduler.filter import ShapeFilter
from scheduler.jobs import Kind, Shape
from scheduler.requests import PodRequest

# Capacity reported for a shape that asks for nothing countable (no CPU, memory or GPU).
UNBOUNDED = 1 << 20


@dataclass(frozen=True)
class PodAssignment:
    """One pod on one node, with the GPUs (cycle numbers) and the VRAM/SM taken on each."""

    pod: PodRequest
    node: int
    gpus: tuple[int, ...] = ()
    vram_mib: tuple[int, ...] = ()
    sm_pct: tuple[int, ...] = ()
    whole: bool = False


class Ledger:
    """Mutable free capacity of one cycle. Not shared between solves."""

    def __init__(self, cycle: CycleState) -> None:
        self.cycle = cycle
        self.cpu = cycle.node_cpu_free.copy()
        self.mem = cycle.node_mem_free.copy()
        self.vram = cycle.gpu_free_vram.copy()
        self.sm = cycle.gpu_free_sm.copy()
        self.pristine = cycle.gpu_pristine.copy()
        self.whole = cycle.node_whole_free.copy()
        self._undo: list[tuple[str, int, int, int, bool]] = []
        # The node of every change (of the node or of one of its GPUs), undos included: lets
        # scores be cached per node and brought up to date with ``changed_since``.
        self.touched: list[int] = []

    @property
    def changes(self) -> int:
        """Changes made so far (undos count as changes)."""
        return len(self.touched)

    def changed_since(self, changes: int) -> list[int]:
        """The nodes changed since the ledger had made ``changes`` changes, in node order."""
        return sorted(set(self.touched[changes:]))

    # -- undo -------------------------------------------------------------------------------
    def mark(self) -> int:
        return len(self._undo)

    def rollback(self, mark: int) -> None:
        while len(self._undo) > mark:
            what, i, a, b, flag = self._undo.pop()
            if what == "node":
                self.cpu[i] += a
                self.mem[i] += b
                self.touched.append(int(i))
            else:
                self.touched.append(int(self.cycle.gpu_node[i]))
                self.vram[i] += a
                self.sm[i] += b
                if flag:
                    self.pristine[i] = True
                    self.whole[self.cycle.gpu_node[i]] += 1

    # -- taking capacity --------------------------------------------------------------------
    def take_node(self, node: int, cpu_milli: int, memory_mib: int) -> None:
        self.cpu[node] -= cpu_milli
        self.mem[node] -= memory_mib
        self.touched.append(int(node))
        self._undo.append(("node", node, cpu_milli, memory_mib, False))

    def take_gpu(self, gpu: int, vram_mib: int, sm_pct: int) -> None:
        was_pristine = bool(self.pristine[gpu])
        self.vram[gpu] -= vram_mib
        self.sm[gpu] -= sm_pct
        self.touched.append(int(self.cycle.gpu_node[gpu]))
        if was_pristine:
            self.pristine[gpu] = False
            self.whole[self.cycle.gpu_node[gpu]] -= 1
        self._undo.append(("gpu", gpu, vram_mib, sm_pct, was_pristine))

    def assign(self, a: PodAssignment) -> None:
        self.take_node(a.node, a.pod.cpu_milli, a.pod.memory_mib)
        for gpu, vram, sm in zip(a.gpus, a.vram_mib, a.sm_pct, strict=True):
            self.take_gpu(gpu, vram, sm)

    def whole_assignment(self, pod: PodRequest, node: int, gpus: list[int]) -> PodAssignment:
        """Give ``gpus`` (pristine GPUs of ``node``) whole to ``pod``."""
        vram = tuple(int(self.cycle.gpu_vram[g]) for g in gpus)
        return PodAssignment(pod, node, tuple(gpus), vram, (100,) * len(gpus), whole=True)

    # -- capacity ---------------------------------------------------------------------------
    def gpu_capacity(self, filt: ShapeFilter, allowed: BoolArray | None = None) -> IntArray:
        """Slices of the shape each GPU can still take (0 for GPUs that are not eligible)."""
        shape = filt.shape
        ok = filt.eligible_gpus if allowed is None else filt.eligible_gpus & allowed
        cap = np.minimum(self.vram // shape.vram_mib, self.sm // shape.sm_pct)
        return np.where(ok, cap, 0)

    def node_capacity(self, filt: ShapeFilter, *, per_domain: bool = False) -> IntArray:
        """Pods of the shape each node can still take.

        With ``per_domain``, count only the node's roomiest NVLink domain (for gangs that must
        stay inside one NVLink domain).
        """
        shape = filt.shape
        cycle = self.cycle
        cap = np.full(cycle.n_nodes, UNBOUNDED, dtype=np.int64)
        if shape.cpu_milli:
            cap = np.minimum(cap, self.cpu // shape.cpu_milli)
        if shape.memory_mib:
            cap = np.minimum(cap, self.mem // shape.memory_mib)
        if shape.kind is Kind.WHOLE:
            if per_domain:
                free = np.bincount(cycle.gpu_nvlink, weights=self.pristine & filt.eligible_gpus)
                by_domain = (free.astype(np.int64) // shape.gpus)[cycle.gpu_nvlink]
                best = np.zeros(cycle.n_nodes, dtype=np.int64)
                np.maximum.at(best, cycle.gpu_node, by_domain)
                cap = np.minimum(cap, best)
            else:
                cap = np.minimum(cap, self.whole // shape.gpus)
        elif shape.kind is Kind.SLICE:
            gpu_cap = self.gpu_capacity(filt)
            if per_domain:
                by_domain = np.bincount(cycle.gpu_nvlink, weights=gpu_cap).astype(np.int64)
                best = np.zeros(cycle.n_nodes, dtype=np.int64)
                np.maximum.at(best, cycle.gpu_node, by_domain[cycle.gpu_nvlink])
            else:
                best = np.bincount(cycle.gpu_node, weights=gpu_cap, minlength=cycle.n_nodes)
            cap = np.minimum(cap, best.astype(np.int64))
        return np.where(filt.eligible, np.maximum(cap, 0), 0)

    def node_fits(self, filt: ShapeFilter, node: int) -> bool:
        """``node_capacity(filt)[node] > 0`` for a pod without slices, for one node."""
        shape = filt.shape
        if not filt.eligible[node]:
            return False
        if shape.cpu_milli and self.cpu[node] // shape.cpu_milli <= 0:
            return False
        if shape.memory_mib and self.mem[node] // shape.memory_mib <= 0:
            return False
        return shape.kind is not Kind.WHOLE or self.whole[node] // shape.gpus > 0

    def fits_on_node(self, shape: Shape, node: int) -> bool:
        """CPU and memory for one more pod of the shape (GPUs are checked by the caller)."""
        return bool(self.cpu[node] >= shape.cpu_milli and self.mem[node] >= shape.memory_mib)
