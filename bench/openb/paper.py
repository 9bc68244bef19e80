"""The paper authors' published results (``paper-results/analysis_allo_discrete.csv``).

One row per (workload, policy, tune ratio, seed) with the allocation % at each arrived percent
0..130. We average the seeds per workload and policy, to draw the published curves beside ours and
to report the published means in the tables.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bench.openb.protocol import MAX_PERCENT

ALLOC_FILE = "paper-results/analysis_allo_discrete.csv"

#: The artifact's policy directory names -> our policy names.
PAPER_POLICY = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


@dataclass(frozen=True)
class PaperCurves:
    """Per (workload, policy): the allocation curves of every seed, ``[seeds, 131]``."""

    curves: dict[tuple[str, str], NDArray[np.float64]]

    def mean_curve(self, workload: str, policy: str) -> NDArray[np.float64] | None:
        c = self.curves.get((workload, policy))
        return None if c is None else np.nanmean(c, axis=0)

    def unallocated(self, workload: str, policy: str) -> tuple[float, float] | None:
        """Mean and standard deviation over seeds of the unallocated GPU % at 100 % arrived."""
        return self._stat(workload, policy, 100, unallocated=True)

    def alloc_130(self, workload: str, policy: str) -> tuple[float, float] | None:
        return self._stat(workload, policy, MAX_PERCENT, unallocated=False)

    def _stat(
        self, workload: str, policy: str, percent: int, *, unallocated: bool
    ) -> tuple[float, float] | None:
        c = self.curves.get((workload, policy))
        if c is None:
            return None
        values = 100.0 - c[:, percent] if unallocated else c[:, percent]
        return float(np.mean(values)), float(np.std(values))


def load_paper(trace_dir: Path) -> PaperCurves | None:
    """The published curves, or None when `trace_dir` has no ``paper-results`` folder."""
    path = trace_dir / ALLOC_FILE
    if not path.is_file():
        return None
    rows: dict[tuple[str, str], list[list[float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            policy = PAPER_POLICY.get(row["sc_policy"])
            if policy is None:
                continue
            workload = row["workload"].removeprefix("openb_pod_list_")
            curve = [
                float(row[str(k)]) if row.get(str(k)) else np.nan for k in range(MAX_PERCENT + 1)
            ]
            rows.setdefault((workload, policy), []).append(curve)
    return PaperCurves({k: np.array(v) for k, v in rows.items()})
