"""batch/v1 Job: pods run to completion, as Kubernetes' Job.

The strategy defaults and checks a Job as the Kubernetes apiserver does (pkg/apis/batch: its
defaults, `generateSelector` and `ValidateJob` / `ValidateJobUpdate`): the selector
`batch.kubernetes.io/controller-uid=<uid>` and the template's labels are generated unless
`manualSelector`; completions and parallelism are bounded (an Indexed Job by 100,000); the
template, selector, completionMode, podFailurePolicy, successPolicy and backoffLimitPerIndex
never change. What the Job controller does with it is app/controllers/job_sync.py.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from app.errors import Cause
from app.kube.meta import (
    INT32_MAX,
    Int32,
    KubeModel,
    ListMeta,
    ObjectMeta,
    now,
    parse_timestamp,
)
from app.kube.selectors import LabelSelector, Requirement
from app.kube.tables import Column, age
from app.pods.schemas import PodSpec
from app.registry.strategy import Obj, Strategy

# labels and annotations Kubernetes' Job controller and apiserver set
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID = "controller-uid"
LEGACY_JOB_NAME = "job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
MAX_INDEXED = 100_000  # completions and parallelism of an Indexed Job
MAX_POD_FAILURE_RULES = 20
MAX_EXIT_CODES = 255
MAX_SUCCESS_RULES = 20
MAX_INTERVALS_CHARS = 64 * 1024  # a successPolicy rule's succeededIndexes


class LabelSelectorRequirement(KubeModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelectorModel(KubeModel):
    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None


class PodTemplateSpec(KubeModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec


class PodFailurePolicyOnExitCodes(KubeModel):
    container_name: str | None = None
    operator: Literal["In", "NotIn"]
    values: list[Int32]


class PodFailurePolicyOnPodConditions(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"] | None = None


class PodFailurePolicyRule(KubeModel):
    action: Literal["FailJob", "FailIndex", "Ignore", "Count"]
    on_exit_codes: PodFailurePolicyOnExitCodes | None = None
    on_pod_conditions: list[PodFailurePolicyOnPodConditions] | None = None


class PodFailurePolicy(KubeModel):
    rules: list[PodFailurePolicyRule]


class SuccessPolicyRule(KubeModel):
    succeeded_indexes: str | None = None
    succeeded_count: Int32 | None = None


class SuccessPolicy(KubeModel):
    rules: list[SuccessPolicyRule]


class JobSpec(KubeModel):
    parallelism: Int32 | None = Field(default=None, description="Pods running at once (default 1).")
    completions: Int32 | None = Field(
        default=None,
        description="Successful pods that complete the Job (unset: any one success, once none "
        "is running).",
    )
    active_deadline_seconds: int | None = Field(
        default=None, description="Seconds from the Job's start after which it fails."
    )
    pod_failure_policy: PodFailurePolicy | None = None
    success_policy: SuccessPolicy | None = None
    backoff_limit: Int32 | None = Field(
        default=None, description="Failed pods before the Job fails (default 6)."
    )
    backoff_limit_per_index: Int32 | None = None
    max_failed_indexes: Int32 | None = None
    selector: LabelSelectorModel | None = None
    manual_selector: bool | None = None
    template: PodTemplateSpec
    ttl_seconds_after_finished: Int32 | None = None
    completion_mode: Literal["NonIndexed", "Indexed"] | None = None
    suspend: bool | None = None
    pod_replacement_policy: Literal["TerminatingOrFailed", "Failed"] | None = None
    managed_by: str | None = None


class JobCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    last_probe_time: str | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class UncountedTerminatedPods(KubeModel):
    succeeded: list[str] | None = None
    failed: list[str] | None = None


class JobStatus(KubeModel):
    conditions: list[JobCondition] | None = None
    start_time: str | None = None
    completion_time: str | None = None
    active: Int32 | None = None
    succeeded: Int32 | None = None
    failed: Int32 | None = None
    terminating: Int32 | None = None
    completed_indexes: str | None = None
    failed_indexes: str | None = None
    uncounted_terminated_pods: UncountedTerminatedPods | None = None
    ready: Int32 | None = None


class Job(KubeModel):
    """Pods run to completion: `completions` successes, `parallelism` at a time."""

    api_version: Literal["batch/v1"] | None = "batch/v1"
    kind: Literal["Job"] | None = "Job"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: JobSpec
    status: JobStatus | None = None


class JobList(KubeModel):
    api_version: Literal["batch/v1"] = "batch/v1"
    kind: Literal["JobList"] = "JobList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Job]


# --- label selectors --------------------------------------------------------------------------


def selector_of(selector: Obj | None) -> LabelSelector | None:
    """A metav1.LabelSelector as Tessera's selector; None for a missing selector (which
    selects nothing). An empty selector selects everything."""
    if selector is None:
        return None
    reqs = [Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}[
            expr["operator"]
        ]
        reqs.append(Requirement(expr["key"], op, tuple(expr.get("values") or ())))
    return LabelSelector(tuple(reqs))


def selector_text(selector: Obj | None) -> str:
    """A selector as `kubectl get -o wide` prints it (`a=b,c in (d)`)."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, values = expr["operator"], ",".join(expr.get("values") or [])
        parts.append(
            {
                "In": f"{expr['key']} in ({values})",
                "NotIn": f"{expr['key']} notin ({values})",
                "Exists": expr["key"],
                "DoesNotExist": f"!{expr['key']}",
            }[op]
        )
    return ",".join(parts) or "<none>"


