"""Hourly rollups on both databases: a tenant's hour and day reports read from them equal the
reports computed from every event, before and after a late event reaches back into rolled hours
(readers stop trusting those hours at once; the next roll rebuilds them)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from app.billing_api import service as billing
from app.db.models import UsageHour
from billing import ledger
from billing.reports import aggregate, row_json
from billing.usage import PodRef, Reason, Spec, Transition

DAY = datetime(2026, 11, 2, tzinfo=UTC)
MONEY = billing.Money("USD", 2)
SPECS = [
    Spec(1000, 2048, "general-purpose", "default"),
    Spec(4000, 16384, "gpu", "default", "H200", 20480, 25),
    Spec(2000, 4096, "performance", "best-effort"),
]


WORKLOADS = [None, "Deployment/web", "Job/etl", "CronJob/nightly", "JobSet/train"]


def story(tenant_id: int, count: int, seed: int) -> list[Transition]:
    """Pods bound through the day, most resized once, most stopped; some still running."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        workload = rnd.choice(WORKLOADS)
        pod = PodRef(str(uuid.uuid4()), tenant_id, rnd.choice(["a", "b"]), f"p{i}", workload)
        start = DAY + timedelta(seconds=rnd.randrange(0, 80_000))
        out.append(Transition(pod, Reason.BIND, start, spec=rnd.choice(SPECS)))
        resize = start + timedelta(seconds=rnd.randrange(1, 9_000))
        if rnd.random() < 0.7:
            out.append(Transition(pod, Reason.RESIZE, resize, spec=rnd.choice(SPECS), seq=1))
        if rnd.random() < 0.8:
            stop = resize + timedelta(seconds=rnd.randrange(1, 9_000))
            out.append(Transition(pod, Reason.DELETE, stop))
    return out


def report(db, tenant_id: int, granularity: str, group_by: str, at: datetime) -> list[dict]:
    query = billing.report_query(
        start=DAY.isoformat(),
        end=(DAY + timedelta(days=1)).isoformat(),
        granularity=granularity,
        group_by=group_by,
        at=at,
    )
    return db.read(
        lambda s: [
            row_json(r, query.group_by)
            for r in billing.usage_report(
                s, query=query, tenant_id=tenant_id, namespace=None, money=MONEY, at=at
            ).rows
        ]
    )


def from_events(db, tenant_id: int, granularity: str, group_by: str, at: datetime) -> list[dict]:
    """The same report from every event, as if there were no rollups."""
    query = billing.report_query(
        start=DAY.isoformat(),
        end=(DAY + timedelta(days=1)).isoformat(),
        granularity=granularity,
        group_by=group_by,
        at=at,
    )

    def work(s):
        rows = aggregate(
            ledger.segments(s, tenant_id=tenant_id, start=query.start, end=query.end),
            ledger.price_book(s, currency="USD"),
            start=query.start,
            end=query.end,
            now=at.replace(microsecond=0),
            granularity=granularity,
            group_by=query.group_by,
        )
        return [row_json(r, query.group_by) for r in rows]

    return db.read(work)


CASES = [
    ("hour", "resource"),
    ("day", "namespace,class,qos,gpuModel"),
    ("hour", ""),
    ("hour", "workload"),
    ("day", "workload,namespace,resource"),
]


def test_reports_from_rollups_equal_reports_from_events(db) -> None:
    tenant_id = 10**8 + uuid.uuid4().int % 10**8  # a tenant of its own (pytest seeds random)
    transitions = story(tenant_id, 120, seed=tenant_id)
    # Written as the day went (by its end), not just now: else all of it would count as late.
    db.write(lambda s: ledger.record(s, transitions, recorded_at=DAY + timedelta(days=1)))
    at = datetime.now(UTC)
    truth = {case: from_events(db, tenant_id, *case, at) for case in CASES}
    assert truth[("hour", "resource")], "the story has usage"
    assert {r["workload"] for r in truth[("hour", "workload")]} == set(WORKLOADS)
    assert (
        db.read(lambda s: ledger.rolled_hours(s, tenant_id=tenant_id, start=DAY, end=at))[0] is None
    )

    rolled = db.write(lambda s: ledger.roll_up(s, at=at, currency="USD", tenant_id=tenant_id))
    assert rolled >= 24
    span, hours = db.read(
        lambda s: ledger.rolled_hours(
            s, tenant_id=tenant_id, start=DAY, end=DAY + timedelta(days=1)
        )
    )
    assert span == (DAY, DAY + timedelta(days=1)) and hours  # the day is served by rollups
    for case in CASES:
        assert report(db, tenant_id, *case, at) == truth[case], case

    # A late stop of a pod still running: recorded now, it took effect at 15:30:07.
    running = {t.pod for t in transitions} - {
        t.pod for t in transitions if t.reason == Reason.DELETE
    }
    late_pod = min(running, key=lambda p: p.name)
    started = min(t.at for t in transitions if t.pod == late_pod)
    late_at = max(started, DAY + timedelta(hours=15, minutes=30, seconds=7)) + timedelta(seconds=1)
    db.write(lambda s: ledger.record(s, [Transition(late_pod, Reason.DELETE, late_at)]))
    changed = {case: from_events(db, tenant_id, *case, at) for case in CASES}
    assert changed != truth
    span, _ = db.read(
        lambda s: ledger.rolled_hours(
            s, tenant_id=tenant_id, start=DAY, end=DAY + timedelta(days=1)
        )
    )
    assert span is not None and span[1] == late_at.replace(minute=0, second=0)  # stale from there
    for case in CASES:
        assert report(db, tenant_id, *case, at) == changed[case], case

    again = datetime.now(UTC) + ledger.LATE_MARGIN + timedelta(seconds=1)
    db.write(lambda s: ledger.roll_up(s, at=again, currency="USD", tenant_id=tenant_id))
    span, _ = db.read(
        lambda s: ledger.rolled_hours(
            s, tenant_id=tenant_id, start=DAY, end=DAY + timedelta(days=1)
        )
    )
    assert span == (DAY, DAY + timedelta(days=1))  # rebuilt
    for case in CASES:
        assert report(db, tenant_id, *case, again) == from_events(db, tenant_id, *case, again)
    rows = db.read(
        lambda s: s.scalar(
            select(func.count())
            .select_from(UsageHour)
            .where(UsageHour.tenant_id == tenant_id, UsageHour.hour < DAY + timedelta(days=1))
        )
    )
    prices = db.read(lambda s: len(ledger.price_book(s, currency="USD").versions)) + 1
    # per hour, namespace, workload and rate key: not per pod
    assert 0 < rows <= 24 * 2 * len(WORKLOADS) * len(SPECS) * prices
