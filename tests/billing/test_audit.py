"""The audit checks the ledger against the truth (real database, SQLite and PostgreSQL): what
nodes reported, grace deadlines, lost nodes' last renewals and the statements due. Each check
is shown clean on the real flow first, then flagging a planted overbill.

And commitments: every day of a plan has its statement, closed on time, usage or not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import delete

from app.billing_api import service
from app.db.engine import Database
from app.db.models import UsageEvent
from app.pods import service as pods
from billing import ledger
from billing.usage import Reason
from tests.billing.helpers import Clock
from tests.billing.test_node_silence import _bound, _renewing
from tests.billing.test_observed_end import (
    report,
    running,
    status,
    terminated,
)
from tests.db.test_node_leases import DURATION, Clocks, _node_with_lease, _pass
from tests.scheduler.test_loop import new_tenant

MONEY = service.Money("USD", 2)
HOUR = timedelta(hours=1)


def _audit(db: Database, ns: str, at: datetime) -> list[str]:
    tenant = db.read(lambda s: service.tenant_id(s, ns))
    return db.read(lambda s: ledger.audit(s, at=at, tenant_id=tenant, close_delay=HOUR)).problems


def _plant_stop(db: Database, ns: str, name: str, at: datetime) -> None:
    """Overbill: the pod's stop is replaced by one later (as a lost report once made it)."""

    def work(session: Any) -> None:
        uid = ledger.pod_uid(session, ns, name)
        session.execute(
            delete(UsageEvent).where(UsageEvent.pod_uid == uid, UsageEvent.kind == "stop")
        )
        row = {"uid": uid, "tenant_id": None, "namespace": ns, "name": name, "node_name": None}
        row["tenant_id"] = ledger.events(session, pod_uid=uid)[0].pod.tenant_id
        ledger.record(session, [ledger.stopped(row, at=at, reason=Reason.FINISH)], recorded_at=at)

    db.write(work)


def test_a_pod_billed_past_its_reported_end_is_flagged(db: Database, clock: Clock, place) -> None:
    ns, name = place()
    started = clock.move(1)
    report(db, ns, name, running(started))
    finished = started + timedelta(seconds=15)
    clock.move(200)
    report(
        db,
        ns,
        name,
        {"phase": "Succeeded", "containerStatuses": [status(terminated(started, finished))]},
    )
    assert _audit(db, ns, clock()) == []
    _plant_stop(db, ns, name, clock())
    (problem,) = _audit(db, ns, clock())
    assert "past the end its node reported" in problem and name in problem


def test_a_deleted_pod_billed_past_its_grace_deadline_is_flagged(
    db: Database, clock: Clock, place
) -> None:
    ns, name = place()
    report(db, ns, name, running(clock.move(1)))
    clock.move(5)
    db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=30))
    clock.move(500)  # no report; removed long past the deadline
    uid = db.read(lambda s: ledger.pod_uid(s, ns, name))
    assert db.write(lambda s: pods.finalize(s, uid=uid))
    assert _audit(db, ns, clock()) == []
    _plant_stop(db, ns, name, clock())
    (problem,) = _audit(db, ns, clock())
    assert "past its deletion's grace deadline" in problem


def test_a_pod_of_a_lost_node_billed_past_its_last_renewal_is_flagged(db: Database) -> None:
    clocks = Clocks()
    node = _node_with_lease(db, clocks.wall())
    namespace, name = _bound(db, node)
    watch = clocks.watch()
    _pass(db, watch)
    _renewing(db, node, clocks, watch, until=60)
    clocks.seconds += DURATION + 1
    _pass(db, watch)  # NotReady: paused at its last renewal
    assert _audit(db, namespace, clocks.wall()) == []

    def unpause(session: Any) -> None:
        uid = ledger.pod_uid(session, namespace, name)
        session.execute(
            delete(UsageEvent).where(UsageEvent.pod_uid == uid, UsageEvent.kind == "pause")
        )

    db.write(unpause)
    problems = _audit(db, namespace, clocks.wall())
    assert any(f"past the last renewal of its lost node {node}" in p for p in problems), problems


def test_a_plan_with_no_usage_is_closed_and_charged_every_day(db: Database) -> None:
    """20/day from two days ago, no pods: both days over are due; the audit says so until
    housekeeping closes them, each charging 20.00 and saying the plan cost 20.00 above list."""
    ns = new_tenant(db)
    now = datetime.now(UTC)
    start = now - timedelta(days=3)
    db.write(
        # the plan's term as its create writes it (app/registry/kinds/commitments.py), made then
        lambda s: service.add_term(s, tenant_id=ns.tenant_id, amount_minor=2000, at=start)
    )
    first = start.date() + timedelta(days=1)
    due = [
        first + timedelta(days=i)
        for i in range((now - HOUR).date().toordinal() - first.toordinal())
    ]
    assert due  # at least the day before yesterday is due
    problems = _audit(db, ns.name, now)
    assert len(problems) == len(due) and all("a commitment" in p for p in problems), problems

    closed = db.write(
        lambda s: ledger.close_due(
            s, at=now, delay=HOUR, currency="USD", minor_digits=2, only=ns.tenant_id
        )
    )
    assert closed == len(due)
    assert _audit(db, ns.name, now) == []
    for day in due:
        obj = db.read(
            lambda s, d=day: service.get_statement(
                s, namespace=ns.name, name=d.isoformat(), money=MONEY, at=now
            )
        )
        assert obj["status"]["phase"] == "Closed" and obj["status"]["total"] == "20.00"
        savings = next(line for line in obj["status"]["lines"] if line["kind"] == "savings")
        assert Decimal(savings["amount"]) == Decimal("-20.00")
