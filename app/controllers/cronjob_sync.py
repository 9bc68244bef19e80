"""What the CronJob controller decides for one CronJob: pure, no I/O, no clock.

`sync_cronjob(cronjob, jobs, now)` takes a CronJob, the Jobs it owns and the time, and returns
`CronJobDecisions`: the Job to create (if a schedule time has come), the Jobs to delete
(`concurrencyPolicy: Replace`, and finished Jobs beyond the history limits), the CronJob's new
status and when to look again. As Kubernetes' CronJob controller (v2, 1.31):

- The time to run is the most recent schedule time in (lastScheduleTime or creation, now] (in
  `timeZone`), if it is not older than `startingDeadlineSeconds`; more than 100 missed times
  are reported, and only the most recent runs.
- The Job is named `<cronjob>-<minutes since the epoch of the schedule time>`, so a time is run
  once even when the status write was lost; it carries the template's labels and annotations,
  the annotation `batch.kubernetes.io/cronjob-scheduled-timestamp` and the CronJob as its
  controller owner.
- `Forbid` skips a time while a Job runs; `Replace` deletes the running Jobs first; `Allow` runs
  them side by side. `suspend` makes nothing (Jobs already made go on).
- `status.active` lists the running Jobs; `lastSuccessfulTime` is the last completion seen.
  Finished Jobs beyond `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` are deleted,
  oldest first.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.kube import cron
from app.kube.meta import parse_timestamp, timestamp
from app.registry.kinds.jobs import finished

Obj = dict[str, Any]

SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
MISSED_CAP = 100


@dataclass
class CronJobDecisions:
    create: Obj | None = None  # the Job to create
    delete: list[str] = field(default_factory=list)  # names of Jobs to delete
    status: Obj = field(default_factory=dict)
    requeue_after: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def job_name(cronjob: Obj, scheduled: datetime) -> str:
    """`<cronjob>-<minutes since the epoch>` (Kubernetes' getJobName)."""
    return f"{cronjob['metadata']['name']}-{int(scheduled.timestamp()) // 60}"


def new_job(cronjob: Obj, scheduled: datetime, zone: Any = None) -> Obj:
    """The Job the CronJob's template makes for `scheduled`."""
    meta, spec = cronjob["metadata"], cronjob["spec"]
    template = copy.deepcopy(spec["jobTemplate"])
    tmeta = template.get("metadata") or {}
    annotations = dict(tmeta.get("annotations") or {})
    local = scheduled.astimezone(zone) if zone is not None else scheduled
    annotations[SCHEDULED_TIMESTAMP] = local.isoformat().replace("+00:00", "Z")
    job_meta: Obj = {
        "name": job_name(cronjob, scheduled),
        "namespace": meta.get("namespace"),
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if tmeta.get("labels"):
        job_meta["labels"] = dict(tmeta["labels"])
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": template["spec"]}


def _ref(job: Obj) -> Obj:
    meta = job["metadata"]
    ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    return {k: v for k, v in ref.items() if v is not None}


def _started(job: Obj) -> str:
    status = job.get("status") or {}
    return str(status.get("startTime") or job["metadata"].get("creationTimestamp") or "")


def sync_cronjob(cronjob: Obj, jobs: list[Obj], now: datetime) -> CronJobDecisions:
    """What the CronJob controller does now for `cronjob`, given the Jobs it owns."""
    decisions = CronJobDecisions()
    old = cronjob.get("status") or {}
    status: Obj = copy.deepcopy(old)
    decisions.status = status
    meta, spec = cronjob["metadata"], cronjob["spec"]
    if meta.get("deletionTimestamp"):
        return decisions

    # status.active: the Jobs of this CronJob that have not finished
    by_name = {j["metadata"]["name"]: j for j in jobs}
    running = [
        j for j in jobs if finished(j) is None and not j["metadata"].get("deletionTimestamp")
    ]
    last_success = status.get("lastSuccessfulTime")
    for job in jobs:
        if finished(job) == "Complete":
            done = (job.get("status") or {}).get("completionTime")
            if done and (
                last_success is None or parse_timestamp(done) > parse_timestamp(last_success)
            ):
                last_success = done
    if last_success:
        status["lastSuccessfulTime"] = last_success
    for ref in old.get("active") or []:
        seen = by_name.get(ref.get("name"))
        if seen is not None and finished(seen) is not None:
            decisions.events.append(
                (
                    "Normal",
                    "SawCompletedJob",
                    f"Saw completed job: {ref['name']}, status: {finished(seen)}",
                )
            )

    # history: finished Jobs beyond the limits go, oldest first
    deleted: set[str] = set()
    for outcome, key in (
        ("Complete", "successfulJobsHistoryLimit"),
        ("Failed", "failedJobsHistoryLimit"),
    ):
        limit = spec.get(key)
        if limit is None:
            continue
        done = sorted((j for j in jobs if finished(j) == outcome), key=_started)
        for job in done[: max(0, len(done) - int(limit))]:
            if not job["metadata"].get("deletionTimestamp"):
                deleted.add(job["metadata"]["name"])
                decisions.events.append(
                    ("Normal", "SuccessfulDelete", f"Deleted job {job['metadata']['name']}")
                )

    def finish() -> CronJobDecisions:
        status["active"] = [_ref(j) for j in sorted(running, key=_started)]
        if not status["active"]:
            status.pop("active")
        decisions.delete = sorted(deleted)
        return decisions

    if spec.get("suspend"):
        return finish()
    try:
        schedule = cron.parse(str(spec.get("schedule") or ""))
        zone = cron.zone(spec.get("timeZone"))
    except cron.CronError as exc:
        decisions.events.append(("Warning", "UnparseableSchedule", str(exc)))
        return finish()

    created = parse_timestamp(meta["creationTimestamp"]) if meta.get("creationTimestamp") else now
    earliest = (
        parse_timestamp(status["lastScheduleTime"]) if status.get("lastScheduleTime") else created
    )
    deadline = spec.get("startingDeadlineSeconds")
    if deadline is not None:
        earliest = max(earliest, now - timedelta(seconds=deadline))
    scheduled, missed = (None, 0)
    if earliest <= now:
        scheduled, missed = schedule.last_between(earliest, now, zone, cap=MISSED_CAP)
    if missed > MISSED_CAP:
        decisions.events.append(
            (
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times: more than 100. Set or decrease "
                ".spec.startingDeadlineSeconds or check clock skew",
            )
        )
    upcoming = schedule.next_after(now, zone)
    if upcoming is not None:
        decisions.requeue_after = max(0.0, (upcoming - now).total_seconds())
    if scheduled is None:
        return finish()
    if deadline is not None and scheduled + timedelta(seconds=deadline) < now:
        decisions.events.append(
            (
                "Warning",
                "MissSchedule",
                f"Missed scheduled time to start a job: {timestamp(scheduled)}",
            )
        )
        return finish()
    name = job_name(cronjob, scheduled)
    if name in by_name:  # made already (a status write lost): nothing to do but record it
        status["lastScheduleTime"] = timestamp(scheduled)
        return finish()
    policy = spec.get("concurrencyPolicy") or "Allow"
    if policy == "Forbid" and running:
        decisions.events.append(
            (
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is "
                "Forbid",
            )
        )
        return finish()
    if policy == "Replace":
        for job in running:
            deleted.add(job["metadata"]["name"])
            decisions.events.append(
                ("Normal", "SuccessfulDelete", f"Deleted job {job['metadata']['name']}")
            )
        running = []
    decisions.create = new_job(cronjob, scheduled, zone)
    decisions.events.append(("Normal", "SuccessfulCreate", f"Created job {name}"))
    status["lastScheduleTime"] = timestamp(scheduled)
    running.append(
        {"metadata": {"name": name, "namespace": meta.get("namespace")}, "status": {}}
    )  # listed as active once made (its uid is added when the controller sees it)
    return finish()
