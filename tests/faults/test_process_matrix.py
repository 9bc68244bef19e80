"""Billing through process faults (bench/billing_faults.py): real `tessera serve`, `tessera
scheduler`, node loop and virtual node agents, SIGKILLed while pods are running, ending, being
deleted and being placed, and started again after a short downtime, one past the nodes' lease and
one past their lost grace. Every cell: each pod billed within 1 s of what its node observed (less
its node's silences, by the documented policy), no pod run twice, the audit clean.

One set of processes per backend serves every cell (restarting a process costs seconds). The
whole matrix runs on PostgreSQL; SQLite runs a part, to keep CI short.

The cells that kill `serve` while a job ends, or the agents while pods run, hold because the
node agent sends each report again until the API acknowledges it (with the times its node
observed) and a restarted agent resumes its pods instead of running them again (agent/).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete

from app.db.models import UsageEvent
from bench.billing_faults import Cell, Plane, measure, plane_on, run_cell
from billing import ledger
from billing.usage import Reason

# Each cell costs 5-45 s (a restart takes seconds); the ones left out here (serve past the
# lease, all short and past the lease) are like their neighbours, and
# `tessera bench billing --faults N` draws from every one.
CELLS = [
    ("scheduler", "short"),
    ("serve", "short"),
    ("serve", "past-lost"),
    ("agents", "short"),
    ("agents", "past-lease"),
    ("agents", "past-lost"),
    ("all", "past-lost"),
]
ON_SQLITE = {("scheduler", "short"), ("agents", "past-lost")}
# Restarts measured to the second: run alone after the parallel suite (`make test`).
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def plane(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with plane_on(database_url, Path(tmp_path_factory.mktemp("faults"))) as running:
        yield running


# The cells run so far, by database and (target, downtime): the planted overbill reads again
# the matrix's clean scheduler cell instead of running one of its own (a cell costs 5-45 s, in
# the part of `make test` that runs alone). A cell ends with its pods removed, so reading it
# later reads the same ledger.
_cells: dict[tuple[str, str, str], Cell] = {}


def cell_of(plane: Plane, database_url: str, target: str, downtime: str) -> Cell:
    """`run_cell`, once per database and (target, downtime)."""
    key = (database_url, target, downtime)
    if key not in _cells:
        _cells[key] = run_cell(plane, target, downtime)
    return _cells[key]


def _params() -> list[object]:
    return [pytest.param(target, downtime, id=f"{target}-{downtime}") for target, downtime in CELLS]


@pytest.mark.parametrize(("target", "downtime"), _params())
def test_billing_through_a_process_fault(
    plane: Plane, database_url: str, target: str, downtime: str
) -> None:
    if database_url.startswith("sqlite") and (target, downtime) not in ON_SQLITE:
        pytest.skip("the whole matrix runs on PostgreSQL; SQLite runs a part, to keep CI short")
    cell = cell_of(plane, database_url, target, downtime)
    billed = {p.name: (p.billed, p.expected, p.ended) for p in cell.pods}
    assert {"run", "fin", "del"} <= set(billed), billed
    assert not cell.problems, (cell.problems, billed)
    assert cell.largest_error <= 1, billed


def test_the_cell_flags_a_planted_overbill(plane: Plane, database_url: str) -> None:
    """The job of a clean cell, billed 5 minutes past the end its node reported: the audit
    names it, and so does the cell's measure. (The matrix's cell, when it ran first.)"""
    cell = cell_of(plane, database_url, "scheduler", "short")
    assert not cell.problems, cell.problems

    def plant(session: object) -> None:
        uid = next(
            u
            for u, usage in ledger.usage(session, namespace=cell.namespace).items()  # type: ignore[arg-type]
            if usage.pod.name == "fin"
        )
        session.execute(  # type: ignore[attr-defined]
            delete(UsageEvent).where(UsageEvent.pod_uid == uid, UsageEvent.kind == "stop")
        )
        usage = ledger.usage(session, pod_uid=uid)[uid]  # type: ignore[arg-type]
        assert usage.started is not None
        late = usage.started + timedelta(minutes=5)
        row = {
            "uid": uid,
            "tenant_id": usage.pod.tenant_id,
            "namespace": usage.pod.namespace,
            "name": usage.pod.name,
            "node_name": None,
        }
        ledger.record(  # type: ignore[arg-type]
            session, [ledger.stopped(row, at=late, reason=Reason.FINISH)], recorded_at=late
        )

    plane.db.write(plant)
    again = Cell(cell.target, cell.downtime, cell.namespace, cell.killed_at, datetime.now(UTC))
    again.back_at, again.planned_ends = cell.back_at, cell.planned_ends
    measure(plane, again)
    assert any("past the end its node reported" in p and "fin" in p for p in again.problems)
    assert any(p.startswith("fin: billed") for p in again.problems), again.problems
    assert again.largest_error >= 290
