"""What the Job controller decides for one Job: pure, no I/O, no clock.

`sync_job(job, pods, now)` takes a Job, the pods it owns (its selector's, with its uid as their
controller) and the time, and returns `JobDecisions`: the pods to create (each with its index
when the Job is Indexed), the pods to delete, the Job's new status, whether to delete the Job
(its ttlSecondsAfterFinished has passed) and when to look again. The controller applies them
through the API; being level-triggered, the same Job and pods always give the same decisions,
and applying them twice changes nothing (pods in flight are seen on the next sync).

It follows Kubernetes' Job controller (1.31):

- **NonIndexed**: `parallelism` pods at a time until `completions` have succeeded (with
  `completions` unset, until any succeeds and none is left running). **Indexed**: one pod per
  index 0..completions-1, its index in the annotation and label
  `batch.kubernetes.io/job-completion-index`, the env `JOB_COMPLETION_INDEX` and the hostname
  `<job>-<index>`; `status.completedIndexes` (and `failedIndexes`) as interval lists (`0-2,5`).
- **Failures**: a failed pod counts towards `backoffLimit` (with restartPolicy OnFailure, so do
  the restarts of its running pods); a replacement waits the exponential back-off, 10 s doubled
  per failure up to 6 min. `backoffLimitPerIndex` counts failures per index (the count carried
  in the annotation `batch.kubernetes.io/job-index-failure-count`), an index over it is failed,
  more than `maxFailedIndexes` failed indexes fail the Job. `podFailurePolicy` rules, in order,
  on a failed pod's exit codes or conditions: FailJob, FailIndex, Ignore (not counted), Count.
- **Success**: `successPolicy` rules (succeededIndexes / succeededCount) end an Indexed Job early.
- **Conditions**, as Kubernetes 1.31+: success first adds `SuccessCriteriaMet`, failure
  `FailureTarget` (reasons BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy,
  MaxFailedIndexesExceeded, FailedIndexes, CompletionsReached, SuccessPolicy); the Job's remaining
  pods are deleted, and once none is left `Complete` (with completionTime) or `Failed`.
  `suspend` deletes the active pods and sets `Suspended` (True; False on resume, when startTime
  and so activeDeadlineSeconds start again).
- Finished pods are kept (as Kubernetes keeps them until the Job goes); counts come from them and
  never go down (a finished pod deleted by hand is still counted; a completed index stays
  completed). Unlike Kubernetes, pods carry no tracking finalizer: a pod deleted before it
  finished is replaced rather than counted as failed, and deleting a Job never waits for the
  controller.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.kube.meta import parse_timestamp, timestamp
from app.registry.kinds.jobs import (
    COMPLETION_INDEX,
    finished,
    finished_at,
    indexes_of,
    intervals_text,
    parse_intervals,
)

Obj = dict[str, Any]

INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURE_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"
INDEX_ENV = "JOB_COMPLETION_INDEX"
BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 360.0
TERMINAL = ("Succeeded", "Failed")


@dataclass
class JobDecisions:
    create: list[Obj] = field(default_factory=list)  # pod bodies, in index order
    delete: list[str] = field(default_factory=list)  # names of pods to delete
    status: Obj = field(default_factory=dict)  # the Job's status as it should be
    delete_job: bool = False  # ttlSecondsAfterFinished has passed
    requeue_after: float | None = None  # seconds until something changes with time alone
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)

    def wake(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


# --- pods ----------------------------------------------------------------------------------


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def terminating(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp")) and phase(pod) not in TERMINAL


def is_active(pod: Obj) -> bool:
    return phase(pod) not in TERMINAL and not pod["metadata"].get("deletionTimestamp")


def is_ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def index_of(pod: Obj) -> int | None:
    meta = pod["metadata"]
    text = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    if text is None:
        text = (meta.get("labels") or {}).get(COMPLETION_INDEX)
    if text is None or not str(text).isdigit():
        return None
    return int(text)


def _terminated(pod: Obj) -> list[tuple[str, Obj]]:
    status = pod.get("status") or {}
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
            if term is not None:
                out.append((str(cs.get("name")), term))
    return out


def finished_time(pod: Obj) -> datetime | None:
    """When a finished pod finished (its containers' last finishedAt)."""
    times = [parse_timestamp(t["finishedAt"]) for _, t in _terminated(pod) if t.get("finishedAt")]
    return max(times) if times else None


def restarts(pod: Obj) -> int:
    status = pod.get("status") or {}
    return sum(
        int(cs.get("restartCount") or 0)
        for key in ("initContainerStatuses", "containerStatuses")
        for cs in status.get(key) or []
    )


def _failure_count(pod: Obj, key: str = INDEX_FAILURE_COUNT) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(key) or "0"
    return int(text) if str(text).isdigit() else 0


# --- the pod failure policy ----------------------------------------------------------------


def matching_rule(policy: Obj | None, pod: Obj) -> tuple[int, Obj, str] | None:
    """The first podFailurePolicy rule a failed pod matches: (index, rule, message)."""
    if not policy:
        return None
    meta = pod["metadata"]
    where = f"{meta.get('namespace', '')}/{meta['name']}"
    for i, rule in enumerate(policy.get("rules") or []):
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            for name, term in _terminated(pod):
                code = int(term.get("exitCode") or 0)
                if code == 0:
                    continue  # containers that succeeded are left out
                if on_codes.get("containerName") not in (None, name):
                    continue
                values = on_codes.get("values") or []
                hit = code in values if on_codes["operator"] == "In" else code not in values
                if hit:
                    return (
                        i,
                        rule,
                        f"Container {name} for pod {where} failed with exit code {code} "
                        f"matching {rule['action']} rule at index {i}",
                    )
        for pattern in rule.get("onPodConditions") or []:
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == pattern.get("type") and cond.get("status") == (
                    pattern.get("status") or "True"
                ):
                    return (
                        i,
                        rule,
                        f"Pod {where} has condition {cond['type']} matching {rule['action']} "
                        f"rule at index {i}",
                    )
    return None


# --- conditions ----------------------------------------------------------------------------


def _set_condition(
    status: Obj, kind: str, value: str, reason: str, message: str, now: datetime
) -> bool:
    """Set a condition; True when it changed. Its transition time moves only when its status
    does (as Kubernetes)."""
    conditions: list[Obj] = status.setdefault("conditions", [])
    at = timestamp(now)
    for cond in conditions:
        if cond.get("type") != kind:
            continue
        if (cond.get("status"), cond.get("reason"), cond.get("message")) == (
            value,
            reason,
            message,
        ):
            return False
        if cond.get("status") != value:
            cond["lastTransitionTime"] = at
        cond.update(status=value, reason=reason, message=message, lastProbeTime=at)
        return True
    conditions.append(
        {
            "type": kind,
            "status": value,
            "lastProbeTime": at,
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        }
    )
    return True


def _condition(status: Obj, kind: str) -> Obj | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


# --- making pods ---------------------------------------------------------------------------


def new_pod(job: Obj, index: int | None, failures: int = 0, ignored: int = 0) -> Obj:
    """The pod the Job's template makes (for `index` when Indexed)."""
    meta, spec = job["metadata"], job["spec"]
    template = copy.deepcopy(spec["template"])
    tmeta = template.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    annotations = dict(tmeta.get("annotations") or {})
    pod_spec = template["spec"]
    generate = f"{meta['name']}-"
    if index is not None:
        labels[COMPLETION_INDEX] = str(index)
        annotations[COMPLETION_INDEX] = str(index)
        if spec.get("backoffLimitPerIndex") is not None:
            annotations[INDEX_FAILURE_COUNT] = str(failures)
            if ignored:
                annotations[INDEX_IGNORED_FAILURE_COUNT] = str(ignored)
        generate = f"{meta['name']}-{index}-"
        pod_spec.setdefault("hostname", f"{meta['name']}-{index}")
        for key in ("initContainers", "containers"):
            for container in pod_spec.get(key) or []:
                env = [e for e in container.get("env") or [] if e.get("name") != INDEX_ENV]
                container["env"] = [{"name": INDEX_ENV, "value": str(index)}, *env]
    pod_meta: Obj = {
        "generateName": generate[:58] if len(generate) > 58 else generate,
        "namespace": meta.get("namespace"),
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if annotations:
        pod_meta["annotations"] = annotations
    if tmeta.get("finalizers"):
        pod_meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


def _deletion_order(pod: Obj) -> tuple[int, int, int, str]:
    """Which active pods go first when there are too many: unscheduled, pending, not ready,
    then the newest (as Kubernetes' ActivePods ordering)."""
    bound = 1 if (pod.get("spec") or {}).get("nodeName") else 0
    running = 1 if phase(pod) == "Running" else 0
    ready = 1 if is_ready(pod) else 0
    created = pod["metadata"].get("creationTimestamp") or ""
    # newest first among equals: invert the timestamp's order by sorting it descending later
    return (bound, running, ready, "".join(chr(0x10FFFF - ord(c)) for c in created))


# --- the sync ------------------------------------------------------------------------------


@dataclass
class _Failures:
    counted: list[Obj]  # failed pods that count towards backoffLimit
    fail_job: tuple[str, str] | None  # (reason, message) of a FailJob rule matched
    failed_indexes: set[int]
    per_index: dict[int, int]  # failures counted per index
    ignored_per_index: dict[int, int]


def _failures(job: Obj, pods: list[Obj], completions: int | None) -> _Failures:
    spec = job["spec"]
    policy = spec.get("podFailurePolicy")
    per_index_limit = spec.get("backoffLimitPerIndex")
    status = job.get("status") or {}
    result = _Failures([], None, indexes_of(status.get("failedIndexes")), {}, {})
    for pod in pods:
        index = index_of(pod)
        if index is not None:
            result.per_index[index] = max(result.per_index.get(index, 0), _failure_count(pod))
            result.ignored_per_index[index] = max(
                result.ignored_per_index.get(index, 0),
                _failure_count(pod, INDEX_IGNORED_FAILURE_COUNT),
            )
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        if phase(pod) != "Failed" or pod["metadata"].get("deletionTimestamp"):
            continue
        index = index_of(pod)
        matched = matching_rule(policy, pod)
        action = matched[1]["action"] if matched else "Count"
        if action == "Ignore":
            if index is not None:
                own = _failure_count(pod, INDEX_IGNORED_FAILURE_COUNT) + 1
                result.ignored_per_index[index] = max(result.ignored_per_index.get(index, 0), own)
            continue
        result.counted.append(pod)
        if action == "FailJob" and result.fail_job is None and matched is not None:
            result.fail_job = ("PodFailurePolicy", matched[2])
        if index is None or per_index_limit is None:
            continue
        if completions is not None and index >= completions:
            continue
        own = _failure_count(pod) + 1  # this pod's failure on top of those before it
        result.per_index[index] = max(result.per_index.get(index, 0), own)
        if action == "FailIndex" or own > per_index_limit:
            result.failed_indexes.add(index)
    return result


def _success_rule(policy: Obj | None, completed: set[int]) -> int | None:
    for i, rule in enumerate((policy or {}).get("rules") or []):
        wanted_text, count = rule.get("succeededIndexes"), rule.get("succeededCount")
        if wanted_text is not None:
            wanted = {
                j for first, last in parse_intervals(wanted_text) for j in range(first, last + 1)
            }
            done = wanted & completed
            if count is None and done == wanted:
                return i
            if count is not None and len(done) >= count:
                return i
        elif count is not None and len(completed) >= count:
            return i
    return None


def sync_job(
    job: Obj, pods: list[Obj], now: datetime, *, backoff_base: float = BACKOFF_BASE_SECONDS
) -> JobDecisions:
    """What the Job controller does now for `job`, given the pods it owns."""
    decisions = JobDecisions()
    old_status = job.get("status") or {}
    status: Obj = copy.deepcopy(old_status)
    spec = job["spec"]
    decisions.status = status
    if job["metadata"].get("deletionTimestamp"):
        return decisions
    active = [p for p in pods if is_active(p)]
    done = finished(job)
    if done is not None:
        # a finished Job: its last pods go; then, after ttlSecondsAfterFinished, the Job
        decisions.delete = sorted(p["metadata"]["name"] for p in active)
        status["active"] = 0
        status["ready"] = 0
        _tidy(status)
        ttl = spec.get("ttlSecondsAfterFinished")
        at = finished_at(job)
        if ttl is not None and at is not None:
            expires = at + timedelta(seconds=ttl)
            if now >= expires:
                decisions.delete_job = True
            else:
                decisions.wake((expires - now).total_seconds())
        return decisions

    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    parallelism = int(spec.get("parallelism") or 0)
    succeeded_pods = [p for p in pods if phase(p) == "Succeeded"]
    failures = _failures(job, pods, completions)

    # counts: from the pods kept, never going down
    completed: set[int] = set()
    if indexed:
        completed = indexes_of(status.get("completedIndexes"))
        completed |= {
            i
            for p in succeeded_pods
            if (i := index_of(p)) is not None and completions is not None and i < completions
        }
        failures.failed_indexes -= completed
        succeeded = len(completed)
        status["completedIndexes"] = intervals_text(completed)
        if spec.get("backoffLimitPerIndex") is not None:
            status["failedIndexes"] = intervals_text(failures.failed_indexes)
    else:
        succeeded = max(int(status.get("succeeded") or 0), len(succeeded_pods))
    failed = max(int(status.get("failed") or 0), len(failures.counted))
    status["succeeded"] = succeeded
    status["failed"] = failed

    # suspended: no pods, the Suspended condition, the clock stopped
    if spec.get("suspend"):
        decisions.delete = sorted(p["metadata"]["name"] for p in active)
        if _set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended", now):
            decisions.events.append(("Normal", "Suspended", "Job suspended"))
        status.pop("startTime", None)
        _counts(status, [], pods)
        _tidy(status)
        return decisions
    if _condition(status, "Suspended") is not None:
        _set_condition(status, "Suspended", "False", "JobResumed", "Job resumed", now)
        decisions.events.append(("Normal", "Resumed", "Job resumed"))
        status.pop("startTime", None)
    if not status.get("startTime"):
        status["startTime"] = timestamp(now)
    started = parse_timestamp(status["startTime"])

    # has the Job reached its end?
    failure: tuple[str, str] | None = None
    success: tuple[str, str] | None = None
    if _condition(status, "FailureTarget") is not None:
        cond = _condition(status, "FailureTarget") or {}
        failure = (str(cond.get("reason")), str(cond.get("message")))
    elif _condition(status, "SuccessCriteriaMet") is not None:
        cond = _condition(status, "SuccessCriteriaMet") or {}
        success = (str(cond.get("reason")), str(cond.get("message")))
    else:
        failure = _failure_reason(job, failures, failed, completed, active, started, now)
        if failure is None:
            success = _success_reason(job, succeeded, completed, active, failures)
    deadline = spec.get("activeDeadlineSeconds")
    if failure is None and success is None and deadline is not None:
        decisions.wake((started + timedelta(seconds=deadline) - now).total_seconds())

    if failure is not None or success is not None:
        # the end: SuccessCriteriaMet / FailureTarget now; Complete / Failed once no pod runs
        kind = "FailureTarget" if failure is not None else "SuccessCriteriaMet"
        reason, message = failure if failure is not None else success  # type: ignore[misc]
        _set_condition(status, kind, "True", reason, message, now)
        decisions.delete = sorted(p["metadata"]["name"] for p in active)
        _counts(status, [], pods)
        if not any(terminating(p) for p in pods) and not active:
            final = "Failed" if failure is not None else "Complete"
            _set_condition(status, final, "True", reason, message, now)
            if final == "Complete":
                status["completionTime"] = timestamp(now)
            decisions.events.append(
                ("Warning", reason, message)
                if final == "Failed"
                else ("Normal", "Completed", "Job completed")
            )
        _tidy(status)
        return decisions

    # how many pods should run, and which
    keep, extra = _wanted(job, active, succeeded, completed, failures)
    decisions.delete = sorted(p["metadata"]["name"] for p in extra)
    to_make = _to_make(job, keep, succeeded, completed, failures, parallelism)
    if to_make:
        wait = _backoff(failures.counted, now, backoff_base, len(failures.counted))
        if wait > 0:
            decisions.wake(wait)
        else:
            for index in to_make:
                decisions.create.append(
                    new_pod(
                        job,
                        index,
                        failures.per_index.get(index, 0) if index is not None else 0,
                        failures.ignored_per_index.get(index, 0) if index is not None else 0,
                    )
                )
    _counts(status, keep, pods)
    status["active"] += len(decisions.create)  # as Kubernetes: the pods just made count
    _tidy(status)
    return decisions


def _failure_reason(
    job: Obj,
    failures: _Failures,
    failed: int,
    completed: set[int],
    active: list[Obj],
    started: datetime,
    now: datetime,
) -> tuple[str, str] | None:
    spec = job["spec"]
    if failures.fail_job is not None:
        return failures.fail_job
    limit = spec.get("backoffLimit")
    if limit is None:
        limit = 6
    counted = failed
    if (spec["template"].get("spec") or {}).get("restartPolicy") == "OnFailure":
        counted += sum(restarts(p) for p in active)
    if spec.get("backoffLimitPerIndex") is None and counted > limit:
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    max_failed = spec.get("maxFailedIndexes")
    if max_failed is not None and len(failures.failed_indexes) > max_failed:
        return (
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes",
        )
    completions = spec.get("completions")
    if (
        failures.failed_indexes
        and completions is not None
        and len(completed | failures.failed_indexes) >= completions
    ):
        return ("FailedIndexes", "Job has failed indexes")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and now >= started + timedelta(seconds=deadline):
        return ("DeadlineExceeded", "Job was active longer than specified deadline")
    return None


def _success_reason(
    job: Obj,
    succeeded: int,
    completed: set[int],
    active: list[Obj],
    failures: _Failures,
) -> tuple[str, str] | None:
    spec = job["spec"]
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed":
        rule = _success_rule(spec.get("successPolicy"), completed)
        if rule is not None:
            return ("SuccessPolicy", f"Matched rules at index {rule}")
        assert completions is not None
        if len(completed) >= completions:
            return ("CompletionsReached", "Reached expected number of succeeded pods")
        return None
    if completions is None:
        if succeeded > 0 and not active:
            return ("CompletionsReached", "Reached expected number of succeeded pods")
        return None
    if succeeded >= completions:
        return ("CompletionsReached", "Reached expected number of succeeded pods")
    return None


def _wanted(
    job: Obj,
    active: list[Obj],
    succeeded: int,
    completed: set[int],
    failures: _Failures,
) -> tuple[list[Obj], list[Obj]]:
    """The active pods to keep and those to delete (too many, or of an index that is done)."""
    spec = job["spec"]
    parallelism = int(spec.get("parallelism") or 0)
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed":
        keep, extra = [], []
        seen: set[int] = set()
        for pod in sorted(active, key=_deletion_order, reverse=True):
            index = index_of(pod)
            if (
                index is None
                or completions is None
                or index >= completions
                or index in completed
                or index in failures.failed_indexes
                or index in seen
            ):
                extra.append(pod)
            else:
                seen.add(index)
                keep.append(pod)
        if len(keep) > parallelism:  # keep the lowest indexes
            keep.sort(key=lambda p: index_of(p) or 0)
            extra += keep[parallelism:]
            keep = keep[:parallelism]
        return keep, extra
    if completions is None:
        # a work queue: once one pod succeeded no more are made; those running finish
        want = len(active) if succeeded > 0 else parallelism
    else:
        want = min(parallelism, max(0, completions - succeeded))
    if len(active) <= want:
        return list(active), []
    ordered = sorted(active, key=_deletion_order)  # the first to delete first
    cut = len(active) - want
    return ordered[cut:], ordered[:cut]


def _to_make(
    job: Obj,
    keep: list[Obj],
    succeeded: int,
    completed: set[int],
    failures: _Failures,
    parallelism: int,
) -> list[int | None]:
    spec = job["spec"]
    completions = spec.get("completions")
    room = parallelism - len(keep)
    if room <= 0:
        return []
    if spec.get("completionMode") == "Indexed":
        assert completions is not None
        running = {index_of(p) for p in keep}
        free: list[int | None] = []
        for index in range(completions):
            if index in completed or index in failures.failed_indexes or index in running:
                continue
            free.append(index)
            if len(free) == room:
                break
        return free
    if completions is None:
        return [None] * room if succeeded == 0 else []
    return [None] * min(room, max(0, completions - succeeded - len(keep)))


def _backoff(failed: list[Obj], now: datetime, base: float, count: int) -> float:
    """Seconds still to wait before a replacement pod, after the last failure."""
    if not failed or base <= 0:
        return 0.0
    last = max((t for p in failed if (t := finished_time(p)) is not None), default=None)
    if last is None:
        return 0.0
    delay = min(BACKOFF_MAX_SECONDS, base * 2 ** min(count - 1, 16))
    return max(0.0, (last + timedelta(seconds=delay) - now).total_seconds())


def _counts(status: Obj, active: list[Obj], pods: list[Obj]) -> None:
    status["active"] = len(active)
    status["ready"] = sum(1 for p in active if is_ready(p))
    status["terminating"] = sum(1 for p in pods if terminating(p))


def _tidy(status: Obj) -> None:
    """Kubernetes' JSON: zero counts and empty lists left out (ready and terminating are
    pointers: kept)."""
    for key in ("active", "succeeded", "failed"):
        if not status.get(key):
            status.pop(key, None)
    if not status.get("completedIndexes"):
        status.pop("completedIndexes", None)
    if not status.get("conditions"):
        status.pop("conditions", None)
    status.setdefault("uncountedTerminatedPods", {})
