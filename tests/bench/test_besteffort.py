"""`tessera bench besteffort`: the exhaustive minimum, and a short run's invariants."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli
from bench.besteffort import minimum_victims


def test_the_minimum_tries_every_subset_of_a_node() -> None:
    # 4 GPUs needed: node a has 1 free and pods of 1, 1, 2 GPUs (two victims: 2 + 1);
    # node b has none free and one 4-GPU pod (one victim): b wins.
    assert minimum_victims({"a": 1, "b": 0}, {"a": [1, 1, 2], "b": [4]}, 4) == 1
    assert minimum_victims({"a": 1}, {"a": [1, 1, 2]}, 4) == 2
    assert minimum_victims({"a": 4}, {"a": [4]}, 4) == 0
    assert minimum_victims({"a": 0}, {"a": [1]}, 4) > 100  # impossible


def test_a_short_run_wastes_no_eviction_and_evicts_the_minimum(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "besteffort", "--nodes", "2", "--minutes", "10", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    runs = {r["mode"]: r for r in json.loads((tmp_path / "besteffort.json").read_text())["runs"]}
    assert set(runs) == {"preemption", "no-preemption", "empty"}
    with_preemption = runs["preemption"]
    assert with_preemption["preemptions"] > 0
    assert with_preemption["wasted_evictions"] == 0
    assert with_preemption["victims"] == with_preemption["minimum_victims"]
    assert runs["no-preemption"]["preemptions"] == 0 and runs["empty"]["preemptions"] == 0
    assert runs["empty"]["best_effort_gpu_hours"] == 0
    # The backlog keeps the pool fuller than regular work alone does.
    assert with_preemption["gpu_utilization"] > runs["empty"]["gpu_utilization"]
    assert (tmp_path / "besteffort.png").stat().st_size > 0
