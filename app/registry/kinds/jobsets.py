"""jobset.x-k8s.io/v1alpha2 JobSet: replicated Jobs that run, succeed and fail as one, as
kubernetes-sigs/jobset's JobSet, and, in Tessera, placed as one gang.

The strategy defaults and checks a JobSet as JobSet's webhook does: replicas 1, child Jobs
Indexed (so that pods get stable hostnames), pods `restartPolicy: OnFailure` unless set,
`network.enableDNSHostnames` true, `successPolicy` All, `startupPolicy` AnyOrder,
`failurePolicy.restartStrategy` Recreate and its rules named `failurePolicyRuleN`; names that
make child Jobs and pod hostnames valid DNS labels; success and failure policies that name
replicated jobs that exist; the spec unchanged by an update but for `suspend` (and the
template's labels and annotations while suspended).

Tessera's part is the gang: every pod of every replicated job is placed at once or none
(app/controllers/jobset_sync.py makes a tessera.io PodGroup of them all), within the topology
the JobSet asks for (`topology_of`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field

from app.constants import (
    ANNOTATION_TOPOLOGY_PREFERRED,
    ANNOTATION_TOPOLOGY_REQUIRED,
    LABEL_COSCHEDULING_POD_GROUP,
    LABEL_HOSTNAME,
    LABEL_NVLINK_DOMAIN,
    LABEL_POD_GROUP,
    LABEL_RACK,
    LABEL_ZONE,
)
from app.errors import Cause
from app.kube.meta import Int32, KubeModel, ListMeta, ObjectMeta
from app.kube.tables import Column, age
from app.registry.kinds.cronjobs import JobTemplateSpec
from app.registry.kinds.jobs import default_spec, spec_causes
from app.registry.strategy import Obj, Strategy

GROUP = "jobset.x-k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"

# labels and annotations JobSet's controller sets on its Jobs and their pods
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
GROUP_NAME = "jobset.sigs.k8s.io/group-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"

# the node label an exclusive-topology annotation names -> the PodGroup topology level
EXCLUSIVE_LEVELS = {
    LABEL_NVLINK_DOMAIN: "nvlink",
    LABEL_HOSTNAME: "node",
    LABEL_RACK: "rack",
    LABEL_ZONE: "zone",
}
LEVELS = ("nvlink", "node", "rack", "zone")  # tightest first
MAX_GANG = 4096  # a PodGroup's minMember
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
SUPPORTED_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")


class ReplicatedJob(KubeModel):
    name: str = Field(description="Suffix of the child Jobs' names: <jobset>-<name>-<index>.")
    group_name: str | None = None
    template: JobTemplateSpec
    replicas: Int32 | None = Field(default=None, description="Jobs made from the template.")


class JobSetNetwork(KubeModel):
    enable_dns_hostnames: bool | None = Field(default=None, alias="enableDNSHostnames")
    subdomain: str | None = None
    publish_not_ready_addresses: bool | None = None


class JobSetSuccessPolicy(KubeModel):
    operator: Literal["All", "Any"]
    target_replicated_jobs: list[str] | None = None


class JobSetFailurePolicyRule(KubeModel):
    name: str | None = None
    action: Literal[
        "FailJobSet",
        "RestartJobSet",
        "RestartJobSetAndIgnoreMaxRestarts",
        "RestartJob",
        "RestartJobAndIgnoreMaxRestarts",
    ]
    on_job_failure_reasons: list[str] | None = None
    on_job_failure_message_patterns: list[str] | None = None
    target_replicated_jobs: list[str] | None = None


class JobSetFailurePolicy(KubeModel):
    max_restarts: Int32 | None = Field(
        default=None, description="Restarts of the whole set (all Jobs recreated) before it fails."
    )
    restart_strategy: Literal["Recreate", "BlockingRecreate", "InPlaceRestart"] | None = None
    rules: list[JobSetFailurePolicyRule] | None = None


class JobSetStartupPolicy(KubeModel):
    startup_policy_order: Literal["AnyOrder", "InOrder"]


class JobSetSpec(KubeModel):
    replicated_jobs: list[ReplicatedJob] = Field(default_factory=list)
    network: JobSetNetwork | None = None
    success_policy: JobSetSuccessPolicy | None = None
    failure_policy: JobSetFailurePolicy | None = None
    startup_policy: JobSetStartupPolicy | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    ttl_seconds_after_finished: Int32 | None = None


class JobSetCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class ReplicatedJobStatus(KubeModel):
    name: str
    ready: Int32 = 0
    succeeded: Int32 = 0
    failed: Int32 = 0
    active: Int32 = 0
    suspended: Int32 = 0


class JobSetStatus(KubeModel):
    conditions: list[JobSetCondition] | None = None
    restarts: Int32 | None = None
    restarts_count_towards_max: Int32 | None = None
    terminal_state: str | None = None
    replicated_jobs_status: list[ReplicatedJobStatus] | None = None


class JobSet(KubeModel):
    """Replicated Jobs that run as one: one gang, one success, one failure."""

    api_version: Literal["jobset.x-k8s.io/v1alpha2"] | None = "jobset.x-k8s.io/v1alpha2"
    kind: Literal["JobSet"] | None = "JobSet"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: JobSetSpec = Field(default_factory=JobSetSpec)
    status: JobSetStatus | None = None


class JobSetList(KubeModel):
    api_version: Literal["jobset.x-k8s.io/v1alpha2"] = "jobset.x-k8s.io/v1alpha2"
    kind: Literal["JobSetList"] = "JobSetList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[JobSet]


# --- what a JobSet's pods are -----------------------------------------------------------------


def pods_per_job(job_spec: Obj) -> int:
    """The pods one child Job runs at once (min(parallelism, completions))."""
    parallelism = int(job_spec.get("parallelism") or 0)
    completions = job_spec.get("completions")
    return parallelism if completions is None else min(parallelism, int(completions))


def pods_of_replicated_job(rjob: Obj) -> int:
    spec = (rjob.get("template") or {}).get("spec") or {}
    return int(rjob.get("replicas") or 0) * pods_per_job(spec)


def total_pods(spec: Obj) -> int:
    """Every pod of the set: the gang's size."""
    return sum(pods_of_replicated_job(r) for r in spec.get("replicatedJobs") or [])


