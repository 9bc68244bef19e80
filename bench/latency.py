"""Benchmark 3, latency: solve time on one core, on a large pool.

The pool is a synthetic H200 pool of ``--gpus`` GPUs (8 per node, racks of 16 nodes, 20 racks
per zone), about ``--fill`` of it in use. Two workloads:

* **gang**: one 8-GPU gang (members of 1, 2, 4 or 8 GPUs, drawn at random), ``--repeats``
  times; p50 / p99 / max of the solve time;
* **batch**: ``--batch`` mixed single pods (whole GPUs, slices, CPU-only; three priorities),
  ``--batch-repeats`` times with different seeds.

Every timed call is ``scheduler.solve`` on a fresh ``Snapshot`` object, so the cycle state
(the snapshot's numpy views) is rebuilt inside the timing. With ``--derived``, each snapshot is
derived from the pool kept in memory (``Snapshot.with_free``, inside the timing), as the
scheduling loop does while only free amounts change. CP-SAT runs with one worker, and the
process is pinned to one CPU core where the OS allows it. The peak resident memory is printed.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from bench.stats import quantile
from scheduler.plan import Plan
from scheduler.requests import Request
from scheduler.snapshot import Snapshot
from scheduler.solver import SolverConfig, solve
from scheduler.synthetic import PoolShape, h200_pool, random_gang, random_pods


def _pin_to_one_core() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def _timed(
    snapshot: Snapshot, batch: list[Request], config: SolverConfig, *, derived: bool = False
) -> tuple[float, Plan]:
    if derived:
        # The pool kept in memory: the static arrays are built once, each cycle only brings
        # the free amounts (``Snapshot.with_free``, numpy work, inside the timing).
        cycle = snapshot.cycle
        started = time.perf_counter()
        fresh = snapshot.with_free(
            cycle.node_cpu_free, cycle.node_mem_free, cycle.gpu_free_vram, cycle.gpu_free_sm
        )
    else:
        fresh = Snapshot(snapshot.nodes, snapshot.gpus, snapshot.costs, snapshot.workload)
        started = time.perf_counter()
    plan = solve(fresh, batch, config=config)
    return time.perf_counter() - started, plan


def _peak_rss_mib() -> float:
    """Peak resident memory of this process so far (the pool, its cycle states, the solver)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return round(kib / (1024 * 1024) if sys.platform == "darwin" else kib / 1024, 1)


def main(
    gpus: Annotated[int, typer.Option(help="GPUs in the pool (a multiple of 128).")] = 10_240,
    fill: Annotated[float, typer.Option(help="Share of the pool in use.")] = 0.6,
    repeats: Annotated[int, typer.Option(help="Timed solves of one 8-GPU gang.")] = 200,
    batch: Annotated[int, typer.Option(help="Pods in the mixed batch.")] = 1000,
    batch_repeats: Annotated[int, typer.Option(help="Timed solves of the batch.")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the pool and the requests.")] = 0,
    quick: Annotated[bool, typer.Option(help="A short run (20 gangs, 1 batch).")] = False,
    out: Annotated[Path | None, typer.Option(help="Write DIR/latency.json.")] = None,
    derived: Annotated[
        bool,
        typer.Option(
            help="Derive each cycle's snapshot from the pool kept in memory (Snapshot.with_free)"
            " instead of building it from the nodes and GPUs."
        ),
    ] = False,
) -> None:
    """Solve time of one 8-GPU gang and of a 1,000-pod batch on a 10,240-GPU pool."""
    if quick:
        repeats, batch_repeats = min(repeats, 20), 1
    core = _pin_to_one_core()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    racks = max(1, gpus // (8 * 16))
    shape = PoolShape(zones=max(1, racks // 20), racks_per_zone=min(racks, 20), nodes_per_rack=16)
    print(f"building a {shape.gpus}-GPU pool, {fill:.0%} full ...", file=sys.stderr)
    snapshot = h200_pool(shape, fill=fill, seed=seed)
    config = SolverConfig(num_workers=1, seed=seed)
    rng = np.random.default_rng(seed)
    _timed(snapshot, [random_gang(rng, "warmup", gpus=8)], config, derived=derived)  # imports

    gang_times: list[float] = []
    methods: dict[str, int] = {}
    placed = 0
    for i in range(repeats):
        seconds, plan = _timed(
            snapshot, [random_gang(rng, f"g{i}", gpus=8)], config, derived=derived
        )
        gang_times.append(seconds)
        methods[plan.stats.method] = methods.get(plan.stats.method, 0) + 1
        placed += len(plan.placements)
        if (i + 1) % max(1, repeats // 10) == 0:
            print(f"gang {i + 1}/{repeats}: last {seconds * 1000:.1f} ms", file=sys.stderr)

    batch_rows: list[dict[str, Any]] = []
    for r in range(batch_repeats):
        pods: list[Request] = list(random_pods(np.random.default_rng(seed + 1 + r), batch))
        seconds, plan = _timed(snapshot, pods, config, derived=derived)
        batch_rows.append(
            {
                "seed": seed + 1 + r,
                "seconds": round(seconds, 4),
                "placed": len(plan.placements),
                "method": plan.stats.method,
                "cpsat_status": plan.stats.cpsat_status,
                "variables": plan.stats.variables,
            }
        )
        print(
            f"batch {r + 1}/{batch_repeats}: {seconds:.3f} s, {len(plan.placements)} placed",
            file=sys.stderr,
        )

    batch_times = [row["seconds"] for row in batch_rows]
    result = {
        "benchmark": "latency",
        "load_average": {
            "before": load_before,
            "after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "cores": os.cpu_count(),
        },
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "pinned_core": core,
        },
        "pool": {"gpus": shape.gpus, "nodes": shape.nodes, "fill": fill, "derived": derived},
        "config": {
            "num_workers": config.num_workers,
            "time_limit_s": config.time_limit_s,
            "deterministic_time": config.deterministic_time,
        },
        "gang": {
            "gpus": 8,
            "repeats": repeats,
            "placed": placed,
            "methods": methods,
            "p50_ms": round(1000 * quantile(gang_times, 0.5), 2),
            "p99_ms": round(1000 * quantile(gang_times, 0.99), 2),
            "max_ms": round(1000 * max(gang_times), 2),
            "mean_ms": round(1000 * statistics.fmean(gang_times), 2),
            "target_p99_ms": 50,  # at 100,000 GPUs and more
        },
        "peak_rss_mib": _peak_rss_mib(),
        "batch": {
            "pods": batch,
            "runs": batch_rows,
            "max_s": round(max(batch_times), 3),
            "mean_s": round(statistics.fmean(batch_times), 3),
            "target_s": 1.0,  # at 100,000 GPUs and more
        },
    }
    print(json.dumps({k: result[k] for k in ("gang", "batch", "peak_rss_mib")}, indent=2))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "latency.json").write_text(json.dumps(result, indent=2) + "\n")
