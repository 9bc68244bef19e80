"""apps/v1 ReplicaSet and Deployment: the workloads of long-running pods.

The registry keeps the objects (spec, status through its subresource, `scale` for `kubectl
scale`); the controller manager (app/controllers/apps.py) makes them true: a ReplicaSet keeps
`replicas` pods from its template, a Deployment keeps one ReplicaSet per template and rolls
from one to the next.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, WithJsonSchema

from app.errors import Cause
from app.kube.meta import Int64, KubeModel, ListMeta, ObjectMeta
from app.kube.tables import Column, age
from app.pods.schemas import PodSpec
from app.registry.strategy import Obj, Strategy

# A number or a percentage, as Kubernetes' intstr.IntOrString (and its OpenAPI schema).
IntOrString = Annotated[
    int | str,
    WithJsonSchema(
        {"type": "string", "format": "int-or-string", "x-kubernetes-int-or-string": True}
    ),
]


class LabelSelectorRequirement(KubeModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(KubeModel):
    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None


class PodTemplateSpec(KubeModel):
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None


class ReplicaSetSpec(KubeModel):
    replicas: int | None = Field(default=None, ge=0, le=2**31 - 1)
    min_ready_seconds: int | None = Field(default=None, ge=0, le=2**31 - 1)
    selector: LabelSelector | None = None
    template: PodTemplateSpec | None = None


class WorkloadCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    last_update_time: str | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class ReplicaSetStatus(KubeModel):
    replicas: int = 0
    fully_labeled_replicas: int | None = None
    ready_replicas: int | None = None
    available_replicas: int | None = None
    terminating_replicas: int | None = None
    observed_generation: Int64 | None = None
    conditions: list[WorkloadCondition] | None = None


class ReplicaSet(KubeModel):
    """Keeps `replicas` pods of its template running."""

    api_version: Literal["apps/v1"] | None = "apps/v1"
    kind: Literal["ReplicaSet"] | None = "ReplicaSet"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ReplicaSetSpec | None = None
    status: ReplicaSetStatus | None = None


class ReplicaSetList(KubeModel):
    api_version: Literal["apps/v1"] = "apps/v1"
    kind: Literal["ReplicaSetList"] = "ReplicaSetList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[ReplicaSet]


class RollingUpdateDeployment(KubeModel):
    max_unavailable: IntOrString | None = None
    max_surge: IntOrString | None = None


class DeploymentStrategy(KubeModel):
    type: Literal["Recreate", "RollingUpdate"] | None = None
    rolling_update: RollingUpdateDeployment | None = None


class DeploymentSpec(KubeModel):
    replicas: int | None = Field(default=None, ge=0, le=2**31 - 1)
    selector: LabelSelector | None = None
    template: PodTemplateSpec | None = None
    strategy: DeploymentStrategy | None = None
    min_ready_seconds: int | None = Field(default=None, ge=0, le=2**31 - 1)
    revision_history_limit: int | None = Field(default=None, ge=0, le=2**31 - 1)
    paused: bool | None = None
    progress_deadline_seconds: int | None = Field(default=None, ge=1, le=2**31 - 1)


class DeploymentStatus(KubeModel):
    observed_generation: Int64 | None = None
    replicas: int | None = None
    updated_replicas: int | None = None
    ready_replicas: int | None = None
    available_replicas: int | None = None
    unavailable_replicas: int | None = None
    terminating_replicas: int | None = None
    conditions: list[WorkloadCondition] | None = None
    collision_count: int | None = None


class Deployment(KubeModel):
    """Keeps a ReplicaSet per pod template and rolls from one to the next."""

    api_version: Literal["apps/v1"] | None = "apps/v1"
    kind: Literal["Deployment"] | None = "Deployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: DeploymentSpec | None = None
    status: DeploymentStatus | None = None


class DeploymentList(KubeModel):
    api_version: Literal["apps/v1"] = "apps/v1"
    kind: Literal["DeploymentList"] = "DeploymentList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Deployment]


# --- what both share ---------------------------------------------------------------------------


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether `labels` match a LabelSelector (an empty or missing selector matches nothing,
    as for a workload's pods)."""
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req["key"], req["operator"], req.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def selector_text(selector: Obj | None) -> str:
    """A LabelSelector as a label selector string (`app=web,tier in (a,b)`)."""
    parts = [f"{k}={v}" for k, v in sorted(((selector or {}).get("matchLabels") or {}).items())]
    for req in (selector or {}).get("matchExpressions") or []:
        key, op, values = req["key"], req["operator"], sorted(req.get("values") or [])
        if op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(f"{key} {'in' if op == 'In' else 'notin'} ({','.join(values)})")
    return ",".join(parts)


def _workload_causes(obj: Obj, *, template_required: bool) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    selector = spec.get("selector")
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(
            Cause("spec.selector", "Required value: a selector of the pods", "FieldValueRequired")
        )
    for i, req in enumerate((selector or {}).get("matchExpressions") or []):
        has_values = bool(req.get("values"))
        if has_values != (req["operator"] in ("In", "NotIn")):
            causes.append(
                Cause(
                    f"spec.selector.matchExpressions[{i}].values",
                    "Invalid value: In and NotIn need values; Exists and DoesNotExist take none",
                )
            )
    template = spec.get("template")
    if template is None:
        if template_required:
            causes.append(
                Cause("spec.template", "Required value: a pod template", "FieldValueRequired")
            )
        return causes
    labels = (template.get("metadata") or {}).get("labels") or {}
    if selector and not causes and not selector_matches(selector, labels):
        causes.append(
            Cause(
                "spec.template.metadata.labels",
                f"Invalid value: {labels}: `selector` does not match template `labels`",
            )
        )
    pod_spec = template.get("spec")
    if not pod_spec or not pod_spec.get("containers"):
        causes.append(
            Cause(
                "spec.template.spec.containers",
                "Required value: at least one container",
                "FieldValueRequired",
            )
        )
    elif pod_spec.get("restartPolicy") not in (None, "Always"):
        causes.append(
            Cause(
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{pod_spec["restartPolicy"]}": supported values: "Always"',
                "FieldValueNotSupported",
            )
        )
    return causes


