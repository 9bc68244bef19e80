"""Billing ends when the node saw the pod's containers end, not when the report arrived (real
database, SQLite and PostgreSQL; the pod service's clock is moved, nothing sleeps).

A report that comes late because the API was down ends billing at the observed time; the same
report twice bills once; the observed end is bounded: never before the bind, never after the
report (a node clock running ahead), never after the grace deadline of a deletion."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.db.engine import Database
from app.pods import service as pods
from app.pods.schemas import ReportedPodStatus
from billing import ledger
from tests.billing.helpers import Clock


def text(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def running(started: datetime) -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [status({"running": {"startedAt": text(started)}})],
    }


def status(state: dict[str, Any], restarts: int = 0) -> dict[str, Any]:
    return {"name": "main", "ready": "running" in state, "restartCount": restarts, "state": state}


def terminated(started: datetime, finished: datetime, code: int = 0) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": text(started),
            "finishedAt": text(finished),
        }
    }


def report(db: Database, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    reported = ReportedPodStatus.model_validate(body)
    return db.write(
        lambda s: pods.report_status(s, namespace=ns, name=name, status=reported, node=None)
    )


def billed(db: Database, ns: str, name: str, now: datetime) -> tuple[int, bool]:
    def read(session: Any) -> tuple[int, bool]:
        uid = ledger.pod_uid(session, ns, name)
        usage = ledger.usage(session, pod_uid=uid)[uid]
        return usage.billed_seconds(now), usage.open

    return db.read(read)


def test_a_late_report_of_an_end_during_an_outage_bills_to_the_observed_end(
    db: Database, clock: Clock, place
) -> None:
    ns, name = place()
    bound = clock()
    started = clock.move(1)
    report(db, ns, name, running(started))
    # The container ends 15 s later while the API is down; the node's report comes 3 min later.
    finished = started + timedelta(seconds=15)
    clock.move(180)
    done = {"phase": "Succeeded", "containerStatuses": [status(terminated(started, finished))]}
    obj = report(db, ns, name, done)
    assert obj["status"]["phase"] == "Succeeded"
    assert billed(db, ns, name, clock()) == (int((finished - bound).total_seconds()), False)
    # The same report again (the node retries until it hears back): nothing more is billed.
    clock.move(60)
    again = report(db, ns, name, done)
    assert again["status"]["phase"] == "Succeeded"
    assert billed(db, ns, name, clock()) == (16, False)
    events = db.read(lambda s: ledger.events(s, pod_uid=ledger.pod_uid(s, ns, name)))
    assert [e.kind for e in events] == ["start", "stop"]


def test_a_deleted_pod_is_billed_to_its_containers_stop_or_its_grace_deadline(
    db: Database, clock: Clock, place
) -> None:
    # The node reported the containers stopped 2 s after the delete, then removed the pod late.
    ns, name = place()
    bound = clock()
    started = clock.move(1)
    report(db, ns, name, running(started))
    deleted = clock.move(10)
    db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=30))
    stopped = deleted + timedelta(seconds=2)
    report(
        db,
        ns,
        name,
        {"phase": "Running", "containerStatuses": [status(terminated(started, stopped))]},
    )
    clock.move(400)  # the API was down: the removal comes long after the grace deadline
    db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=0))
    assert billed(db, ns, name, clock()) == (int((stopped - bound).total_seconds()), False)

    # No report at all: the node loop removes it past its grace deadline, billed to the deadline.
    ns, name = place()
    bound = clock()
    report(db, ns, name, running(clock.move(1)))
    deleted = clock.move(5)
    db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=30))
    clock.move(500)
    uid = db.read(lambda s: ledger.pod_uid(s, ns, name))
    assert db.write(lambda s: pods.finalize(s, uid=uid))
    assert billed(db, ns, name, clock()) == (int((deleted - bound).total_seconds()) + 30, False)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ran=st.integers(0, 5000),
    late=st.integers(0, 90000),
    skew=st.integers(-600, 600),
    code=st.sampled_from([0, 1]),
    deleted_after=st.none() | st.integers(0, 5000),
    grace=st.integers(0, 120),
)
def test_billed_seconds_are_the_observed_run_within_bounds(
    db: Database, clock: Clock, place, ran, late, skew, code, deleted_after, grace
) -> None:
    """Whatever the node reports, and however late: billing ends at the observed end, moved
    into [bind, report] and never past the grace deadline."""
    ns, name = place()
    bound = clock()
    started = clock.move(1)
    report(db, ns, name, running(started))
    deadline = None
    if deleted_after is not None and deleted_after < ran:
        clock.move(deleted_after)
        db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=max(grace, 1)))
        deadline = clock() + timedelta(seconds=max(grace, 1))
    truth = started + timedelta(seconds=ran)  # by the control plane's clock
    clock.at = max(clock(), truth) + timedelta(seconds=late)
    seen = truth + timedelta(seconds=skew)  # by the node's clock
    phase = "Succeeded" if code == 0 else "Failed"
    body = {"phase": phase, "containerStatuses": [status(terminated(started, seen, code))]}
    if deadline is not None:
        body["phase"] = "Running"  # being deleted: the node reports the stop, then removes it
        report(db, ns, name, body)
        db.write(lambda s: pods.delete(s, namespace=ns, name=name, grace_seconds=0))
    else:
        report(db, ns, name, body)
    expected = min(seen, clock())
    if deadline is not None:
        expected = min(expected, deadline)
    expected = max(expected, bound)
    assert billed(db, ns, name, clock()) == (int((expected - bound).total_seconds()), False)
