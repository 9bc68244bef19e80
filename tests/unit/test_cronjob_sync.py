"""Cron schedules (app/kube/cron.py) and the CronJob controller's decisions
(app/controllers/cronjob_sync.py): pure, so every case is a CronJob, its Jobs and a time."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from app.controllers.cronjob_sync import SCHEDULED_TIMESTAMP, job_name, sync_cronjob
from app.kube import cron
from app.kube.meta import timestamp
from app.registry.kinds.cronjobs import CronJobStrategy

T0 = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)  # a Sunday
Obj = dict[str, Any]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("*/1 * * * *", "2026-12-06T09:00:30", "2026-12-06T09:01:00"),
        ("*/15 * * * *", "2026-12-06T09:00:00", "2026-12-06T09:15:00"),
        ("0 3 * * *", "2026-12-06T09:00:00", "2026-12-07T03:00:00"),
        ("30 2 1 * *", "2026-12-06T09:00:00", "2027-01-01T02:30:00"),
        ("0 0 * * MON-FRI", "2026-12-05T12:00:00", "2026-12-07T00:00:00"),  # Sat -> Mon
        ("0 0 * * 7", "2026-12-01T00:00:00", "2026-12-06T00:00:00"),  # 7 is Sunday
        ("0 0 13 * 5", "2026-12-06T09:00:00", "2026-12-11T00:00:00"),  # 13th OR a Friday
        ("0 0 */10 * *", "2026-12-06T09:00:00", "2026-12-11T00:00:00"),  # 1, 11, 21, 31
        ("@hourly", "2026-12-06T09:00:00", "2026-12-06T10:00:00"),
        ("@yearly", "2026-12-06T09:00:00", "2027-01-01T00:00:00"),
        ("0 12 29 feb *", "2026-12-06T09:00:00", "2028-02-29T12:00:00"),
        ("5,10-12 1 * jan-mar/2 *", "2026-12-06T09:00:00", "2027-01-01T01:05:00"),
    ],
)
def test_next_times(schedule: str, after: str, expected: str) -> None:
    assert cron.parse(schedule).next_after(at(after)) == at(expected)


def test_a_schedule_in_a_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")  # UTC+1 in December
    got = cron.parse("0 9 * * *").next_after(at("2026-12-06T07:00:00"), berlin)
    assert got == at("2026-12-06T08:00:00")


def test_a_schedule_that_never_fires() -> None:
    assert cron.parse("0 0 30 2 *").next_after(T0) is None


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        ("* * * *", "expected exactly 5 fields"),
        ("61 * * * *", "above maximum (59)"),
        ("* * 0 * *", "below minimum (1)"),
        ("*/0 * * * *", "step must be a positive number"),
        ("5-1 * * * *", "beyond end of range"),
        ("x * * * *", "failed to parse int from x"),
        ("@fortnightly", "unrecognized descriptor"),
        ("TZ=UTC 0 * * * *", "use timeZone field instead"),
    ],
)
def test_bad_schedules(schedule: str, error: str) -> None:
    with pytest.raises(cron.CronError, match=error.replace("(", r"\(").replace(")", r"\)")):
        cron.parse(schedule)


def test_bad_time_zones() -> None:
    for name in ("Mars/Olympus", "../etc/passwd", " UTC"):
        with pytest.raises(cron.CronError):
            cron.zone(name)
    assert cron.zone("America/New_York") is not None and cron.zone(None) is None


def test_missed_times_are_counted_up_to_a_cap() -> None:
    every = cron.parse("* * * * *")
    last, count = every.last_between(T0, T0 + timedelta(minutes=5))
    assert (last, count) == (T0 + timedelta(minutes=5), 5)
    last, count = every.last_between(T0, T0 + timedelta(days=2), cap=100)
    assert last == T0 + timedelta(days=2) and count == 101


# --- the CronJob controller ---------------------------------------------------------------


def make_cronjob(**spec: Any) -> Obj:
    obj: Obj = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": "tick",
            "namespace": "ns",
            "uid": "cj-uid",
            "creationTimestamp": timestamp(T0),
        },
        "spec": {
            "schedule": spec.pop("schedule", "*/1 * * * *"),
            "jobTemplate": {
                "metadata": {"labels": {"app": "tick"}, "annotations": {"team": "a"}},
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "OnFailure",
                            "containers": [{"name": "main", "image": "busybox"}],
                        }
                    }
                },
            },
            **spec,
        },
    }
    CronJobStrategy().prepare_create(obj)
    assert CronJobStrategy().validate(obj) == []
    return obj


class World:
    def __init__(self, cronjob: Obj) -> None:
        self.cronjob = cronjob
        self.jobs: dict[str, Obj] = {}

    def sync(self, now: datetime) -> Any:
        d = sync_cronjob(copy.deepcopy(self.cronjob), copy.deepcopy(list(self.jobs.values())), now)
        for name in d.delete:
            self.jobs.pop(name)
        if d.create is not None:
            job = copy.deepcopy(d.create)
            job["metadata"]["uid"] = f"uid-{job['metadata']['name']}"
            job["metadata"]["creationTimestamp"] = timestamp(now)
            job["status"] = {"startTime": timestamp(now)}
            self.jobs[job["metadata"]["name"]] = job
        self.cronjob["status"] = d.status
        return d

    def end(self, name: str, outcome: str, when: datetime) -> None:
        status = self.jobs[name]["status"]
        status["conditions"] = [{"type": outcome, "status": "True"}]
        if outcome == "Complete":
            status["completionTime"] = timestamp(when)


def test_a_job_on_each_schedule_time() -> None:
    w = World(make_cronjob())
    d = w.sync(T0 + timedelta(seconds=30))
    assert d.create is None and d.requeue_after == 30  # created at 09:00:00, next at 09:01
    d = w.sync(T0 + timedelta(minutes=1, seconds=2))
    assert d.create is not None
    job = d.create
    minute = T0 + timedelta(minutes=1)
    assert job["metadata"]["name"] == f"tick-{int(minute.timestamp()) // 60}"
    assert job["metadata"]["labels"] == {"app": "tick"}
    assert job["metadata"]["annotations"] == {
        "team": "a",
        SCHEDULED_TIMESTAMP: "2026-12-06T09:01:00Z",
    }
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("CronJob", "cj-uid", True)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox"
    assert w.cronjob["status"]["lastScheduleTime"] == timestamp(minute)
    assert [a["name"] for a in w.cronjob["status"]["active"]] == [job["metadata"]["name"]]
    assert d.requeue_after == 58
    # the same minute again: nothing new
    assert w.sync(T0 + timedelta(minutes=1, seconds=30)).create is None
    # the Job completes: no longer active, lastSuccessfulTime recorded
    w.end(job["metadata"]["name"], "Complete", T0 + timedelta(minutes=1, seconds=40))
    d = w.sync(T0 + timedelta(minutes=1, seconds=50))
    assert "active" not in w.cronjob["status"]
    assert w.cronjob["status"]["lastSuccessfulTime"] == timestamp(
        T0 + timedelta(minutes=1, seconds=40)
    )
    assert ("Normal", "SawCompletedJob") in [(e[0], e[1]) for e in d.events]


def test_a_time_is_run_once_even_when_the_status_write_was_lost() -> None:
    w = World(make_cronjob())
    now = T0 + timedelta(minutes=1)
    w.sync(now)
    w.cronjob["status"] = {}  # the status write lost
    d = w.sync(now + timedelta(seconds=5))
    assert d.create is None and w.cronjob["status"]["lastScheduleTime"] == timestamp(now)


def test_only_the_most_recent_missed_time_runs() -> None:
    w = World(make_cronjob())
    d = w.sync(T0 + timedelta(minutes=10, seconds=5))
    assert d.create is not None
    assert d.create["metadata"]["name"] == job_name(w.cronjob, T0 + timedelta(minutes=10))
    d = w.sync(T0 + timedelta(days=1))  # over 100 missed: reported
    assert "TooManyMissedTimes" in [e[1] for e in d.events] and d.create is not None


def test_starting_deadline_skips_a_time_too_old() -> None:
    w = World(make_cronjob(schedule="0 * * * *", startingDeadlineSeconds=30))
    assert w.sync(T0 + timedelta(hours=1, seconds=31)).create is None
    assert w.sync(T0 + timedelta(hours=2, seconds=10)).create is not None


def test_forbid_skips_while_a_job_runs() -> None:
    w = World(make_cronjob(concurrencyPolicy="Forbid"))
    assert w.sync(T0 + timedelta(minutes=1)).create is not None
    d = w.sync(T0 + timedelta(minutes=2))
    assert d.create is None and "JobAlreadyActive" in [e[1] for e in d.events]
    (name,) = w.jobs
    w.end(name, "Complete", T0 + timedelta(minutes=2, seconds=10))
    assert w.sync(T0 + timedelta(minutes=3)).create is not None


def test_replace_deletes_the_running_job() -> None:
    w = World(make_cronjob(concurrencyPolicy="Replace"))
    w.sync(T0 + timedelta(minutes=1))
    (first,) = w.jobs
    d = w.sync(T0 + timedelta(minutes=2))
    assert d.delete == [first] and d.create is not None
    assert [a["name"] for a in w.cronjob["status"]["active"]] == [d.create["metadata"]["name"]]


def test_allow_runs_side_by_side() -> None:
    w = World(make_cronjob())
    w.sync(T0 + timedelta(minutes=1))
    w.sync(T0 + timedelta(minutes=2))
    assert len(w.jobs) == 2 and len(w.cronjob["status"]["active"]) == 2


def test_suspend_makes_nothing() -> None:
    w = World(make_cronjob(suspend=True))
    d = w.sync(T0 + timedelta(minutes=5))
    assert d.create is None and w.jobs == {}


def test_history_limits_delete_the_oldest_finished_jobs() -> None:
    w = World(make_cronjob(successfulJobsHistoryLimit=2, failedJobsHistoryLimit=1))
    for minute in range(1, 6):
        now = T0 + timedelta(minutes=minute)
        w.sync(now)
        name = job_name(w.cronjob, now)
        w.end(name, "Failed" if minute in (2, 4) else "Complete", now + timedelta(seconds=5))
    w.sync(T0 + timedelta(minutes=5, seconds=30))
    kept = sorted(w.jobs)
    names = {m: job_name(w.cronjob, T0 + timedelta(minutes=m)) for m in range(1, 6)}
    assert kept == sorted([names[3], names[5], names[4]])


def test_an_unparsable_schedule_is_reported() -> None:
    w = World(make_cronjob())
    w.cronjob["spec"]["schedule"] = "not a schedule"
    d = w.sync(T0 + timedelta(minutes=3))
    assert d.create is None and d.events[0][1] == "UnparseableSchedule"
