"""Factories for small hand-made clusters and workloads (the real trace is never needed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from bench.openb.state import ClusterState, Request
from bench.openb.trace import Cluster, Pods, pods_from_rows

MODELS = ("A", "B")


def make_cluster(nodes: Sequence[tuple[int, int, int, str]]) -> Cluster:
    """Nodes as ``(cpu_milli, memory_mib, gpus, model)``."""
    return Cluster(
        names=tuple(f"node-{i}" for i in range(len(nodes))),
        cpu=np.array([n[0] for n in nodes], dtype=np.int64),
        mem=np.array([n[1] for n in nodes], dtype=np.int64),
        n_gpu=np.array([n[2] for n in nodes], dtype=np.int64),
        model=np.array([MODELS.index(n[3]) for n in nodes], dtype=np.int64),
        models=MODELS,
    )


def make_pods(rows: Sequence[tuple[int, int, int, int, str]]) -> Pods:
    """Pods as ``(cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec)``."""
    return pods_from_rows(
        [
            {
                "name": f"pod-{i:04d}",
                "cpu_milli": str(r[0]),
                "memory_mib": str(r[1]),
                "num_gpu": str(r[2]),
                "gpu_milli": str(r[3]),
                "gpu_spec": r[4],
            }
            for i, r in enumerate(rows)
        ],
        MODELS,
    )


def request(
    cpu: int = 1000,
    num_gpu: int = 1,
    milli: int = 1000,
    *,
    mem: int = 0,
    mask: int = 0b11,
    sm: int | None = None,
) -> Request:
    return Request(
        index=0,
        cpu=cpu,
        mem=mem,
        num_gpu=num_gpu,
        vram=milli,
        sm=milli if sm is None else sm,
        spec_mask=mask,
        demand=float(milli * num_gpu),
    )


@pytest.fixture
def rank4() -> np.ndarray:
    """Node order 0 < 1 < 2 < 3 (ties go to the lowest node index)."""
    return np.arange(4, dtype=np.int64)


def fill(
    state: ClusterState, node: int, gpus_left: Sequence[int], cpu_left: int | None = None
) -> None:
    """Set a node's free GPU shares (and CPU) directly, bumping its version."""
    n = len(gpus_left)
    state.vram_left[node, :n] = gpus_left
    state.sm_left[node, :n] = gpus_left
    if cpu_left is not None:
        state.cpu_left[node] = cpu_left
    state.version[node] += 1
