"""`tessera bench fairness`: the fair shares it plots against, and a short run's invariants."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli
from bench.fairness import fair_shares


def test_fair_shares_are_max_min_fair_with_weights() -> None:
    both = {"a": 1.0, "b": 1.0}
    # a asks for little: it gets all of it, b the rest
    assert fair_shares({"a": 10, "b": 100}, both, 64) == {"a": 10, "b": 54}
    # both ask for more than half: half each; weight 3 takes three quarters
    assert fair_shares({"a": 100, "b": 100}, both, 64) == {"a": 32, "b": 32}
    assert fair_shares({"a": 100, "b": 100}, {"a": 3.0, "b": 1.0}, 64) == {"a": 48, "b": 16}
    # nobody asks: nothing is given; one asks: it alone
    assert fair_shares({"a": 0, "b": 0}, both, 64) == {"a": 0, "b": 0}
    assert fair_shares({"a": 0, "b": 100}, both, 64) == {"a": 0, "b": 64}


def test_a_short_run_keeps_the_steady_tenant_going_only_with_fair_share(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "bench", "fairness", "--nodes", "2", "--minutes", "4", "--flood", "300",
            "--flood-at", "30", "--steady-every", "20", "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = {r["mode"]: r for r in json.loads((tmp_path / "fairness.json").read_text())["runs"]}
    assert set(runs) == {"alone", "flood", "flood, no fair share"}
    fair, unfair = runs["flood"], runs["flood, no fair share"]
    assert runs["alone"]["flood_bound"] == 0 and fair["flood_bound"] > 0
    # without fair share the steady tenant's pods created after the flood wait behind it
    assert unfair["steady_still_waiting"] > fair["steady_still_waiting"]
    # with it, the steady tenant holds about its fair share; without, far less
    assert fair["share_minus_fair"]["steady"] > unfair["share_minus_fair"]["steady"]
    assert (tmp_path / "fairness.png").stat().st_size > 0
