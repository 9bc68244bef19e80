"""The `tessera` command line."""

from __future__ import annotations

import typer

from bench.cli import bench_app

cli = typer.Typer(
    help="Tessera: a control plane for serverless GPU and CPU compute.", no_args_is_help=True
)
cli.add_typer(bench_app, name="bench")


def main() -> None:
    cli()
