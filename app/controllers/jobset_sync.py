"""What the JobSet controller decides for one JobSet: pure, no I/O, no clock.

`sync_jobset(jobset, jobs, pods, pod_group, now)` takes a JobSet, the Jobs it owns, the pods of
its Jobs (labelled with its uid), its PodGroup (or None) and the time, and returns
`JobSetDecisions`: the PodGroup to make or change, the Jobs to create, suspend, resume or delete,
the pods left by Jobs of an earlier attempt to delete, the JobSet's new status, and when to look
again. As kubernetes-sigs/jobset's controller:

- Each replicated job makes `replicas` Jobs `<jobset>-<replicatedJob>-<index>`, labelled and
  annotated `jobset.sigs.k8s.io/jobset-name`, `replicatedjob-name`, `replicatedjob-replicas`,
  `job-index`, `job-global-index`, `global-replicas`, `job-key`, `group-name` and
  `restart-attempt` (their pods too); Indexed, so each pod's hostname is
  `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`, with `subdomain` the network's subdomain
  (default: the JobSet's name).
- **Failure**: a failed Job is matched against `failurePolicy.rules` (its Failed condition's
  reason and message, its replicated job): FailJobSet fails the set; RestartJobSet (also the
  default when a failurePolicy is set) recreates every Job, `status.restarts` and
  `restartsCountTowardsMax` bumped, unless `maxRestarts` is reached (Failed, ReachedMaxRestarts);
  RestartJobSetAndIgnoreMaxRestarts always restarts. Without a failurePolicy, the set fails
  (FailedJobs). A restart deletes the Jobs of the last attempt and their pods, and makes the
  new ones only once none of them is left (the whole gang is placed anew, never beside the
  pods of the attempt before).
- **Success**: `successPolicy` All (every Job of the target replicated jobs, default all)
  or Any (one of them) succeeded: Completed. A finished set deletes its Jobs still running.
- **startupPolicy InOrder**: a replicated job's Jobs are made once every Job of the ones
  before it is ready (StartupPolicyInProgress, then StartupPolicyCompleted).
- **suspend**: the Jobs are suspended (their pods deleted), Suspended; resumed, they run again.
- **network**: with `enableDNSHostnames` (the default), a headless Service named as the pods'
  subdomain (`network.subdomain`, else the JobSet's name), selecting the JobSet's pods by its
  name label, `publishNotReadyAddresses` (a pod is found by `<hostname>.<subdomain>` before it is
  ready), owned by the JobSet; made while the set runs if no Service of that name exists.

What makes it Tessera's: the set is one gang. Its PodGroup (tessera.io/v1, named as the JobSet,
owned by it) has `minMember` every pod of the set, and every pod template carries the label
`tessera.io/pod-group`, so the scheduler places all of them at once or none, within the
topology the JobSet asks for (app/registry/kinds/jobsets.py `topology_of`). With InOrder,
`minMember` grows with each replicated job made, before its Jobs are: each step is placed whole,
inside the domain of the pods already running.
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.constants import LABEL_POD_GROUP
from app.kube.meta import parse_timestamp, timestamp
from app.registry.kinds.jobs import finished
from app.registry.kinds.jobsets import (
    API_VERSION,
    EXCLUSIVE_TOPOLOGY,
    GLOBAL_REPLICAS,
    GROUP_NAME,
    JOB_GLOBAL_INDEX,
    JOB_INDEX,
    JOB_KEY,
    JOBSET_NAME,
    JOBSET_UID,
    REPLICATED_JOB_NAME,
    REPLICATED_JOB_REPLICAS,
    RESTART_ATTEMPT,
    pods_of_replicated_job,
    pods_per_job,
    subdomain,
    topology_of,
)

Obj = dict[str, Any]

MANAGER = "jobset.sigs.k8s.io/jobset-controller"  # the managedBy JobSet's controller takes
# reasons and messages as JobSet's (pkg/constants)
ALL_JOBS_COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
REACHED_MAX_RESTARTS = (
    "ReachedMaxRestarts",
    "jobset failed due to reaching max number of restarts",
)
FAIL_JOBSET_ACTION = ("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")
SUSPENDED = ("SuspendedJobs", "jobset is suspended")
RESUMED = ("ResumeJobs", "jobset is resumed")
IN_ORDER_IN_PROGRESS = ("InOrderStartupPolicyInProgress", "in order startup policy is in progress")
IN_ORDER_COMPLETED = ("InOrderStartupPolicyCompleted", "in order startup policy has completed")


@dataclass
class JobSetDecisions:
    pod_group: Obj | None = None  # a PodGroup to create, or the existing one changed (PUT)
    create_pod_group: bool = False
    pod_group_conflict: str | None = None  # a PodGroup of that name is not this JobSet's
    service: Obj | None = None  # the headless Service to create
    create: list[Obj] = field(default_factory=list)  # Job bodies
    delete: list[Obj] = field(default_factory=list)  # Jobs to delete
    delete_pods: list[Obj] = field(default_factory=list)  # pods of Jobs of an earlier attempt
    suspend: list[Obj] = field(default_factory=list)  # Jobs to suspend
    resume: list[Obj] = field(default_factory=list)  # Jobs to resume
    status: Obj = field(default_factory=dict)
    delete_jobset: bool = False  # ttlSecondsAfterFinished has passed
    requeue_after: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


# --- names and bodies ------------------------------------------------------------------------


def job_name(jobset: str, rjob: str, index: int) -> str:
    return f"{jobset}-{rjob}-{index}"


def job_key(namespace: str, name: str) -> str:
    """JobSet's job-key: a hash of the namespaced Job name (SHA-1, 40 hex characters: a label
    value)."""
    return hashlib.sha1(f"{namespace}/{name}".encode()).hexdigest()


def owner_reference(jobset: Obj) -> Obj:
    meta = jobset["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def new_job(jobset: Obj, rjob: Obj, index: int, global_index: int, attempt: int) -> Obj:
    """The child Job `index` of replicated job `rjob`, as JobSet's constructJob makes it, its
    pods in the JobSet's gang."""
    meta, spec = jobset["metadata"], jobset["spec"]
    namespace = meta.get("namespace") or ""
    name = job_name(meta["name"], rjob["name"], index)
    template = copy.deepcopy(rjob["template"])
    tmeta = template.get("metadata") or {}
    global_replicas = sum(int(r.get("replicas") or 0) for r in spec.get("replicatedJobs") or [])
    marks = {
        JOBSET_NAME: meta["name"],
        JOBSET_UID: meta["uid"],
        REPLICATED_JOB_NAME: rjob["name"],
        REPLICATED_JOB_REPLICAS: str(rjob.get("replicas") or 0),
        GLOBAL_REPLICAS: str(global_replicas),
        JOB_INDEX: str(index),
        JOB_GLOBAL_INDEX: str(global_index),
        JOB_KEY: job_key(namespace, name),
        GROUP_NAME: rjob.get("groupName") or "default",
        RESTART_ATTEMPT: str(attempt),
    }
    annotations = {**(tmeta.get("annotations") or {}), **marks}
    exclusive = (meta.get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY)
    if exclusive and EXCLUSIVE_TOPOLOGY not in annotations:
        annotations[EXCLUSIVE_TOPOLOGY] = exclusive
    job_spec = template["spec"]
    pod_template = job_spec.setdefault("template", {})
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = {
        **(pod_meta.get("labels") or {}),
        **marks,
        LABEL_POD_GROUP: pod_group_name(jobset),
    }
    pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **marks}
    sub = subdomain(jobset)
    if sub is not None:
        pod_template["spec"]["subdomain"] = sub
    job_spec["suspend"] = bool(spec.get("suspend"))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(tmeta.get("labels") or {}), **marks},
            "annotations": annotations,
            "ownerReferences": [owner_reference(jobset)],
        },
        "spec": job_spec,
    }