def _selector_kept(obj: Obj, old: Obj) -> list[Cause]:
    new_selector = (obj.get("spec") or {}).get("selector")
    if new_selector != (old.get("spec") or {}).get("selector"):
        return [
            Cause(
                "spec.selector",
                f"Invalid value: {new_selector}: field is immutable",
                "FieldValueInvalid",
            )
        ]
    return []


def _containers(obj: Obj) -> list[Obj]:
    return list(
        ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    )


def _wide(obj: Obj) -> list[Any]:
    containers = _containers(obj)
    return [
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image") or "" for c in containers),
        selector_text((obj.get("spec") or {}).get("selector")),
    ]


WIDE_COLUMNS: list[Column] = [
    ("Containers", "string", "Names of each container in the template.", 1),
    ("Images", "string", "Images referenced by each container in the template.", 1),
    ("Selector", "string", "Label selector for pods.", 1),
]


class ReplicaSetStrategy(Strategy):
    kind = "ReplicaSet"
    resource = "replicasets"
    singular = "replicaset"
    group = "apps"
    model = ReplicaSet
    list_model = ReplicaSetList
    short_names = ("rs",)
    categories = ("all",)
    has_status = True
    generation = True
    workload = True
    scale_path = ("spec", "replicas")
    summary = "keeps replicas pods of its template"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the ReplicaSet.", 0),
        ("Desired", "integer", "Number of desired pods.", 0),
        ("Current", "integer", "Number of created pods.", 0),
        ("Ready", "integer", "Number of ready pods.", 0),
        ("Age", "string", "Time since creation.", 0),
        *WIDE_COLUMNS,
    ]

    def row(self, obj: Obj) -> list[Any]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        return [
            obj["metadata"]["name"],
            spec.get("replicas", 1),
            status.get("replicas", 0),
            status.get("readyReplicas", 0),
            age(obj["metadata"].get("creationTimestamp")),
            *_wide(obj),
        ]

    def scale_selector(self, obj: Obj) -> str:
        return selector_text((obj.get("spec") or {}).get("selector"))

    def prepare_create(self, obj: Obj) -> None:
        obj.setdefault("spec", {}).setdefault("replicas", 1)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        obj.setdefault("spec", {}).setdefault("replicas", 1)

    def validate(self, obj: Obj) -> list[Cause]:
        return _workload_causes(obj, template_required=True)

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        return _selector_kept(obj, old)


DEFAULT_SURGE = "25%"


class DeploymentStrategyKind(Strategy):
    kind = "Deployment"
    resource = "deployments"
    singular = "deployment"
    group = "apps"
    model = Deployment
    list_model = DeploymentList
    short_names = ("deploy",)
    categories = ("all",)
    has_status = True
    generation = True
    workload = True
    scale_path = ("spec", "replicas")
    summary = "rolls out pods of a template through ReplicaSets"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the Deployment.", 0),
        ("Ready", "string", "Number of the ready replicas out of the desired.", 0),
        ("Up-to-date", "integer", "Number of replicas of the current template.", 0),
        ("Available", "integer", "Number of available replicas (ready for minReadySeconds).", 0),
        ("Age", "string", "Time since creation.", 0),
        *WIDE_COLUMNS,
    ]

    def row(self, obj: Obj) -> list[Any]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        return [
            obj["metadata"]["name"],
            f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
            status.get("updatedReplicas", 0),
            status.get("availableReplicas", 0),
            age(obj["metadata"].get("creationTimestamp")),
            *_wide(obj),
        ]

    def scale_selector(self, obj: Obj) -> str:
        return selector_text((obj.get("spec") or {}).get("selector"))

    def _defaults(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxSurge", DEFAULT_SURGE)
            rolling.setdefault("maxUnavailable", DEFAULT_SURGE)

    def prepare_create(self, obj: Obj) -> None:
        self._defaults(obj)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        self._defaults(obj)

    def validate(self, obj: Obj) -> list[Cause]:
        causes = _workload_causes(obj, template_required=True)
        strategy = (obj.get("spec") or {}).get("strategy") or {}
        rolling = strategy.get("rollingUpdate")
        if strategy.get("type") == "Recreate" and rolling:
            causes.append(
                Cause(
                    "spec.strategy.rollingUpdate",
                    "Forbidden: may not be specified when strategy `type` is 'Recreate'",
                )
            )
        if rolling:
            for field in ("maxSurge", "maxUnavailable"):
                value = rolling.get(field)
                if not _valid_int_or_percent(value):
                    causes.append(
                        Cause(
                            f"spec.strategy.rollingUpdate.{field}",
                            f'Invalid value: "{value}": a non-negative integer or a percentage '
                            "(e.g. '25%') of at most 100%",
                        )
                    )
            if _is_zero(rolling.get("maxSurge")) and _is_zero(rolling.get("maxUnavailable")):
                causes.append(
                    Cause(
                        "spec.strategy.rollingUpdate.maxUnavailable",
                        "Invalid value: 0: may not be 0 when `maxSurge` is 0",
                    )
                )
        return causes

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        return _selector_kept(obj, old)


def _valid_int_or_percent(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return int(value[:-1]) <= 100
    return False


def _is_zero(value: Any) -> bool:
    return value in (0, "0%")
