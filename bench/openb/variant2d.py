"""A two-dimensional variant of the openb workloads: GPU slices whose memory and SM shares differ.

The trace gives one number per fractional pod (``gpu_milli``). Tessera sells the two dimensions of
a GPU separately (VRAM GiB and SM %), so we derive, from any workload ``W``, a workload ``W-2d`` in
which fractional pods come in three kinds, drawn once with a fixed seed (so every run and every
machine sees the same variant):

- 40 % *memory-heavy* slices (inference serving a large model): VRAM share ``min(1000, 1.5 x)``,
  SM share ``2 x - VRAM``;
- 40 % *compute-heavy* slices: the same two numbers swapped;
- 20 % *balanced* slices: ``x`` in both dimensions;

where ``x`` is the trace's ``gpu_milli`` (rounded to tens). Every slice keeps its mean share ``x``,
so the variant has exactly the GPU demand of the original workload; whole-GPU and CPU-only pods are
unchanged. The allocation metric counts a pod's demand as the mean of its two shares.

Policies that only know one GPU dimension (the paper's six) see each slice by its larger share in
both dimensions: they book ``max(VRAM, SM)`` of the GPU, never over-committing either dimension
(the way a 1-D GPU-sharing scheduler must treat a request it cannot express). Tessera, and the
``fgd-2d`` policy (FGD's rule with the 2-D fragment measure of :mod:`scheduler.scoring`), see both
dimensions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.openb.trace import MILLI, Pods, load_pods

SUFFIX = "-2d"
SEED = 20230710
MEMORY_HEAVY = 0.4
COMPUTE_HEAVY = 0.4
SKEW = 1.5


def _round10(x: np.ndarray) -> np.ndarray:
    return (np.floor(x / 10.0 + 0.5) * 10).astype(np.int64)


def make_2d(pods: Pods, seed: int = SEED) -> Pods:
    """The 2-D variant of `pods` (deterministic for a given seed)."""
    rng = np.random.default_rng(seed)
    kind = rng.random(pods.size)
    share = (pods.num_gpu == 1) & (pods.vram < MILLI)
    heavy = np.minimum(MILLI, _round10(pods.vram * SKEW))
    light = 2 * pods.vram - heavy
    memory = share & (kind < MEMORY_HEAVY)
    compute = share & (kind >= MEMORY_HEAVY) & (kind < MEMORY_HEAVY + COMPUTE_HEAVY)
    vram = np.where(memory, heavy, np.where(compute, light, pods.vram))
    sm = np.where(memory, light, np.where(compute, heavy, pods.sm))
    return replace(pods, vram=vram.astype(np.int64), sm=sm.astype(np.int64))


def one_dimensional(pods: Pods) -> Pods:
    """What a 1-D policy sees: each slice booked at its larger share in both dimensions."""
    milli = pods.milli
    return replace(pods, vram=milli.copy(), sm=milli.copy())


def load_workload(trace_dir: Path, name: str, models: tuple[str, ...]) -> tuple[Pods, Pods]:
    """``(pods, 1-D view)`` of workload `name`; a ``-2d`` suffix selects the 2-D variant."""
    if name.endswith(SUFFIX):
        pods = make_2d(load_pods(trace_dir, name.removesuffix(SUFFIX), models))
        return pods, one_dimensional(pods)
    pods = load_pods(trace_dir, name, models)
    return pods, pods