def new_service(jobset: Obj) -> Obj | None:
    """The headless Service of the pods' subdomain (None: DNS hostnames are off)."""
    name = subdomain(jobset)
    if name is None:
        return None
    meta = jobset["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace"),
            "labels": {JOBSET_NAME: meta["name"]},
            "ownerReferences": [owner_reference(jobset)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOBSET_NAME: meta["name"]},
            "publishNotReadyAddresses": True,
        },
    }


def pod_group_name(jobset: Obj) -> str:
    return str(jobset["metadata"]["name"])


def new_pod_group(jobset: Obj, min_member: int) -> Obj:
    required, preferred = topology_of(jobset)
    topology = {k: v for k, v in (("required", required), ("preferred", preferred)) if v}
    meta = jobset["metadata"]
    return {
        "apiVersion": "tessera.io/v1",
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(jobset),
            "namespace": meta.get("namespace"),
            "labels": {JOBSET_NAME: meta["name"], JOBSET_UID: meta["uid"]},
            "ownerReferences": [owner_reference(jobset)],
        },
        "spec": {"minMember": max(1, min_member), "topology": topology},
    }


# --- conditions -------------------------------------------------------------------------------


def set_condition(
    status: Obj, kind: str, value: str, reason: str, message: str, now: datetime
) -> bool:
    """A metav1.Condition set; True when it changed (its transition time moves only with its
    status)."""
    conditions: list[Obj] = status.setdefault("conditions", [])
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
            cond["lastTransitionTime"] = timestamp(now)
        cond.update(status=value, reason=reason, message=message)
        return True
    conditions.append(
        {
            "type": kind,
            "status": value,
            "lastTransitionTime": timestamp(now),
            "reason": reason,
            "message": message,
        }
    )
    return True


