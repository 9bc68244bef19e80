"""`tessera bench ...`: the benchmark commands."""

from __future__ import annotations

import typer

from bench import latency, topology
from bench.api_create import api_create

bench_app = typer.Typer(
    help="Run Tessera's benchmarks (placement quality, topology, latency, API).",
    no_args_is_help=True,
)
bench_app.command("api-create")(api_create)
bench_app.command("topology")(topology.main)
bench_app.command("latency")(latency.main)