def _selector_causes(selector: Obj | None, path: str) -> list[Cause]:
    if selector is None:
        return [Cause(path, "Required value")]
    causes = []
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        values = expr.get("values") or []
        if expr["operator"] in ("In", "NotIn") and not values:
            causes.append(
                Cause(
                    f"{path}.matchExpressions[{i}].values",
                    "Required value: must be specified when `operator` is 'In' or 'NotIn'",
                )
            )
        if expr["operator"] in ("Exists", "DoesNotExist") and values:
            causes.append(
                Cause(
                    f"{path}.matchExpressions[{i}].values",
                    "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    return causes


# --- index intervals ("1,3-5,7") --------------------------------------------------------------

_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_intervals(text: str | None, limit: int | None = None) -> list[tuple[int, int]]:
    """The sorted, non-overlapping intervals of an index list such as `1,3-5,7`; ValueError
    says what is wrong. `limit`: every index must be below it."""
    if not text:
        return []
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        match = _INTERVAL.match(part)
        if match is None:
            raise ValueError(f"cannot parse {part!r}: expected an index or a range first-last")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"range {part!r} ends before it starts")
        if out and first <= out[-1][1]:
            raise ValueError(f"{part!r} overlaps or comes before the previous interval")
        if limit is not None and last >= limit:
            raise ValueError(f"too large: index {last} is not below completions ({limit})")
        out.append((first, last))
    return out


def intervals_text(indexes: set[int] | list[int]) -> str:
    """`1,3-5,7` for {1, 3, 4, 5, 7} (the form of status.completedIndexes)."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def indexes_of(text: str | None) -> set[int]:
    """The set of indexes `1,3-5` names (an unparsable list names none)."""
    try:
        return {i for first, last in parse_intervals(text) for i in range(first, last + 1)}
    except ValueError:
        return set()


# --- defaults and validation ------------------------------------------------------------------


def default_spec(spec: Obj) -> None:
    """Kubernetes' defaults of a JobSpec (SetDefaults_Job), in place."""
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    if spec.get("parallelism") is None:
        spec["parallelism"] = 1
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = INT32_MAX if spec.get("backoffLimitPerIndex") is not None else 6
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if spec.get("podReplacementPolicy") is None:
        spec["podReplacementPolicy"] = (
            "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
        )
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
        for cond in rule.get("onPodConditions") or []:
            cond.setdefault("status", "True")
    template_spec = (spec.get("template") or {}).get("spec") or {}
    template_spec.setdefault("dnsPolicy", "ClusterFirst")
    template_spec.setdefault("terminationGracePeriodSeconds", 30)


def generate_selector(obj: Obj) -> None:
    """Kubernetes' `generateSelector`: unless `manualSelector`, the selector is the Job's uid
    and the template carries the labels that match it."""
    meta, spec = obj["metadata"], obj["spec"]
    if spec.get("manualSelector"):
        return
    uid, name = meta["uid"], meta["name"]
    template_meta = spec["template"].setdefault("metadata", {})
    labels = template_meta.setdefault("labels", {})
    labels.setdefault(CONTROLLER_UID, uid)
    labels.setdefault(JOB_NAME, name)
    labels.setdefault(LEGACY_CONTROLLER_UID, uid)
    labels.setdefault(LEGACY_JOB_NAME, name)
    if spec.get("selector") is None:
        spec["selector"] = {"matchLabels": {CONTROLLER_UID: uid}}
    if not meta.get("labels"):  # SetDefaults_Job: the Job's labels are its template's
        meta["labels"] = dict(labels)


def spec_causes(spec: Obj, path: str = "spec") -> list[Cause]:
    """What is wrong with a JobSpec (ValidateJob's checks), field paths under `path`."""
    causes: list[Cause] = []
    for field in ("parallelism", "completions", "backoffLimit", "ttlSecondsAfterFinished"):
        value = spec.get(field)
        if value is not None and value < 0:
            causes.append(
                Cause(
                    f"{path}.{field}", f"Invalid value: {value}: must be greater than or equal to 0"
                )
            )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        causes.append(
            Cause(
                f"{path}.activeDeadlineSeconds",
                f"Invalid value: {deadline}: must be greater than 0",
            )
        )
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    if indexed:
        if completions is None:
            causes.append(
                Cause(f"{path}.completions", "Required value: when completion mode is Indexed")
            )
        elif completions > MAX_INDEXED:
            causes.append(
                Cause(
                    f"{path}.completions",
                    f"Invalid value: {completions}: must be less than or equal to {MAX_INDEXED} "
                    "when completion mode is Indexed",
                )
            )
        parallelism = spec.get("parallelism")
        if parallelism is not None and parallelism > MAX_INDEXED:
            causes.append(
                Cause(
                    f"{path}.parallelism",
                    f"Invalid value: {parallelism}: must be less than or equal to {MAX_INDEXED} "
                    "when completion mode is Indexed",
                )
            )
    per_index = spec.get("backoffLimitPerIndex")
    max_failed = spec.get("maxFailedIndexes")
    if per_index is not None:
        if per_index < 0:
            causes.append(
                Cause(
                    f"{path}.backoffLimitPerIndex",
                    f"Invalid value: {per_index}: must be greater than or equal to 0",
                )
            )
        if not indexed:
            causes.append(
                Cause(
                    f"{path}.backoffLimitPerIndex",
                    "Invalid value: requires indexed completion mode",
                )
            )
    if max_failed is not None:
        if per_index is None:
            causes.append(
                Cause(
                    f"{path}.maxFailedIndexes",
                    "Required value: backoffLimitPerIndex is required when maxFailedIndexes is set",
                )
            )
        elif max_failed < 0 or max_failed > MAX_INDEXED:
            causes.append(
                Cause(
                    f"{path}.maxFailedIndexes",
                    f"Invalid value: {max_failed}: must be between 0 and {MAX_INDEXED}",
                )
            )
        elif completions is not None and max_failed > completions:
            causes.append(
                Cause(
                    f"{path}.maxFailedIndexes",
                    f"Invalid value: {max_failed}: must be less than or equal to completions",
                )
            )
    template = spec.get("template") or {}
    template_spec = template.get("spec") or {}
    restart = template_spec.get("restartPolicy")
    if restart is None:
        causes.append(
            Cause(
                f"{path}.template.spec.restartPolicy",
                'Required value: valid values: "OnFailure", "Never"',
            )
        )
    elif restart not in ("OnFailure", "Never"):
        causes.append(
            Cause(
                f"{path}.template.spec.restartPolicy",
                f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"',
                "FieldValueNotSupported",
            )
        )
    causes += _selector_causes(spec.get("selector"), f"{path}.selector")
    selector = selector_of(spec.get("selector"))
    labels = (template.get("metadata") or {}).get("labels") or {}
    if selector is not None and (selector.empty or not selector.matches(labels)):
        causes.append(
            Cause(
                f"{path}.template.metadata.labels",
                f"Invalid value: {labels}: `selector` does not match template `labels`",
            )
        )
    causes += _pod_failure_causes(spec, f"{path}.podFailurePolicy")
    causes += _success_causes(spec, f"{path}.successPolicy")
    replacement = spec.get("podReplacementPolicy")
    if spec.get("podFailurePolicy") and replacement not in (None, "Failed"):
        causes.append(
            Cause(
                f"{path}.podReplacementPolicy",
                f'Unsupported value: "{replacement}": supported values: "Failed" when '
                "podFailurePolicy is specified",
                "FieldValueNotSupported",
            )
        )
    return causes


def _pod_failure_causes(spec: Obj, path: str) -> list[Cause]:
    policy = spec.get("podFailurePolicy")
    if policy is None:
        return []
    causes: list[Cause] = []
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if restart not in (None, "Never"):
        causes.append(
            Cause(
                "spec.template.spec.restartPolicy",
                f'Invalid value: "{restart}": only "Never" is supported when podFailurePolicy is '
                "specified",
            )
        )
    rules = policy.get("rules") or []
    if len(rules) > MAX_POD_FAILURE_RULES:
        causes.append(
            Cause(
                f"{path}.rules",
                f"Too many: {len(rules)}: must have at most {MAX_POD_FAILURE_RULES} items",
            )
        )
    containers = {
        c["name"]
        for key in ("containers", "initContainers")
        for c in ((spec.get("template") or {}).get("spec") or {}).get(key) or []
    }
    for i, rule in enumerate(rules):
        at = f"{path}.rules[{i}]"
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if rule["action"] == "FailIndex" and spec.get("backoffLimitPerIndex") is None:
            causes.append(
                Cause(
                    f"{at}.action",
                    'Invalid value: "FailIndex": valid values when backoffLimitPerIndex is not '
                    'set: "Count", "FailJob", "Ignore"',
                )
            )
        if (on_codes is None) == (on_conditions is None):
            causes.append(
                Cause(
                    at,
                    "Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
                )
            )
        if on_codes is not None:
            values = on_codes.get("values") or []
            name = on_codes.get("containerName")
            if name is not None and name not in containers:
                causes.append(
                    Cause(
                        f"{at}.onExitCodes.containerName",
                        f'Invalid value: "{name}": must be one of the container or initContainer '
                        "names in the pod template",
                    )
                )
            if not values:
                causes.append(
                    Cause(
                        f"{at}.onExitCodes.values", "Invalid value: at least one value is required"
                    )
                )
            if len(values) > MAX_EXIT_CODES:
                causes.append(
                    Cause(
                        f"{at}.onExitCodes.values",
                        f"Too many: {len(values)}: must have at most {MAX_EXIT_CODES} items",
                    )
                )
            for j, value in enumerate(values):
                if on_codes["operator"] == "In" and value == 0:
                    causes.append(
                        Cause(
                            f"{at}.onExitCodes.values[{j}]",
                            "Invalid value: 0: must not be 0 for the In operator",
                        )
                    )
                if j and value == values[j - 1]:
                    causes.append(
                        Cause(f"{at}.onExitCodes.values[{j}]", f"Duplicate value: {value}")
                    )
                elif j and value < values[j - 1]:
                    causes.append(
                        Cause(
                            f"{at}.onExitCodes.values[{j}]",
                            f"Invalid value: {value}: must be ordered",
                        )
                    )
        for j, cond in enumerate(on_conditions or []):
            if not cond.get("type"):
                causes.append(Cause(f"{at}.onPodConditions[{j}].type", "Required value"))
        if on_conditions is not None and len(on_conditions) > MAX_POD_FAILURE_RULES:
            causes.append(
                Cause(
                    f"{at}.onPodConditions",
                    f"Too many: {len(on_conditions)}: must have at most "
                    f"{MAX_POD_FAILURE_RULES} items",
                )
            )
    return causes


def _success_causes(spec: Obj, path: str) -> list[Cause]:
    policy = spec.get("successPolicy")
    if policy is None:
        return []
    causes: list[Cause] = []
    if spec.get("completionMode") != "Indexed":
        causes.append(Cause(path, "Invalid value: requires indexed completion mode"))
    rules = policy.get("rules") or []
    if not rules or len(rules) > MAX_SUCCESS_RULES:
        causes.append(
            Cause(
                f"{path}.rules",
                f"Invalid value: {len(rules)}: must have at least 1 and at most "
                f"{MAX_SUCCESS_RULES} rules",
            )
        )
    completions = spec.get("completions")
    for i, rule in enumerate(rules):
        at = f"{path}.rules[{i}]"
        text, count = rule.get("succeededIndexes"), rule.get("succeededCount")
        if text is None and count is None:
            causes.append(
                Cause(
                    at,
                    "Required value: at least one of succeededCount or succeededIndexes must be specified",
                )
            )
        size = None
        if text is not None:
            if len(text) > MAX_INTERVALS_CHARS:
                causes.append(
                    Cause(
                        f"{at}.succeededIndexes",
                        f"Too long: must have at most {MAX_INTERVALS_CHARS} bytes",
                    )
                )
                continue
            try:
                intervals = parse_intervals(text, completions)
                size = sum(last - first + 1 for first, last in intervals)
            except ValueError as exc:
                causes.append(
                    Cause(
                        f"{at}.succeededIndexes", f'Invalid value: "{text}": error parsing: {exc}'
                    )
                )
        if count is not None:
            if count < 0:
                causes.append(
                    Cause(
                        f"{at}.succeededCount",
                        f"Invalid value: {count}: must be greater than or equal to 0",
                    )
                )
            elif completions is not None and count > completions:
                causes.append(
                    Cause(
                        f"{at}.succeededCount",
                        f"Invalid value: {count}: must be less than or equal to {completions} "
                        "(the number of specified completions)",
                    )
                )
            elif size is not None and count > size:
                causes.append(
                    Cause(
                        f"{at}.succeededCount",
                        f"Invalid value: {count}: must be less than or equal to {size} (the "
                        "number of indexes in the specified succeededIndexes field)",
                    )
                )
    return causes


def generated_causes(obj: Obj) -> list[Cause]:
    """Unless `manualSelector`, the selector and the template's labels are the generated ones
    (ValidateGeneratedSelector)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if spec.get("manualSelector"):
        return []
    uid = meta.get("uid")
    causes = []
    if spec.get("selector") != {"matchLabels": {CONTROLLER_UID: uid}}:
        causes.append(
            Cause(
                "spec.selector",
                f"Invalid value: {spec.get('selector')}: `selector` not auto-generated",
            )
        )
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(CONTROLLER_UID) != uid:
        causes.append(
            Cause(
                f"spec.template.metadata.labels[{CONTROLLER_UID}]",
                f"Invalid value: \"{labels.get(CONTROLLER_UID)}\": must be '{uid}'",
            )
        )
    if labels.get(JOB_NAME) != meta.get("name"):
        causes.append(
            Cause(
                f"spec.template.metadata.labels[{JOB_NAME}]",
                f"Invalid value: \"{labels.get(JOB_NAME)}\": must be '{meta.get('name')}'",
            )
        )
    return causes


IMMUTABLE_SPEC = (
    "selector",
    "manualSelector",
    "completionMode",
    "podFailurePolicy",
    "successPolicy",
    "backoffLimitPerIndex",
    "podReplacementPolicy",
    "managedBy",
)
# what a suspended Job that never started may change in its template (mutable scheduling
# directives, as Kubernetes)
SCHEDULING_DIRECTIVES = ("nodeSelector", "affinity", "tolerations", "schedulingGates")


def update_causes(spec: Obj, old_spec: Obj, old_status: Obj | None) -> list[Cause]:
    """What a Job's update may not change (ValidateJobSpecUpdate)."""
    causes = [
        Cause(f"spec.{field}", "Invalid value: field is immutable", "FieldValueInvalid")
        for field in IMMUTABLE_SPEC
        if spec.get(field) != old_spec.get(field)
    ]
    completions, old_completions = spec.get("completions"), old_spec.get("completions")
    if completions != old_completions:
        elastic = (
            spec.get("completionMode") == "Indexed"
            and spec.get("parallelism") == completions
            and old_spec.get("parallelism") == old_completions
            and spec.get("backoffLimitPerIndex") is None
        )
        if not elastic:
            causes.append(
                Cause(
                    "spec.completions",
                    f"Invalid value: {completions}: field is immutable",
                    "FieldValueInvalid",
                )
            )
    template, old_template = spec.get("template") or {}, old_spec.get("template") or {}
    if template != old_template:
        never_started = spec.get("suspend") and not (old_status or {}).get("startTime")
        if not never_started or _without_directives(template) != _without_directives(old_template):
            causes.append(
                Cause(
                    "spec.template",
                    f"Invalid value: {_short(template)}: field is immutable",
                    "FieldValueInvalid",
                )
            )
    return causes


def _without_directives(template: Obj) -> Obj:
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in SCHEDULING_DIRECTIVES}
    meta = {
        k: v
        for k, v in (template.get("metadata") or {}).items()
        if k not in ("labels", "annotations")
    }
    return {"metadata": meta, "spec": spec}


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- status -------------------------------------------------------------------------------