def is_true(status: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _finished_at(status: Obj) -> datetime | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and cond.get("status") == "True":
            at = cond.get("lastTransitionTime")
            return parse_timestamp(at) if at else None
    return None


# --- the Jobs ---------------------------------------------------------------------------------


def attempt_of(obj: Obj) -> int:
    text = ((obj.get("metadata") or {}).get("labels") or {}).get(RESTART_ATTEMPT) or "0"
    return int(text) if str(text).isdigit() else 0


def _rjob_of(job: Obj) -> str:
    return str(((job.get("metadata") or {}).get("labels") or {}).get(REPLICATED_JOB_NAME) or "")


def _job_ready(job: Obj) -> bool:
    """Ready as JobSet counts it: ready and succeeded pods reach min(parallelism, completions)."""
    status = job.get("status") or {}
    want = pods_per_job(job.get("spec") or {})
    return int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= want


def replicated_jobs_status(jobset: Obj, jobs: list[Obj]) -> list[Obj]:
    out = []
    for rjob in jobset["spec"].get("replicatedJobs") or []:
        mine = [j for j in jobs if _rjob_of(j) == rjob["name"]]
        done = [finished(j) for j in mine]
        out.append(
            {
                "name": rjob["name"],
                "ready": sum(
                    1 for j, d in zip(mine, done, strict=True) if d is None and _job_ready(j)
                ),
                "succeeded": done.count("Complete"),
                "failed": done.count("Failed"),
                "active": sum(
                    1
                    for j, d in zip(mine, done, strict=True)
                    if d is None and int((j.get("status") or {}).get("active") or 0) > 0
                ),
                "suspended": sum(1 for j in mine if (j.get("spec") or {}).get("suspend")),
            }
        )
    return out


def _failed_condition(job: Obj) -> Obj:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return dict(cond)
    return {}


def matching_rule(policy: Obj, job: Obj) -> Obj | None:
    """The first failurePolicy rule a failed Job matches (its reason, message, replicated job)."""
    cond = _failed_condition(job)
    for rule in policy.get("rules") or []:
        targets = rule.get("targetReplicatedJobs") or []
        if targets and _rjob_of(job) not in targets:
            continue
        reasons = rule.get("onJobFailureReasons") or []
        if reasons and cond.get("reason") not in reasons:
            continue
        patterns = rule.get("onJobFailureMessagePatterns") or []
        message = str(cond.get("message") or "")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        return dict(rule)
    return None


def _succeeded(jobset: Obj, jobs: list[Obj]) -> bool:
    spec = jobset["spec"]
    policy = spec.get("successPolicy") or {"operator": "All"}
    targets = policy.get("targetReplicatedJobs") or [r["name"] for r in spec["replicatedJobs"]]
    if policy.get("operator") == "Any":
        return any(_rjob_of(j) in targets and finished(j) == "Complete" for j in jobs)
    for rjob in spec["replicatedJobs"]:
        if rjob["name"] not in targets:
            continue
        done = {
            j["metadata"]["name"]
            for j in jobs
            if _rjob_of(j) == rjob["name"] and finished(j) == "Complete"
        }
        if len(done) < int(rjob.get("replicas") or 0):
            return False
    return True


# --- the sync ---------------------------------------------------------------------------------


def sync_jobset(
    jobset: Obj,
    jobs: list[Obj],
    pods: list[Obj],
    pod_group: Obj | None,
    now: datetime,
    *,
    service: Obj | None = None,
) -> JobSetDecisions:
    """What the JobSet controller does now for `jobset` (`service`: the Service named as its
    subdomain, whoever's it is)."""
    decisions = JobSetDecisions()
    old_status = jobset.get("status") or {}
    status: Obj = copy.deepcopy(old_status)
    decisions.status = status
    spec = jobset["spec"]
    if jobset["metadata"].get("deletionTimestamp") or spec.get("managedBy") not in (
        None,
        MANAGER,
    ):
        return decisions  # being deleted, or another controller's (as JobSet's managedBy)
    status.setdefault("restarts", 0)
    attempt = int(status.get("restarts") or 0)
    current = [j for j in jobs if attempt_of(j) == attempt]
    stale = [j for j in jobs if attempt_of(j) != attempt]
    decisions.delete += [j for j in stale if not j["metadata"].get("deletionTimestamp")]
    stale_pods = [p for p in pods if attempt_of(p) != attempt]
    decisions.delete_pods += [p for p in stale_pods if not p["metadata"].get("deletionTimestamp")]
    status["replicatedJobsStatus"] = replicated_jobs_status(jobset, current)

    if status.get("terminalState") or is_true(status, "Completed") or is_true(status, "Failed"):
        # finished: its Jobs still running go; then, after ttlSecondsAfterFinished, the JobSet
        decisions.delete += [j for j in current if finished(j) is None]
        ttl = spec.get("ttlSecondsAfterFinished")
        at = _finished_at(status)
        if ttl is not None and at is not None:
            expires = at + timedelta(seconds=ttl)
            if now >= expires:
                decisions.delete_jobset = True
            else:
                decisions.requeue_after = (expires - now).total_seconds()
        return decisions

    # a failed Job: the failure policy says fail, or restart the whole set
    failed = [j for j in current if finished(j) == "Failed"]
    if failed:
        policy = spec.get("failurePolicy")
        if policy is None:
            return _fail(decisions, spec, current, FAILED_JOBS, now)
        rule = matching_rule(policy, failed[0])
        action = rule["action"] if rule else "RestartJobSet"
        if action == "FailJobSet":
            return _fail(decisions, spec, current, FAIL_JOBSET_ACTION, now)
        counted = int(status.get("restartsCountTowardsMax") or 0)
        if action == "RestartJobSet":
            if counted >= int(policy.get("maxRestarts") or 0):
                return _fail(decisions, spec, current, REACHED_MAX_RESTARTS, now)
            status["restartsCountTowardsMax"] = counted + 1
        status["restarts"] = attempt + 1
        decisions.delete += [j for j in current if not j["metadata"].get("deletionTimestamp")]
        cond = _failed_condition(failed[0])
        decisions.events.append(
            (
                "Warning",
                "Restarting",
                f"restarting jobset, attempt {attempt + 1}: job {failed[0]['metadata']['name']} "
                f"failed ({cond.get('reason', 'Failed')})",
            )
        )
        status["replicatedJobsStatus"] = replicated_jobs_status(jobset, [])
        decisions.requeue_after = 0.5
        return decisions

    if current and _succeeded(jobset, current):
        set_condition(status, "Completed", "True", *ALL_JOBS_COMPLETED, now)
        status["terminalState"] = "Completed"
        decisions.events.append(("Normal", *ALL_JOBS_COMPLETED))
        decisions.delete += [j for j in current if finished(j) is None]
        _requeue_ttl(decisions, spec)
        return decisions

    # the network: the subdomain's headless Service, unless a Service of that name exists
    if service is None:
        decisions.service = new_service(jobset)

    # suspend and resume
    suspend = bool(spec.get("suspend"))
    if suspend:
        decisions.suspend = [
            j for j in current if not (j.get("spec") or {}).get("suspend") and finished(j) is None
        ]
        if set_condition(status, "Suspended", "True", *SUSPENDED, now):
            decisions.events.append(("Normal", *SUSPENDED))
    else:
        decisions.resume = [
            j for j in current if (j.get("spec") or {}).get("suspend") and finished(j) is None
        ]
        if is_true(status, "Suspended"):
            set_condition(status, "Suspended", "False", *RESUMED, now)
            decisions.events.append(("Normal", *RESUMED))

    # the Jobs to make: none while any of an earlier attempt (or its pods) is left
    if stale or stale_pods:
        decisions.requeue_after = 1.0
        return decisions
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
    existing = {j["metadata"]["name"] for j in jobs}
    rjobs = spec.get("replicatedJobs") or []
    rstatus = {r["name"]: r for r in status["replicatedJobsStatus"]}
    global_index = 0
    wanted_members = 0
    to_make: list[Obj] = []
    all_started = True
    for rjob in rjobs:
        replicas = int(rjob.get("replicas") or 0)
        wanted_members += pods_of_replicated_job(rjob)
        for index in range(replicas):
            name = job_name(jobset["metadata"]["name"], rjob["name"], index)
            if name not in existing:
                to_make.append(new_job(jobset, rjob, index, global_index + index, attempt))
        global_index += replicas
        if in_order and not suspend:
            done = rstatus[rjob["name"]]
            if done["ready"] + done["succeeded"] < replicas:
                all_started = False
                break  # the next replicated job waits for this one's Jobs to be ready
    if in_order and not suspend:
        if all_started:
            if set_condition(status, "StartupPolicyCompleted", "True", *IN_ORDER_COMPLETED, now):
                set_condition(status, "StartupPolicyInProgress", "False", *IN_ORDER_COMPLETED, now)
                decisions.events.append(("Normal", *IN_ORDER_COMPLETED))
        elif not is_true(status, "StartupPolicyCompleted"):
            set_condition(status, "StartupPolicyInProgress", "True", *IN_ORDER_IN_PROGRESS, now)

    # the gang: its PodGroup first (its minMember never below the pods about to be made)
    if pod_group is None:
        decisions.pod_group = new_pod_group(jobset, wanted_members)
        decisions.create_pod_group = True
    else:
        owners = (pod_group.get("metadata") or {}).get("ownerReferences") or []
        if not any(r.get("uid") == jobset["metadata"]["uid"] for r in owners):
            decisions.pod_group_conflict = (
                f'a PodGroup "{pod_group_name(jobset)}" that is not this JobSet\'s exists: '
                "delete it, or name the JobSet otherwise"
            )
            return decisions
        wanted = new_pod_group(jobset, wanted_members)
        if (pod_group.get("spec") or {}).get("minMember") != wanted["spec"]["minMember"]:
            changed = copy.deepcopy(pod_group)
            changed["spec"] = {**(changed.get("spec") or {}), **wanted["spec"]}
            changed.pop("status", None)
            decisions.pod_group = changed
    decisions.create = to_make
    return decisions


def _fail(
    decisions: JobSetDecisions,
    spec: Obj,
    current: list[Obj],
    why: tuple[str, str],
    now: datetime,
) -> JobSetDecisions:
    status = decisions.status
    set_condition(status, "Failed", "True", *why, now)
    status["terminalState"] = "Failed"
    decisions.events.append(("Warning", *why))
    decisions.delete += [j for j in current if finished(j) is None]
    _requeue_ttl(decisions, spec)
    return decisions


def _requeue_ttl(decisions: JobSetDecisions, spec: Obj) -> None:
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is not None:
        decisions.requeue_after = float(ttl)
