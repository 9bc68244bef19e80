"""`tessera bench ...`: the benchmark commands."""

from __future__ import annotations

import typer

bench_app = typer.Typer(
    help="Run Tessera's benchmarks (placement quality, topology, latency, API)."
)
