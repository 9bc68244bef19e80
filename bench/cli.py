"""`tessera bench ...`: the benchmark commands (`make bench` runs `tessera bench all --quick`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench import (
    besteffort,
    billing,
    burst,
    commands,
    console,
    engine,
    fairness,
    heartbeat,
    idle,
    latency,
    stall,
    start,
    topology,
)
from bench.api_create import api_create
from bench.openb.cli import openb, resolve_trace_dir
from bench.openb.trace import TRACE_SOURCE

bench_app = typer.Typer(
    help="Run Tessera's benchmarks (placement quality, topology, latency, API).",
    no_args_is_help=True,
)
bench_app.command("api-create")(api_create)
bench_app.command("openb")(openb)
bench_app.command("topology")(topology.main)
bench_app.command("latency")(latency.main)
bench_app.command("besteffort")(besteffort.main)
bench_app.command("fairness")(fairness.main)
bench_app.command("billing")(billing.main)
bench_app.command("heartbeat")(heartbeat.main)
bench_app.command("burst")(burst.main)
bench_app.command("console")(console.main)
bench_app.command("commands")(commands.main)
bench_app.command("stall")(stall.main)
bench_app.command("start")(start.main)
bench_app.command("engine")(engine.main)
bench_app.command("idle")(idle.main)


@bench_app.command("all")
def run_all(
    out: Annotated[Path, typer.Option(help="Folder for every benchmark's figures.")] = Path(
        "bench/results/latest"
    ),
    quick: Annotated[bool, typer.Option(help="Short runs (minutes, not hours).")] = False,
    trace_dir: Annotated[
        Path | None, typer.Option(help="The openb trace (default: ../shared/traces/openb).")
    ] = None,
) -> None:
    """Every benchmark, one after the other; `--quick` for the short versions."""
    typer.secho("== placement quality: openb replay", bold=True, err=True)
    try:
        resolve_trace_dir(trace_dir)
    except typer.BadParameter:
        typer.secho(f"skipped: the openb trace is not there ({TRACE_SOURCE})", err=True)
    else:
        openb(
            workloads="default" if quick else "all",
            policies="fgd,bestfit,tessera,solver" if quick else "all,tessera@64",
            seeds="42-43" if quick else "42-51",
            batch=1,
            trace_dir=trace_dir,
            out=out / "openb",
            jobs=2,
        )
    typer.secho("== topology of gangs vs the optimum", bold=True, err=True)
    topology.main(quick=quick, out=out / "topology")
    typer.secho("== solver latency on one core", bold=True, err=True)
    latency.main(quick=quick, out=out / "latency")
    typer.secho("== BestEffort preemption on a full pool", bold=True, err=True)
    besteffort.main(quick=quick, out=out / "besteffort")
    typer.secho("== fair share: one tenant floods, another creates pods", bold=True, err=True)
    fairness.main(quick=quick, out=out / "fairness")
    typer.secho("== billing: the ledger, metering on the bind path, reports", bold=True, err=True)
    billing.main(quick=quick, out=out / "billing")
    typer.secho("== a burst of pods end to end (tessera dev, SQLite)", bold=True, err=True)
    burst.main(
        database="sqlite",
        pods=2000 if quick else 10_000,
        gpus="2048" if quick else "8192",
        redis_url=None,
        out=out / "burst" / "burst.json",
    )
    typer.secho("== tessera dev at rest", bold=True, err=True)
    idle.main(runs=1 if quick else 2, out=out / "idle")
    typer.secho("== pod creates over HTTPS", bold=True, err=True)
    api_create(requests=1000 if quick else 4000, out=out / "api")
