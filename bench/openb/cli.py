"""``tessera bench openb``: replay the Alibaba openb trace under the paper's protocol."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from bench.openb.paper import load_paper
from bench.openb.report import write_all
from bench.openb.runner import (
    default_jobs,
    make_specs,
    parse_policies,
    parse_seeds,
    parse_workloads,
    run_matrix,
)
from bench.openb.trace import TRACE_SOURCE, TraceNotFound, available_workloads, check_trace_dir
from bench.openb.variant2d import SUFFIX

DEFAULT_TRACE_DIR = Path("../shared/traces/openb")


def resolve_trace_dir(trace_dir: Path | None) -> Path:
    """The trace directory to use, or a `typer.BadParameter` that says where to get the trace."""
    candidate = trace_dir if trace_dir is not None else DEFAULT_TRACE_DIR
    try:
        return check_trace_dir(candidate)
    except TraceNotFound as exc:
        hint = "" if trace_dir is not None else f" (default {DEFAULT_TRACE_DIR})"
        raise typer.BadParameter(f"{exc}{hint}", param_hint="--trace-dir") from exc


def _command(
    workloads: str, policies: str, seeds: str, batch: int, out: Path, trace_dir: Path | None
) -> str:
    parts = ["tessera bench openb", f"--workloads {workloads}", f"--policies {policies}"]
    parts.append(f"--seeds {seeds}")
    if batch > 1:
        parts.append(f"--batch {batch}")
    if trace_dir is not None and not trace_dir.is_absolute():
        parts.append(f"--trace-dir {trace_dir}")
    parts.append(f"--out {out if not out.is_absolute() else out.name}")
    return " ".join(parts)


def openb(
    workloads: str = typer.Option(
        "default",
        help="Comma-separated workloads; 'all' = the paper's 17; suffix -2d = 2-D variant.",
    ),
    policies: str = typer.Option(
        "all",
        help="Comma-separated: random, dotprod, clustering, packing, bestfit, fgd, tessera, "
        "fgd-2d, solver (the production solver), tessera-no-loss, tessera-no-strand, "
        "tessera-no-reserve; 'all' = the first seven; 'name@N' = batching window of N arrivals.",
    ),
    seeds: str = typer.Option("42-51", help="Seeds, e.g. 42-51 or 42,43."),
    batch: int = typer.Option(1, min=1, help="Batching window (arrivals solved together)."),
    trace_dir: Path | None = typer.Option(
        None, help=f"Folder with the openb CSV files (default {DEFAULT_TRACE_DIR} when it exists)."
    ),
    out: Path = typer.Option(..., help="Output folder (results.json, summary.md, allocation.png)."),
    jobs: int = typer.Option(default_jobs(), min=1, help="Parallel worker processes."),
) -> None:
    """Replay the Alibaba openb GPU trace (Weng et al., ATC'23 protocol) for each policy.

    Reports the unallocated GPU % at 100 % arrived and the allocation % at 130 % arrived.
    """
    trace = resolve_trace_dir(trace_dir)
    known = set(available_workloads(trace))
    names = parse_workloads(workloads)
    missing = [w for w in names if w.removesuffix(SUFFIX) not in known]
    if missing:
        raise typer.BadParameter(
            f"unknown workloads {', '.join(missing)}; {trace} has {', '.join(sorted(known))} "
            f"(the trace comes from {TRACE_SOURCE})",
            param_hint="--workloads",
        )
    try:
        runs = parse_policies(policies, batch)
        seed_list = parse_seeds(seeds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    specs = make_specs(names, runs, seed_list)
    typer.echo(
        f"openb: {len(specs)} runs ({len(names)} workloads x {len(runs)} policies x "
        f"{len(seed_list)} seeds) on {jobs} processes",
        err=True,
    )
    started = time.perf_counter()
    results = run_matrix(trace, specs, jobs=jobs)
    wall = time.perf_counter() - started
    command = _command(workloads, policies, seeds, batch, out, trace_dir)
    write_all(out, results, load_paper(trace), command=command, wall_seconds=wall)
    typer.echo(f"openb: {len(specs)} runs in {wall / 60:.1f} min; wrote {out}/", err=True)
    typer.echo((out / "summary.md").read_text())
