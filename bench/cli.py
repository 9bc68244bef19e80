"""`tessera bench ...`: the benchmark commands."""

from __future__ import annotations

import typer

from bench.openb.cli import openb

bench_app = typer.Typer(
    help="Run Tessera's benchmarks (placement quality, topology, latency, API)."
)
bench_app.command("openb")(openb)
