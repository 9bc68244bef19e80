"""The paper's replay protocol: arrival order, workload inflation, target shapes, and the metric.

These follow the paper's simulator (Weng et al., USENIX ATC'23; its public artifact), step by step:

1. **Shuffle**: the workload's pods, sorted by name, are shuffled with the run's seed.
2. **Tune to 1.3x** (``tune``): if the workload's total GPU request is below 1.3 x the cluster's GPU
   capacity, pods drawn uniformly at random (with replacement) from the original workload are
   appended until the next one would overshoot; above it, pods are removed at random until the
   total is at most the target. As in the artifact, the overshoot test of the append loop compares
   with the drawn pod's *per-GPU* share (not its total over all its GPUs), so a multi-GPU draw can
   end a little past 1.3x; a CPU-only draw never stops the loop.
3. **Typical pods** (the FGD target): the *original* workload (before tuning, CPU-only pods
   included) grouped by ``(cpu_milli, gpu_milli, num_gpu, gpu_spec)``, the most frequent groups kept
   until they cover 95 % of the pods, renormalised.
4. **Metric**: after each scheduling decision the simulator logs the arrived GPU request and the
   allocated GPU (both in GPU-milli). Per run, for each integer percent ``k`` in 0..130, the
   allocation % at ``k`` % arrived is the mean of the logged allocation ratios (each rounded to
   2 decimals) over the log lines whose arrived ratio rounds to ``k`` %; when there is none, over
   the lines whose rounded arrived ratio is within ``k +- 1``.
   The headline figure is ``100 - alloc(100)``: the unallocated GPU % when the arrived request
   equals the cluster's capacity.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from bench.openb.trace import Pods
from scheduler.scoring import TargetShapes, target_shapes

TUNE_RATIO = 1.3
MAX_PERCENT = 130
TYPICAL_COVERAGE = 0.95


def arrival_order(
    pods: Pods, capacity_milli: float, rng: np.random.Generator, ratio: float = TUNE_RATIO
) -> NDArray[np.int64]:
    """Indices into `pods` (repetitions allowed): the order in which the pods arrive."""
    by_name = np.array(sorted(range(pods.size), key=lambda i: pods.names[i]), dtype=np.int64)
    order = list(by_name[rng.permutation(pods.size)])
    per_gpu = (pods.vram + pods.sm) / 2.0
    total_req = pods.gpu_demand()
    total = float(total_req.sum())
    target = ratio * capacity_milli
    if total < target:
        while True:  # tune up
            i = int(by_name[rng.integers(pods.size)])
            if total + per_gpu[i] > target:
                break
            total += total_req[i]
            order.append(i)
    else:
        while total > target:  # tune down
            k = int(rng.integers(len(order)))
            total -= total_req[order.pop(k)]
    return np.array(order, dtype=np.int64)


def typical_shapes(pods: Pods, coverage: float = TYPICAL_COVERAGE) -> TargetShapes:
    """The FGD target distribution of the workload `pods` (the original, untuned workload)."""
    return target_shapes(
        cpu=pods.cpu,
        vram=pods.vram,
        sm=pods.sm,
        count=pods.num_gpu,
        model_mask=pods.spec_mask,
        label=list(pods.spec),
        mem=pods.mem,
        coverage=coverage,
    )


def discrete_allocation(
    arrived: NDArray[np.float64], allocated: NDArray[np.float64], capacity_milli: float
) -> NDArray[np.float64]:
    """Allocation % at each arrived percent 0..130 from the per-decision log (NaN where no data)."""
    arrived_pct = np.round(np.asarray(arrived) / capacity_milli * 100.0)
    alloc_pct = np.round(np.asarray(allocated) / capacity_milli * 100.0, 2)
    out = np.full(MAX_PERCENT + 1, np.nan)
    for k in range(MAX_PERCENT + 1):
        rows = arrived_pct == k
        if not rows.any():
            rows = (arrived_pct >= k - 1) & (arrived_pct <= k + 1)
        if rows.any():
            out[k] = round(float(alloc_pct[rows].mean()), 2)
    return out
