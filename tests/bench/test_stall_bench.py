"""`tessera bench stall`: a short run's invariants. A scheduler or node loop stopped by
SIGSTOP (inside a transaction or not) holds no create up, the standby leads while the leader
is stopped, and nothing is bound twice or over a node's capacity."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli


def test_stalled_writers_hold_no_create_up_and_the_standby_leads(tmp_path: Path) -> None:
    pause = 8.0
    result = CliRunner().invoke(
        cli,
        [
            "bench", "stall", "--pauses", "2", "--pause-seconds", str(pause),
            "--gap-seconds", "2", "--clients", "4", "--every", "0.2", "--seed", "1",
            "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "stall.json").read_text())["summary"]
    assert summary["failed_creates"] == 0
    assert summary["bound_twice"] == 0 and summary["overcommitted_nodes"] == 0
    assert summary["bound"] > 0
    # creates went on while a process was stopped: none waited for it to come back (one that
    # waited on its locks would take about the whole pause, or PostgreSQL's idle time-out)
    paused = summary["creates_while_paused"]
    assert paused["count"] > 20
    assert paused["max_ms"] < pause * 1000 / 2
    # seed 1 stops the leading scheduler first: the standby led before it came back
    assert summary["scheduler_pauses"] >= 1
    assert summary["takeover_s"]["count"] == summary["scheduler_pauses"]
    # ...and never before the stopped leader's lease had expired (the database's clock)
    expiry = summary["takeover_after_expiry_s"]
    assert expiry["count"] == summary["scheduler_pauses"] and expiry["min"] >= 0
    assert (tmp_path / "stall.png").stat().st_size > 0
