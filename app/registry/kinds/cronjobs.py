"""batch/v1 CronJob: a Job made on a schedule, as Kubernetes' CronJob.

The schedule is five-field cron (app/kube/cron.py) in `timeZone` (UTC when unset); the strategy
defaults and checks it as the Kubernetes apiserver does (ValidateCronJob: a name of at most 52
characters, so that `<name>-<minutes>` is a valid Job name; concurrencyPolicy Allow, Forbid or
Replace; non-negative deadlines and history limits; the job template checked as a Job's spec).
What the CronJob controller does with it is app/controllers/cronjob_sync.py.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from app.errors import Cause
from app.kube import cron
from app.kube.meta import INT64_MAX, Int32, KubeModel, ListMeta, ObjectMeta, now, parse_timestamp
from app.kube.tables import Column, age
from app.registry.kinds.jobs import JobSpec, _human, default_spec, spec_causes
from app.registry.strategy import Obj, Strategy

MAX_NAME = 52  # 63 less the 11 characters of "-<minutes since the epoch>"


class JobTemplateSpec(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: JobSpec


class CronJobSpec(KubeModel):
    schedule: str = Field(description='Five-field cron ("*/5 * * * *") or @hourly, @daily, ...')
    time_zone: str | None = Field(default=None, description="An IANA zone (default UTC).")
    starting_deadline_seconds: int | None = Field(default=None, ge=-INT64_MAX, le=INT64_MAX)
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] | None = None
    suspend: bool | None = None
    job_template: JobTemplateSpec
    successful_jobs_history_limit: Int32 | None = None
    failed_jobs_history_limit: Int32 | None = None


class CronJobStatus(KubeModel):
    active: list[dict[str, Any]] | None = None
    last_schedule_time: str | None = None
    last_successful_time: str | None = None


class CronJob(KubeModel):
    """A Job made on a schedule."""

    api_version: Literal["batch/v1"] | None = "batch/v1"
    kind: Literal["CronJob"] | None = "CronJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: CronJobSpec
    status: CronJobStatus | None = None


class CronJobList(KubeModel):
    api_version: Literal["batch/v1"] = "batch/v1"
    kind: Literal["CronJobList"] = "CronJobList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[CronJob]


def default_cronjob(spec: Obj) -> None:
    """SetDefaults_CronJob, in place."""
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    if spec.get("successfulJobsHistoryLimit") is None:
        spec["successfulJobsHistoryLimit"] = 3
    if spec.get("failedJobsHistoryLimit") is None:
        spec["failedJobsHistoryLimit"] = 1
    job_spec = (spec.get("jobTemplate") or {}).get("spec")
    if isinstance(job_spec, dict):
        default_spec(job_spec)


def cronjob_causes(obj: Obj) -> list[Cause]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    causes: list[Cause] = []
    name = meta.get("name") or ""
    if len(name) > MAX_NAME:
        causes.append(
            Cause(
                "metadata.name",
                f'Invalid value: "{name}": must be no more than {MAX_NAME} characters',
            )
        )
    schedule = spec.get("schedule") or ""
    if not schedule:
        causes.append(Cause("spec.schedule", "Required value"))
    else:
        try:
            cron.parse(schedule)
        except cron.CronError as exc:
            causes.append(Cause("spec.schedule", f'Invalid value: "{schedule}": {exc}'))
    try:
        cron.zone(spec.get("timeZone"))
    except cron.CronError as exc:
        causes.append(Cause("spec.timeZone", f'Invalid value: "{spec.get("timeZone")}": {exc}'))
    deadline = spec.get("startingDeadlineSeconds")
    if deadline is not None and deadline < 0:
        causes.append(
            Cause(
                "spec.startingDeadlineSeconds",
                f"Invalid value: {deadline}: must be greater than or equal to 0",
            )
        )
    for field in ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        value = spec.get(field)
        if value is not None and value < 0:
            causes.append(
                Cause(
                    f"spec.{field}", f"Invalid value: {value}: must be greater than or equal to 0"
                )
            )
    job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    # the template's selector is made for each Job (with its uid), never in the template
    if job_spec.get("manualSelector") and job_spec.get("selector") is None:
        causes.append(Cause("spec.jobTemplate.spec.selector", "Required value"))
    checked = dict(job_spec)
    if not checked.get("manualSelector"):
        labels = ((checked.get("template") or {}).get("metadata") or {}).get("labels") or {}
        checked["selector"] = {"matchLabels": {"_": "_"}}
        checked["template"] = {
            **(checked.get("template") or {}),
            "metadata": {
                **((checked.get("template") or {}).get("metadata") or {}),
                "labels": {**labels, "_": "_"},
            },
        }
    causes += spec_causes(checked, "spec.jobTemplate.spec")
    return causes


def _last_schedule(obj: Obj) -> str:
    at = (obj.get("status") or {}).get("lastScheduleTime")
    if not at:
        return "<none>"
    seconds = int((now() - parse_timestamp(at)).total_seconds())
    return _human(max(0, seconds))


class CronJobStrategy(Strategy):
    kind = "CronJob"
    resource = "cronjobs"
    singular = "cronjob"
    group = "batch"
    model = CronJob
    list_model = CronJobList
    short_names = ("cj",)
    categories = ("all",)
    has_status = True
    generation = True
    workload = True
    has_dependents = True  # Foreground and Orphan deletions wait for the collector
    summary = "a Job made on a cron schedule"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the CronJob.", 0),
        ("Schedule", "string", "The schedule.", 0),
        ("Timezone", "string", "The schedule's time zone.", 0),
        ("Suspend", "boolean", "Whether no Job is made.", 0),
        ("Active", "integer", "Jobs running.", 0),
        ("Last Schedule", "string", "Time since a Job was last made.", 0),
        ("Age", "string", "Time since creation.", 0),
        ("Containers", "string", "Names of each container in the template.", 1),
        ("Images", "string", "Images of each container in the template.", 1),
        ("Selector", "string", "The Jobs' label selector.", 1),
    ]

    def row(self, obj: Obj) -> list[Any]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        pod_spec = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        ) or {}
        containers = pod_spec.get("containers") or []
        return [
            obj["metadata"]["name"],
            spec.get("schedule", ""),
            spec.get("timeZone") or "<none>",
            "True" if spec.get("suspend") else "False",  # printBoolPtr
            len(status.get("active") or []),
            _last_schedule(obj),
            age(obj["metadata"].get("creationTimestamp")),
            ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers),
            "<none>",
        ]

    def prepare_create(self, obj: Obj) -> None:
        default_cronjob(obj.setdefault("spec", {}))

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        default_cronjob(obj.setdefault("spec", {}))

    def validate(self, obj: Obj) -> list[Cause]:
        return cronjob_causes(obj)
