"""`tessera bench ...`: the benchmark commands."""

from __future__ import annotations

from importlib import import_module

import typer

bench_app = typer.Typer(
    help="Run Tessera's benchmarks (placement quality, topology, latency, API)."
)
bench_app.command("topology")(import_module("bench.topology").main)
bench_app.command("latency")(import_module("bench.latency").main)
