"""`tessera bench billing` at a tiny size: every figure it reports is consistent with the day it
generated (the ledger holds every transition, the reports have every row)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli
from bench.billing import day_of_transitions
from billing.usage import Reason


def test_a_generated_day_starts_resizes_and_stops_each_pod_in_order() -> None:
    transitions = day_of_transitions(1, "ns", 50, seed=3)
    assert [t.at for t in transitions] == sorted(t.at for t in transitions)
    by_pod: dict[str, list[Reason]] = {}
    for t in transitions:
        by_pod.setdefault(t.pod.uid, []).append(t.reason)
    assert len(by_pod) == 50
    for reasons in by_pod.values():
        assert reasons[0] == Reason.BIND and reasons.count(Reason.BIND) == 1
        assert reasons.count(Reason.DELETE) <= 1 and Reason.DELETE not in reasons[:-1]
    assert sum(r.count(Reason.RESIZE) for r in by_pod.values()) > 50  # frequent resizes


def test_the_billing_bench_reports_every_event_and_row(tmp_path: Path) -> None:
    args = ["billing", "--database", "sqlite", "--pods", "30", "--binds", "6"]
    result = CliRunner().invoke(cli, ["bench", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (figures,) = json.loads((tmp_path / "billing.json").read_text())
    assert figures["events"] == len(day_of_transitions(1, "bench", 30, seed=0))
    assert figures["events_per_second"] > 0 and figures["binds"] == 6
    assert figures["tenant_day_hourly_rows"] == 24 * 2  # vCPU and memory, every hour of the day
    assert (
        figures["tenant_day_rollup_seconds"] > 0 and figures["tenant_day_hourly_rolled_seconds"] > 0
    )
    assert figures["pod_day_per_second_rows"] % 2 == 0 and figures["pod_day_per_second_rows"] > 0
    assert "events/s" in result.stdout