def condition(obj: Obj, kind: str) -> Obj | None:
    """The Job's condition of type `kind` when its status is True."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def finished(obj: Obj) -> str | None:
    """ "Complete" or "Failed" when the Job has finished, else None."""
    for kind in ("Complete", "Failed"):
        if condition(obj, kind) is not None:
            return kind
    return None


def finished_at(obj: Obj) -> datetime | None:
    """When a finished Job finished (its Complete or Failed condition's transition)."""
    kind = finished(obj)
    if kind is None:
        return None
    cond = condition(obj, kind) or {}
    at = cond.get("lastTransitionTime") or (obj.get("status") or {}).get("completionTime")
    return parse_timestamp(at) if at else None


def _duration(start: str | None, end: str | None, now: datetime) -> str:
    if not start:
        return ""
    begin = parse_timestamp(start)
    stop = parse_timestamp(end) if end else now
    seconds = max(0, int((stop - begin).total_seconds()))
    return _human(seconds)


def _human(seconds: int) -> str:
    """Kubernetes' HumanDuration, to the precision `kubectl get` prints."""
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        rest = hours % 24
        return f"{days}d{rest}h" if rest else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def job_status_text(obj: Obj) -> str:
    """The STATUS column of `kubectl get jobs` (Kubernetes 1.31's printer)."""
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    if finished(obj) == "Complete":
        return "Complete"
    if finished(obj) == "Failed":
        return "Failed"
    if status.get("conditions") and any(
        c.get("type") == "FailureTarget" and c.get("status") == "True" for c in status["conditions"]
    ):
        return "FailureTarget"
    if spec.get("suspend") or condition(obj, "Suspended") is not None:
        return "Suspended"
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return "Running"


def completions_text(obj: Obj) -> str:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    succeeded = status.get("succeeded") or 0
    completions = spec.get("completions")
    if completions is not None:
        return f"{succeeded}/{completions}"
    parallelism = spec.get("parallelism") or 0
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def _containers(obj: Obj) -> tuple[str, str]:
    containers = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    return (
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
    )


class JobStrategy(Strategy):
    kind = "Job"
    resource = "jobs"
    singular = "job"
    group = "batch"
    model = Job
    list_model = JobList
    categories = ("all",)
    has_status = True
    generation = True
    workload = True
    has_dependents = True  # Foreground and Orphan deletions wait for the collector
    summary = "pods run to completion (completions, parallelism, Indexed, backoff)"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the Job.", 0),
        ("Status", "string", "Status of the Job.", 0),
        ("Completions", "string", "The desired number of successfully finished pods.", 0),
        ("Duration", "string", "Time the Job took to complete.", 0),
        ("Age", "string", "Time since creation.", 0),
        ("Containers", "string", "Names of each container in the template.", 1),
        ("Images", "string", "Images of each container in the template.", 1),
        ("Selector", "string", "The Job's label selector.", 1),
    ]

    def row(self, obj: Obj) -> list[Any]:
        status = obj.get("status") or {}
        names, images = _containers(obj)
        return [
            obj["metadata"]["name"],
            job_status_text(obj),
            completions_text(obj),
            _duration(status.get("startTime"), status.get("completionTime"), now()),
            age(obj["metadata"].get("creationTimestamp")),
            names,
            images,
            selector_text((obj.get("spec") or {}).get("selector")),
        ]

    def prepare_create(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        default_spec(spec)
        if isinstance(spec.get("template"), dict):
            generate_selector(obj)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        default_spec(obj.setdefault("spec", {}))
        labels = (obj.get("metadata") or {}).get("labels")
        if not labels and (old.get("metadata") or {}).get("labels"):
            obj["metadata"]["labels"] = old["metadata"]["labels"]

    def validate(self, obj: Obj) -> list[Cause]:
        return spec_causes(obj.get("spec") or {}) + generated_causes(obj)

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        return update_causes(obj.get("spec") or {}, old.get("spec") or {}, old.get("status"))
