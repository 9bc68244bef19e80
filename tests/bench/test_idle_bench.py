"""`tessera bench idle` at a tiny size, so that it cannot rot: a real `tessera dev`, started,
measured at rest and stopped."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli


def test_a_short_idle_bench_measures_a_dev_server_at_rest_and_stops_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["bench", "idle", "--runs", "1", "--settle", "1", "--seconds", "5", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads((out / "idle.json").read_text())
    assert run["tree"] == "this" and run["seconds"] >= 5
    # 88 node agents renew leases and report usage: never nothing, never every core
    assert run["cpu_s"] > 0 and 0 < run["cores"] < 2.5
    assert "of a core" in result.output


def test_the_idle_bench_refuses_a_tree_that_is_not_a_checkout(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "idle", "--tree", str(tmp_path)])
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())  # the error's box unwrapped
    assert "no Tessera checkout there" in said