def subdomain(obj: Obj) -> str | None:
    """The pods' `subdomain` (None when DNS hostnames are off)."""
    network = (obj.get("spec") or {}).get("network") or {}
    if network.get("enableDNSHostnames") is False:
        return None
    return network.get("subdomain") or obj["metadata"]["name"]


def _tighter(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if LEVELS.index(a) <= LEVELS.index(b) else b


def topology_of(obj: Obj) -> tuple[str | None, str | None]:
    """The gang's (required, preferred) topology levels.

    `tessera.io/topology-required` / `-preferred` on the JobSet name levels for the whole set.
    `alpha.jobset.sigs.k8s.io/exclusive-topology` (on the JobSet, or on a replicated job's
    template) names a node label: its level is required of the whole gang, the tightest of all
    asked for. A preference no tighter than the requirement says nothing and is dropped."""
    annotations = obj["metadata"].get("annotations") or {}
    required = annotations.get(ANNOTATION_TOPOLOGY_REQUIRED)
    keys = [annotations.get(EXCLUSIVE_TOPOLOGY)]
    for rjob in (obj.get("spec") or {}).get("replicatedJobs") or []:
        tmeta = (rjob.get("template") or {}).get("metadata") or {}
        keys.append((tmeta.get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY))
    for key in keys:
        if key in EXCLUSIVE_LEVELS:
            required = _tighter(required, EXCLUSIVE_LEVELS[key])
    preferred = annotations.get(ANNOTATION_TOPOLOGY_PREFERRED)
    if (
        required is not None
        and preferred is not None
        and LEVELS.index(preferred) >= LEVELS.index(required)
    ):
        preferred = None
    return required, preferred


# --- defaults and validation ------------------------------------------------------------------


def default_jobset(spec: Obj) -> None:
    """JobSet's webhook defaults, in place."""
    if spec.get("successPolicy") is None:
        spec["successPolicy"] = {"operator": "All"}
    if spec.get("startupPolicy") is None:
        spec["startupPolicy"] = {"startupPolicyOrder": "AnyOrder"}
    network = spec.get("network")
    if network is None:
        network = spec["network"] = {}
    if isinstance(network, dict):
        if network.get("enableDNSHostnames") is None:
            network["enableDNSHostnames"] = True
        if network.get("publishNotReadyAddresses") is None:
            network["publishNotReadyAddresses"] = True
    policy = spec.get("failurePolicy")
    if isinstance(policy, dict):
        policy.setdefault("restartStrategy", "Recreate")
        for i, rule in enumerate(policy.get("rules") or []):
            if not rule.get("name"):
                rule["name"] = f"failurePolicyRule{i}"
    spec.setdefault("suspend", False)
    for rjob in spec.get("replicatedJobs") or []:
        if not isinstance(rjob, dict):
            continue
        if rjob.get("replicas") is None:
            rjob["replicas"] = 1
        rjob.setdefault("groupName", "default")
        job_spec = (rjob.get("template") or {}).get("spec")
        if not isinstance(job_spec, dict):
            continue
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = (job_spec.get("template") or {}).get("spec")
        if isinstance(pod_spec, dict) and not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
        default_spec(job_spec)


def _level_causes(annotations: dict[str, str], path: str) -> list[Cause]:
    causes = []
    for key in (ANNOTATION_TOPOLOGY_REQUIRED, ANNOTATION_TOPOLOGY_PREFERRED):
        value = annotations.get(key)
        if value is not None and value not in LEVELS:
            causes.append(
                Cause(
                    f"{path}[{key}]",
                    f'Unsupported value: "{value}": supported values: "nvlink", "node", "rack", '
                    '"zone" (the topology level every pod of the set must or should share)',
                    "FieldValueNotSupported",
                )
            )
    return causes


def _exclusive_causes(annotations: dict[str, str], path: str) -> list[Cause]:
    key = annotations.get(EXCLUSIVE_TOPOLOGY)
    if key is None or key in EXCLUSIVE_LEVELS:
        return []
    supported = ", ".join(f'"{k}" ({v})' for k, v in EXCLUSIVE_LEVELS.items())
    return [
        Cause(
            f"{path}[{EXCLUSIVE_TOPOLOGY}]",
            f'Unsupported value: "{key}": Tessera places a JobSet as one gang within one domain '
            f"of a topology level; supported node labels: {supported}",
            "FieldValueNotSupported",
        )
    ]


def _names_causes(names: list[str], known: set[str], path: str) -> list[Cause]:
    return [
        Cause(f"{path}[{i}]", f'Invalid value: "{n}": no replicated job of this name')
        for i, n in enumerate(names)
        if n not in known
    ]


def jobset_causes(obj: Obj) -> list[Cause]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name = meta.get("name") or ""
    annotations = meta.get("annotations") or {}
    causes = _level_causes(annotations, "metadata.annotations")
    causes += _exclusive_causes(annotations, "metadata.annotations")
    rjobs = spec.get("replicatedJobs") or []
    if not rjobs:
        causes.append(Cause("spec.replicatedJobs", "Required value: at least one replicated job"))
    seen: set[str] = set()
    for i, rjob in enumerate(rjobs):
        at = f"spec.replicatedJobs[{i}]"
        rname = rjob.get("name") or ""
        if not DNS_LABEL.match(rname):
            causes.append(
                Cause(
                    f"{at}.name",
                    f'Invalid value: "{rname}": a lowercase RFC 1035 label (a-z, 0-9, "-", '
                    "starting with a letter)",
                )
            )
        if rname in seen:
            causes.append(Cause(f"{at}.name", f'Duplicate value: "{rname}"'))
        seen.add(rname)
        replicas = int(rjob.get("replicas") or 0)
        if replicas < 0:
            causes.append(Cause(f"{at}.replicas", f"Invalid value: {replicas}: must be at least 0"))
        template = rjob.get("template") or {}
        job_spec = dict(template.get("spec") or {})
        pods = pods_per_job(job_spec)
        # the longest child Job name and pod hostname must be DNS labels (63 characters)
        longest = f"{name}-{rname}-{max(replicas - 1, 0)}-{max(pods - 1, 0)}"
        if len(longest) > 63:
            causes.append(
                Cause(
                    f"{at}.name",
                    f'Invalid value: "{rname}": the pods\' hostnames ("{longest}") would be '
                    "longer than 63 characters: shorten the JobSet's or the replicated job's name",
                )
            )
        tmeta = template.get("metadata") or {}
        causes += _exclusive_causes(tmeta.get("annotations") or {}, f"{at}.template.metadata")
        pod_meta = (job_spec.get("template") or {}).get("metadata") or {}
        for label in (LABEL_POD_GROUP, LABEL_COSCHEDULING_POD_GROUP):
            if label in (pod_meta.get("labels") or {}):
                causes.append(
                    Cause(
                        f"{at}.template.spec.template.metadata.labels[{label}]",
                        "Forbidden: a JobSet's pods are one gang of their own (its PodGroup); "
                        "they may not join another",
                    )
                )
        if job_spec.get("manualSelector"):
            causes.append(
                Cause(
                    f"{at}.template.spec.manualSelector",
                    "Forbidden: a JobSet's Jobs select "
                    "their pods by the selector generated for each",
                )
            )
        # the template is checked as each Job's spec will be (its selector generated per Job)
        labels = pod_meta.get("labels") or {}
        job_spec["selector"] = {"matchLabels": {"_": "_"}}
        job_spec["template"] = {
            **(job_spec.get("template") or {}),
            "metadata": {**pod_meta, "labels": {**labels, "_": "_"}},
        }
        causes += spec_causes(job_spec, f"{at}.template.spec")
    known = {r.get("name") for r in rjobs if r.get("name")}
    success = spec.get("successPolicy") or {}
    causes += _names_causes(
        success.get("targetReplicatedJobs") or [], known, "spec.successPolicy.targetReplicatedJobs"
    )
    policy = spec.get("failurePolicy") or {}
    max_restarts = policy.get("maxRestarts")
    if max_restarts is not None and max_restarts < 0:
        causes.append(
            Cause(
                "spec.failurePolicy.maxRestarts",
                f"Invalid value: {max_restarts}: must be at least 0",
            )
        )
    strategy = policy.get("restartStrategy")
    if strategy not in (None, "Recreate", "BlockingRecreate"):
        causes.append(
            Cause(
                "spec.failurePolicy.restartStrategy",
                f'Unsupported value: "{strategy}": supported values: "Recreate", '
                '"BlockingRecreate" (both recreate every Job once the last ones are gone: the '
                "set is one gang)",
                "FieldValueNotSupported",
            )
        )
    for i, rule in enumerate(policy.get("rules") or []):
        at = f"spec.failurePolicy.rules[{i}]"
        if not RULE_NAME.match(rule.get("name") or ""):
            causes.append(Cause(f"{at}.name", f'Invalid value: "{rule.get("name")}"'))
        if rule.get("action") not in SUPPORTED_ACTIONS:
            causes.append(
                Cause(
                    f"{at}.action",
                    f'Unsupported value: "{rule.get("action")}": supported values: '
                    + ", ".join(f'"{a}"' for a in SUPPORTED_ACTIONS)
                    + " (one Job alone is never recreated: the set is one gang)",
                    "FieldValueNotSupported",
                )
            )
        for j, pattern in enumerate(rule.get("onJobFailureMessagePatterns") or []):
            try:
                re.compile(pattern)
            except re.error as exc:
                causes.append(
                    Cause(
                        f"{at}.onJobFailureMessagePatterns[{j}]",
                        f'Invalid value: "{pattern}": {exc}',
                    )
                )
        causes += _names_causes(
            rule.get("targetReplicatedJobs") or [], known, f"{at}.targetReplicatedJobs"
        )
    network = spec.get("network") or {}
    sub = network.get("subdomain")
    if sub and not DNS_LABEL.match(sub):
        causes.append(
            Cause("spec.network.subdomain", f'Invalid value: "{sub}": a lowercase RFC 1035 label')
        )
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is not None and ttl < 0:
        causes.append(
            Cause("spec.ttlSecondsAfterFinished", f"Invalid value: {ttl}: must be at least 0")
        )
    total = total_pods(spec)
    if total > MAX_GANG:
        causes.append(
            Cause(
                "spec.replicatedJobs",
                f"Invalid value: {total} pods: a JobSet is one gang of at most {MAX_GANG} pods",
            )
        )
    return causes


IMMUTABLE = ("network", "successPolicy", "failurePolicy", "startupPolicy", "managedBy")


def update_causes(obj: Obj, old: Obj) -> list[Cause]:
    """What an update may not change: everything in the spec but `suspend` and
    `ttlSecondsAfterFinished`; while suspended, the templates' labels and annotations."""
    spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
    causes = [
        Cause(f"spec.{field}", "Invalid value: field is immutable", "FieldValueInvalid")
        for field in IMMUTABLE
        if spec.get(field) != old_spec.get(field)
    ]
    rjobs, old_rjobs = spec.get("replicatedJobs") or [], old_spec.get("replicatedJobs") or []
    if _without_meta(rjobs) != _without_meta(old_rjobs) or (
        rjobs != old_rjobs and not spec.get("suspend")
    ):
        causes.append(
            Cause(
                "spec.replicatedJobs",
                "Invalid value: field is immutable (but for the templates' labels and "
                "annotations while the JobSet is suspended)",
                "FieldValueInvalid",
            )
        )
    return causes


def _without_meta(rjobs: list[Obj]) -> list[Obj]:
    out = []
    for rjob in rjobs:
        template = dict(rjob.get("template") or {})
        template.pop("metadata", None)
        job_spec = dict(template.get("spec") or {})
        pod = dict(job_spec.get("template") or {})
        pod.pop("metadata", None)
        job_spec["template"] = pod
        template["spec"] = job_spec
        out.append({**rjob, "template": template})
    return out


# --- the printer ------------------------------------------------------------------------------


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


class JobSetStrategy(Strategy):
    kind = "JobSet"
    resource = "jobsets"
    singular = "jobset"
    group = GROUP
    version = VERSION
    model = JobSet
    list_model = JobSetList
    categories = ("all",)
    has_status = True
    generation = True
    workload = True
    has_dependents = True  # Foreground and Orphan deletions wait for the collector
    summary = "replicated Jobs run as one gang (failure and success policies, startup order)"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the JobSet.", 0),
        ("TerminalState", "string", "Final state of JobSet", 0),
        ("Restarts", "string", "Number of restarts", 0),
        ("Completed", "string", "Whether the JobSet completed.", 0),
        ("Suspended", "string", "JobSet suspended", 0),
        ("Age", "string", "Time this JobSet was created", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        completed = condition(obj, "Completed")
        suspend = spec.get("suspend")
        return [
            obj["metadata"]["name"],
            status.get("terminalState") or "",
            str(status.get("restarts") or 0),
            completed.get("status", "") if completed else "",
            "" if suspend is None else str(bool(suspend)).lower(),
            age(obj["metadata"].get("creationTimestamp")),
        ]

    def prepare_create(self, obj: Obj) -> None:
        default_jobset(obj.setdefault("spec", {}))

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        default_jobset(obj.setdefault("spec", {}))

    def validate(self, obj: Obj) -> list[Cause]:
        return jobset_causes(obj)

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        return update_causes(obj, old)
