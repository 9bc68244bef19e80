"""Filter stage: which nodes could hold one pod of a shape, and why every other node cannot.

Each node is checked in a fixed order and rejected by the FIRST check it fails, as Kubernetes
does, so the counts add up to the number of rejected nodes::

    cordoned -> compute class -> node selector -> has GPUs -> GPU model
             -> cpu -> memory -> nvidia.com/gpu | tessera.io/gpu-memory -> tessera.io/gpu-core

Everything is vectorised over all nodes (and all GPUs for slices) of the cycle state, once per
distinct shape in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.cycle import BoolArray, CycleState, IntArray
from scheduler.jobs import Kind, Shape

CORDONED = "cordoned"
SELECTOR = "didn't match node selector"
NO_GPU = "no GPUs"
GPU_MODEL = "wrong gpu-model"
CPU = "insufficient cpu"
MEMORY = "insufficient memory"
GPU_COUNT = "insufficient nvidia.com/gpu"
GPU_MEMORY = "insufficient tessera.io/gpu-memory"
GPU_CORE = "insufficient tessera.io/gpu-core"


def compute_class_reason(compute_class: str) -> str:
    return f"not serving compute class {compute_class}"


@dataclass(frozen=True, eq=False)
class ShapeFilter:
    """Result of the filter for one shape.

    ``eligible`` nodes pass every check that does not depend on free capacity (cordon, class,
    selector, model); ``eligible_gpus`` are the healthy GPUs of eligible nodes. ``fits`` are the
    nodes where one pod fits right now. ``rejected_by[n]`` is the index in ``checks`` of the
    check node ``n`` failed (-1 if it fits). ``reasons`` counts rejected nodes per reason, most
    frequent first.
    """

    shape: Shape
    eligible: BoolArray
    eligible_gpus: BoolArray
    fits: BoolArray
    reasons: tuple[tuple[str, int], ...]
    checks: tuple[str, ...]
    rejected_by: IntArray

    def reason_of(self, node: int) -> str | None:
        """Why node ``node`` (a cycle node number) cannot take the pod, or None if it can."""
        code = int(self.rejected_by[node])
        return None if code < 0 else self.checks[code]

    @property
    def fit_count(self) -> int:
        return int(self.fits.sum())

    def message(self) -> str:
        """Kubernetes-style summary: ``0/512 nodes are available: 300 insufficient ...``."""
        total = len(self.fits)
        detail = ", ".join(f"{count} {reason}" for reason, count in self.reasons)
        return f"{self.fit_count}/{total} nodes are available" + (f": {detail}." if detail else ".")


def filter_shape(cycle: CycleState, shape: Shape) -> ShapeFilter:
    """Run every check for one shape against the snapshot's free capacity."""
    n = cycle.n_nodes
    alive = np.ones(n, dtype=bool)
    reasons: dict[str, int] = {}
    checks: list[str] = []
    rejected_by = np.full(n, -1, dtype=np.int64)

    def reject(reason: str, failing: BoolArray) -> None:
        nonlocal alive
        hit = alive & failing
        count = int(hit.sum())
        if count:
            reasons[reason] = reasons.get(reason, 0) + count
            rejected_by[hit] = len(checks)
        checks.append(reason)
        alive = alive & ~failing

    reject(CORDONED, cycle.node_cordoned)
    if shape.compute_class is not None:
        reject(compute_class_reason(shape.compute_class), ~cycle.serves_class(shape.compute_class))
    if shape.selector:
        reject(SELECTOR, ~cycle.matches_selector(dict(shape.selector)))
    if shape.kind is not Kind.CPU:
        reject(NO_GPU, cycle.node_gpu_count == 0)
        reject(GPU_MODEL, ~cycle.has_model(shape.gpu_models))
    eligible = alive.copy()
    eligible_gpus = eligible[cycle.gpu_node] & cycle.gpu_healthy

    reject(CPU, cycle.node_cpu_free < shape.cpu_milli)
    reject(MEMORY, cycle.node_mem_free < shape.memory_mib)
    if shape.kind is Kind.WHOLE:
        reject(GPU_COUNT, cycle.node_whole_free < shape.gpus)
    elif shape.kind is Kind.SLICE:
        vram_ok = eligible_gpus & (cycle.gpu_free_vram >= shape.vram_mib)
        both_ok = vram_ok & (cycle.gpu_free_sm >= shape.sm_pct)
        reject(GPU_MEMORY, np.bincount(cycle.gpu_node[vram_ok], minlength=n) == 0)
        reject(GPU_CORE, np.bincount(cycle.gpu_node[both_ok], minlength=n) == 0)

    ordered = tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return ShapeFilter(shape, eligible, eligible_gpus, alive, ordered, tuple(checks), rejected_by)
