"""Run a matrix of replays (workloads x policies x seeds) on a process pool, with progress.

Each worker process loads the cluster and the workloads it needs once (cached per process) and
runs whole replays; the parent prints ``runs done / total``, the last run and an ETA on stderr.
The most expensive runs are submitted first so that the pool stays busy until the end.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from bench.openb.replay import RunResult, RunSpec, replay
from bench.openb.trace import PAPER_WORKLOADS, Cluster, Pods, load_cluster
from bench.openb.variant2d import load_workload

POLICIES: tuple[str, ...] = (
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "tessera",
)
#: Policies that see both GPU dimensions of a slice (the others see the 1-D projection).
EXTRA_POLICIES = (
    "fgd-2d",
    "tessera-no-loss",
    "tessera-no-strand",
    "tessera-no-reserve",
    "solver",  # the production solver (scheduler.solver.solve), see bench/openb/solver.py
)
TWO_D_POLICIES = ("tessera", "fgd-2d", "tessera-no-loss", "tessera-no-strand", "tessera-no-reserve")
#: Rough relative cost of one run, to submit the long ones first.
_COST = {
    "fgd": 3.0,
    "fgd-2d": 3.0,
    **{p: 4.0 for p in ("tessera", "tessera-no-loss", "tessera-no-strand", "tessera-no-reserve")},
    "solver": 40.0,
}


@dataclass(frozen=True)
class PolicyRun:
    """A policy name and its batching window (``tessera@64`` = Tessera with 64-pod windows)."""

    name: str
    batch: int = 1

    @property
    def label(self) -> str:
        return f"{self.name}@{self.batch}" if self.batch > 1 else self.name


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` -> 42..51; ``"42,45,50-51"`` -> [42, 45, 50, 51]."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds


def parse_workloads(text: str) -> list[str]:
    """Comma-separated workload names; ``all`` = the paper's 17 workloads."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            out.extend(PAPER_WORKLOADS)
        elif part:
            out.append(part)
    return list(dict.fromkeys(out))


def parse_policies(text: str, batch: int) -> list[PolicyRun]:
    """Comma-separated policies (``all`` = baselines and Tessera); ``name@N`` sets a window."""
    out: list[PolicyRun] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, window = part.partition("@")
        names = list(POLICIES) if name == "all" else [name]
        for n in names:
            if n not in POLICIES + EXTRA_POLICIES:
                known = ", ".join(POLICIES + EXTRA_POLICIES)
                raise ValueError(f"unknown policy {n!r}; known: {known}")
            out.append(PolicyRun(n, int(window) if window else batch))
    return list(dict.fromkeys(out))


@lru_cache(maxsize=1)
def _cluster(trace_dir: str) -> Cluster:
    return load_cluster(Path(trace_dir))


@lru_cache(maxsize=8)
def _workload(trace_dir: str, workload: str) -> tuple[Pods, Pods]:
    return load_workload(Path(trace_dir), workload, _cluster(trace_dir).models)


def run_one(trace_dir: str, spec: RunSpec) -> RunResult:
    """One replay in a worker process (cluster and workload cached per process)."""
    truth, one_d = _workload(trace_dir, spec.workload)
    view = truth if spec.policy in TWO_D_POLICIES else one_d
    return replay(_cluster(trace_dir), truth, spec, policy_view=view)


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_matrix(
    trace_dir: Path,
    specs: Sequence[RunSpec],
    *,
    jobs: int,
    log: TextIO = sys.stderr,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec (in a pool of `jobs` processes; 1 = in this process), in spec order."""
    ordered = sorted(specs, key=lambda s: -_COST.get(s.policy, 1.0) * (1 + (s.batch > 1)))
    started = time.perf_counter()
    results: dict[RunSpec, RunResult] = {}

    def report(res: RunResult) -> None:
        results[res.spec] = res
        done = len(results)
        elapsed = time.perf_counter() - started
        eta = elapsed / done * (len(ordered) - done)
        log.write(
            f"[{done:4d}/{len(ordered)}] {res.spec.label:32s} {res.cpu_seconds:5.1f}s cpu  "
            f"unalloc@100 {res.unallocated_100:6.2f}%  elapsed {_fmt(elapsed)}  ETA {_fmt(eta)}\n"
        )
        log.flush()
        if on_result is not None:
            on_result(res)

    if jobs <= 1:
        for spec in ordered:
            report(run_one(str(trace_dir), spec))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            pending: set[Future[RunResult]] = {
                pool.submit(run_one, str(trace_dir), spec) for spec in ordered
            }
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    report(fut.result())
    return [results[s] for s in specs]


def default_jobs() -> int:
    return os.cpu_count() or 1


def make_specs(
    workloads: Iterable[str], policies: Iterable[PolicyRun], seeds: Iterable[int]
) -> list[RunSpec]:
    return [RunSpec(w, p.name, s, p.batch) for w in workloads for p in policies for s in seeds]
