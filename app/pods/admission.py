"""Pod admission: validate a submitted Pod and work out what Tessera sells it.

Rules (the sold specs live in `billing/spec_table.yaml`):
- The pod's demand for each resource is the larger of its containers' summed requests and summed
  limits (a container's request defaults to its limit), and at least the largest init container.
- CPU/memory demand is rounded UP to the nearest sold spec; the spec is written to the annotation
  `tessera.io/pod-use-spec` and the pod is billed for it. A pod with no CPU/memory at all gets the
  default spec (`2-4Gi`).
- The pod's class is the label `tessera.io/compute-class` when its user set it, else derived from
  its resources; either way it is written to the annotation of that name (never to the labels).
- GPUs: `nvidia.com/gpu` asks for whole GPUs; `tessera.io/gpu-memory` + `tessera.io/gpu-core` ask
  for a slice of ONE GPU. Not both. A pod asking for any GPU is of class `gpu`.

Every problem found is reported at once, each with the field it concerns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app.constants import (
    ANNOTATION_COMPUTE_CLASS,
    ANNOTATION_POD_USE_SPEC,
    COMPUTE_CLASSES,
    COMPUTE_QOS,
    CPU,
    EPHEMERAL_STORAGE,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    KNOWN_RESOURCES,
    LABEL_COMPUTE_CLASS,
    LABEL_COMPUTE_QOS,
    LABEL_COSCHEDULING_POD_GROUP,
    LABEL_GPU_MODEL,
    LABEL_POD_GROUP,
    MEMORY,
    SAFE_CAPABILITIES,
)
from app.errors import Cause
from app.kube.meta import (
    validate_annotations,
    validate_generate_name,
    validate_labels,
    validate_name,
)
from app.kube.quantity import QuantityError, format_mib, parse_quantity, to_mib, to_milli
from app.pods.schemas import Container, Pod
from billing.specs import ComputeSpec, SpecCatalog

MAX_PRIORITY = 1_000_000


@dataclass(frozen=True)
class GPUModelInfo:
    name: str
    vram_mib: int
    sm_count: int
    max_per_node: int


@dataclass(frozen=True)
class PoolCatalog:
    """What admission needs to know about the pool: the GPU models it holds."""

    models: dict[str, GPUModelInfo] = field(default_factory=dict)

    @property
    def max_gpus_per_node(self) -> int:
        return max((m.max_per_node for m in self.models.values()), default=0)

    @property
    def largest_vram_mib(self) -> int:
        return max((m.vram_mib for m in self.models.values()), default=0)


@dataclass(frozen=True)
class Demand:
    """What the pod gets (and is billed for)."""

    spec: ComputeSpec
    requested_cpu_milli: int
    requested_memory_mib: int
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    gpu_core_pct: int = 0
    gpu_model: str | None = None
    compute_class: str = "general-purpose"
    qos: str = "default"
    priority: int = 0
    pod_group: str | None = None
    pod_group_label: str = LABEL_POD_GROUP  # the label that named it (which group's PodGroup)

    @property
    def rounded(self) -> bool:
        return (self.requested_cpu_milli, self.requested_memory_mib) != (
            self.spec.cpu_milli,
            self.spec.memory_mib,
        )

    @property
    def is_slice(self) -> bool:
        return self.gpu_memory_mib > 0


@dataclass(frozen=True)
class Admitted:
    demand: Demand
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    notes: list[str]


class AdmissionError(Exception):
    def __init__(self, causes: list[Cause]) -> None:
        super().__init__("; ".join(f"{c.field}: {c.message}" for c in causes))
        self.causes = causes


def admit(
    pod: Pod,
    *,
    specs: SpecCatalog,
    pool: PoolCatalog,
    default_spec: ComputeSpec,
    name_required: bool = True,
) -> Admitted:
    """Validate `pod`; return what to store, or raise AdmissionError with every bad field."""
    causes: list[Cause] = []
    meta = pod.metadata
    if name_required:
        if meta.name:
            causes += validate_name(meta.name, "metadata.name")
        elif meta.generate_name:
            causes += validate_generate_name(meta.generate_name, "metadata.generateName")
        else:
            causes.append(
                Cause(
                    "metadata.name",
                    "Required value: name or generateName is required",
                    "FieldValueRequired",
                )
            )
    labels = dict(meta.labels or {})
    annotations = dict(meta.annotations or {})
    causes += validate_labels(labels, "metadata.labels")
    causes += validate_annotations(annotations, "metadata.annotations")
    causes += _forbidden_fields(pod)

    totals, sum_causes = _sum_resources(pod)
    causes += sum_causes

    cpu_milli = to_milli(totals.get(CPU, Decimal(0)))
    memory_mib = to_mib(totals.get(MEMORY, Decimal(0)))
    gpu_count, gpu_memory_mib, gpu_core_pct = (
        _integral(
            totals.get(GPU, Decimal(0)), f"spec.containers[*].resources.limits.{GPU}", causes
        ),
        to_mib(totals.get(GPU_MEMORY, Decimal(0))),
        _integral(
            totals.get(GPU_CORE, Decimal(0)),
            f"spec.containers[*].resources.limits.{GPU_CORE}",
            causes,
        ),
    )
    wants_gpu = gpu_count > 0 or gpu_memory_mib > 0 or gpu_core_pct > 0

    compute_class = labels.get(LABEL_COMPUTE_CLASS)
    qos = labels.get(LABEL_COMPUTE_QOS, "default")
    model = labels.get(LABEL_GPU_MODEL)
    if compute_class is not None and compute_class not in COMPUTE_CLASSES:
        causes.append(
            Cause(
                f"metadata.labels.{LABEL_COMPUTE_CLASS}",
                f'Unsupported value: "{compute_class}": supported values: {_quoted(COMPUTE_CLASSES)}',
                "FieldValueNotSupported",
            )
        )
    if qos not in COMPUTE_QOS:
        causes.append(
            Cause(
                f"metadata.labels.{LABEL_COMPUTE_QOS}",
                f'Unsupported value: "{qos}": supported values: {_quoted(COMPUTE_QOS)}',
                "FieldValueNotSupported",
            )
        )
    if wants_gpu:
        if compute_class not in (None, "gpu"):
            causes.append(
                Cause(
                    f"metadata.labels.{LABEL_COMPUTE_CLASS}",
                    f'Invalid value: "{compute_class}": a pod that asks for GPU resources is of '
                    'class "gpu"; remove the label or set it to "gpu"',
                )
            )
        compute_class = "gpu"
    elif compute_class == "gpu":
        causes.append(
            Cause(
                f"metadata.labels.{LABEL_COMPUTE_CLASS}",
                'Invalid value: "gpu": class "gpu" is for pods that ask for nvidia.com/gpu or a '
                "GPU slice (tessera.io/gpu-memory + tessera.io/gpu-core)",
            )
        )
    compute_class = compute_class or "general-purpose"

    model_info = None
    if model is not None:
        if not wants_gpu:
            causes.append(
                Cause(
                    f"metadata.labels.{LABEL_GPU_MODEL}",
                    f'Invalid value: "{model}": a GPU model applies only to pods that ask for GPUs',
                )
            )
        else:
            model_info = pool.models.get(model)
            if model_info is None:
                known = _quoted(sorted(pool.models)) if pool.models else "none yet"
                causes.append(
                    Cause(
                        f"metadata.labels.{LABEL_GPU_MODEL}",
                        f'Unsupported value: "{model}": the pool holds no GPU of that model '
                        f"(models in the pool: {known})",
                        "FieldValueNotSupported",
                    )
                )

    gpu_memory_mib, gpu_core_pct = _check_gpu(
        gpu_count, gpu_memory_mib, gpu_core_pct, model_info, pool, causes
    )

    requested = (cpu_milli, memory_mib)
    spec: ComputeSpec | None
    if cpu_milli == 0 and memory_mib == 0:
        spec = default_spec
        requested = (default_spec.cpu_milli, default_spec.memory_mib)
    else:
        spec = specs.round_up(cpu_milli, memory_mib)
        if spec is None:
            causes.append(_no_spec_cause(cpu_milli, memory_mib, specs))

    priority = pod.spec.priority or 0
    if not 0 <= priority <= MAX_PRIORITY:
        causes.append(
            Cause(
                "spec.priority", f"Invalid value: {priority}: must be between 0 and {MAX_PRIORITY}"
            )
        )

    if LABEL_POD_GROUP in labels and LABEL_COSCHEDULING_POD_GROUP in labels:
        causes.append(
            Cause(
                f"metadata.labels.{LABEL_COSCHEDULING_POD_GROUP}",
                f"Invalid value: a pod belongs to one gang, but it has both {LABEL_POD_GROUP} "
                f"(a tessera.io/v1 PodGroup) and {LABEL_COSCHEDULING_POD_GROUP} (a "
                "scheduling.x-k8s.io/v1alpha1 PodGroup): keep the label of the one it joins",
            )
        )

    if causes or spec is None:
        raise AdmissionError(causes)

    annotations[ANNOTATION_COMPUTE_CLASS] = compute_class
    annotations[ANNOTATION_POD_USE_SPEC] = spec.name
    demand = Demand(
        spec=spec,
        requested_cpu_milli=requested[0],
        requested_memory_mib=requested[1],
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib,
        gpu_core_pct=gpu_core_pct,
        gpu_model=model,
        compute_class=compute_class,
        qos=qos,
        priority=priority,
        pod_group=labels.get(LABEL_POD_GROUP) or labels.get(LABEL_COSCHEDULING_POD_GROUP),
        pod_group_label=(
            LABEL_COSCHEDULING_POD_GROUP
            if LABEL_COSCHEDULING_POD_GROUP in labels
            else LABEL_POD_GROUP
        ),
    )
    notes = []
    if demand.rounded:
        notes.append(
            f"requested {_cores(requested[0])} vCPU / {format_mib(requested[1])} memory; "
            f"rounded up to the sold spec {spec.name} ({_cores(spec.cpu_milli)} vCPU / "
            f"{format_mib(spec.memory_mib)}), which is what the pod gets and is billed for"
        )
    return Admitted(
        demand=demand,
        labels=labels,
        annotations=annotations,
        spec=stored_spec(pod),
        notes=notes,
    )


@dataclass(frozen=True)
class ResizedDemand:
    """What a resized pod's containers ask for, and the sold spec that covers it (None when no
    spec does: `why` says so, in the words admission would use)."""

    requested_cpu_milli: int
    requested_memory_mib: int
    spec: ComputeSpec | None
    why: str | None = None


def resized_demand(pod: Pod, *, specs: SpecCatalog, default_spec: ComputeSpec) -> ResizedDemand:
    """The CPU/memory demand of `pod` rounded to a sold spec exactly as at creation (the same
    sums and the same rounding); AdmissionError for a quantity that does not parse or a request
    above its limit."""
    totals, causes = _sum_resources(pod)
    if causes:
        raise AdmissionError(causes)
    cpu_milli = to_milli(totals.get(CPU, Decimal(0)))
    memory_mib = to_mib(totals.get(MEMORY, Decimal(0)))
    if cpu_milli == 0 and memory_mib == 0:
        return ResizedDemand(default_spec.cpu_milli, default_spec.memory_mib, default_spec)
    spec = specs.round_up(cpu_milli, memory_mib)
    if spec is None:
        cause = _no_spec_cause(cpu_milli, memory_mib, specs)
        return ResizedDemand(
            cpu_milli, memory_mib, None, cause.message.removeprefix("Invalid value: ")
        )
    return ResizedDemand(cpu_milli, memory_mib, spec)


def describe_rounding(demand: ResizedDemand) -> str:
    """`4 vCPU / 16Gi (sold spec 4-16Gi)`, saying when the ask was rounded up."""
    assert demand.spec is not None
    spec = demand.spec
    asked = (demand.requested_cpu_milli, demand.requested_memory_mib)
    text = f"{_cores(spec.cpu_milli)} vCPU / {format_mib(spec.memory_mib)} (sold spec {spec.name})"
    if asked != (spec.cpu_milli, spec.memory_mib):
        text += f", rounded up from the {_cores(asked[0])} vCPU / {format_mib(asked[1])} asked"
    return text


def _sum_resources(pod: Pod) -> tuple[dict[str, Decimal], list[Cause]]:
    """Per resource: max(sum of requests, sum of limits) over containers, >= any init container."""
    causes: list[Cause] = []
    requests_sum: dict[str, Decimal] = {}
    limits_sum: dict[str, Decimal] = {}
    for i, container in enumerate(pod.spec.containers):
        requests, limits = _container_resources(container, f"spec.containers[{i}]", causes)
        for name, value in requests.items():
            requests_sum[name] = requests_sum.get(name, Decimal(0)) + value
        for name, value in limits.items():
            limits_sum[name] = limits_sum.get(name, Decimal(0)) + value
    totals = {
        name: max(requests_sum.get(name, Decimal(0)), limits_sum.get(name, Decimal(0)))
        for name in requests_sum.keys() | limits_sum.keys()
    }
    for i, container in enumerate(pod.spec.init_containers or []):
        requests, limits = _container_resources(container, f"spec.initContainers[{i}]", causes)
        for name in requests.keys() | limits.keys():
            value = max(requests.get(name, Decimal(0)), limits.get(name, Decimal(0)))
            totals[name] = max(totals.get(name, Decimal(0)), value)
    if not pod.spec.containers:
        causes.append(
            Cause("spec.containers", "Required value: at least one container", "FieldValueRequired")
        )
    return totals, causes


def _container_resources(
    container: Container, path: str, causes: list[Cause]
) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    causes += validate_name(container.name, f"{path}.name", label=True)
    if not container.image:
        causes.append(
            Cause(f"{path}.image", "Required value: an image is required", "FieldValueRequired")
        )
    resources = container.resources
    requests = _parse_map(
        resources.requests if resources else None, f"{path}.resources.requests", causes
    )
    limits = _parse_map(resources.limits if resources else None, f"{path}.resources.limits", causes)
    for name, limit in limits.items():
        request = requests.get(name)
        if request is None:
            requests[name] = limit  # Kubernetes defaults a request to its limit
        elif name in (GPU, GPU_CORE, GPU_MEMORY) and request != limit:
            causes.append(
                Cause(
                    f"{path}.resources.requests[{name}]",
                    f"Invalid value: {_plain(request)}: must be equal to {name} limit of {_plain(limit)}",
                )
            )
        elif request > limit:
            causes.append(
                Cause(
                    f"{path}.resources.requests",
                    f"Invalid value: {_plain(request)}: must be less than or equal to {name} "
                    f"limit of {_plain(limit)}",
                )
            )
    return requests, limits


def _parse_map(raw: dict[str, Any] | None, path: str, causes: list[Cause]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, value in (raw or {}).items():
        if name not in KNOWN_RESOURCES:
            causes.append(
                Cause(
                    f"{path}[{name}]",
                    f'Unsupported value: "{name}": Tessera sells {_quoted(KNOWN_RESOURCES[:5])}',
                    "FieldValueNotSupported",
                )
            )
            continue
        try:
            quantity = parse_quantity(value)
        except QuantityError as exc:
            causes.append(Cause(f"{path}[{name}]", f"Invalid value: {exc}"))
            continue
        if quantity < 0:
            causes.append(
                Cause(f"{path}[{name}]", f"Invalid value: {value!r}: must be non-negative")
            )
            continue
        if name != EPHEMERAL_STORAGE:
            out[name] = quantity
    return out


def _integral(value: Decimal, field: str, causes: list[Cause]) -> int:
    if value != value.to_integral_value():
        causes.append(Cause(field, f"Invalid value: {_plain(value)}: must be a whole number"))
        return math.ceil(value)
    return int(value)


def _check_gpu(
    gpu_count: int,
    gpu_memory_mib: int,
    gpu_core_pct: int,
    model: GPUModelInfo | None,
    pool: PoolCatalog,
    causes: list[Cause],
) -> tuple[int, int]:
    """Validate GPU asks; fill in a slice's missing dimension in proportion to its model."""
    res = "spec.containers[*].resources.limits"
    if gpu_count and (gpu_memory_mib or gpu_core_pct):
        causes.append(
            Cause(
                f"{res}[{GPU}]",
                f"Invalid value: a pod asks for whole GPUs ({GPU}) or for a slice of one "
                f"({GPU_MEMORY} + {GPU_CORE}), not both",
            )
        )
        return gpu_memory_mib, gpu_core_pct
    if (gpu_count or gpu_memory_mib or gpu_core_pct) and not pool.models:
        # Not the pod's fault: nothing it could ask for would be placed, a slice or whole GPUs.
        causes.append(
            Cause(
                f"{res}[{GPU if gpu_count else GPU_MEMORY}]",
                "Invalid value: the pool holds no GPU yet, so no pod that asks for GPUs can be "
                "placed; ask without GPUs, or ask the operator to add GPU nodes (`tessera "
                "inventory load`, or a node agent on a GPU host)",
            )
        )
        return gpu_memory_mib, gpu_core_pct
    if gpu_count:
        limit = model.max_per_node if model else pool.max_gpus_per_node
        if gpu_count > limit:
            where = f"{model.name} node" if model else "node"
            causes.append(
                Cause(
                    f"{res}[{GPU}]",
                    f"Invalid value: {gpu_count}: no {where} in the pool has that many GPUs "
                    f"(at most {limit}); a pod runs on one node: split the work into a gang",
                )
            )
        return 0, 0
    if not (gpu_memory_mib or gpu_core_pct):
        return 0, 0
    if gpu_core_pct and not 1 <= gpu_core_pct <= 100:
        causes.append(
            Cause(
                f"{res}[{GPU_CORE}]",
                f"Invalid value: {gpu_core_pct}: the SM share of one GPU is a percentage from 1 to 100",
            )
        )
    if not gpu_memory_mib or not gpu_core_pct:
        if model is None:
            missing = GPU_CORE if gpu_memory_mib else GPU_MEMORY
            causes.append(
                Cause(
                    f"{res}[{missing}]",
                    f"Required value: a GPU slice needs both {GPU_MEMORY} (e.g. 20Gi) and "
                    f"{GPU_CORE} (e.g. 25); or label the pod {LABEL_GPU_MODEL} so the missing "
                    "one can be set in proportion to that model",
                    "FieldValueRequired",
                )
            )
            return gpu_memory_mib, gpu_core_pct
        if not gpu_core_pct:
            gpu_core_pct = min(100, math.ceil(100 * gpu_memory_mib / model.vram_mib))
        else:
            gpu_memory_mib = min(model.vram_mib, math.ceil(model.vram_mib * gpu_core_pct / 100))
    largest = model.vram_mib if model else pool.largest_vram_mib
    if gpu_memory_mib > largest:
        where = f"a {model.name}" if model else "the largest GPU in the pool"
        causes.append(
            Cause(
                f"{res}[{GPU_MEMORY}]",
                f"Invalid value: {format_mib(gpu_memory_mib)}: a slice fits on one GPU and "
                f"{where} has {format_mib(largest)}; ask for whole GPUs ({GPU}) instead",
            )
        )
    return gpu_memory_mib, gpu_core_pct


def _no_spec_cause(cpu_milli: int, memory_mib: int, specs: SpecCatalog) -> Cause:
    if cpu_milli > specs.max_cpu_milli:
        return Cause(
            "spec.containers[*].resources.requests.cpu",
            f"Invalid value: {_cores(cpu_milli)} vCPU: the largest spec sold has "
            f"{_cores(specs.max_cpu_milli)} vCPU; split the work across pods",
        )
    return Cause(
        "spec.containers[*].resources.requests.memory",
        f"Invalid value: {format_mib(memory_mib)} with {_cores(cpu_milli)} vCPU: no sold spec has "
        f"that much memory (the most is {format_mib(specs.max_memory_mib)}, at 8 GiB per vCPU)",
    )


def _forbidden_fields(pod: Pod) -> list[Cause]:
    spec = pod.spec
    causes = []
    reasons = {
        "spec.nodeName": (spec.node_name, "Tessera chooses where a pod runs; remove nodeName"),
        "spec.hostNetwork": (
            spec.host_network,
            "pods run isolated; host networking is not offered",
        ),
        "spec.hostPID": (spec.host_pid, "pods run isolated; the host PID namespace is not offered"),
        "spec.hostIPC": (spec.host_ipc, "pods run isolated; the host IPC namespace is not offered"),
    }
    for path, (value, why) in reasons.items():
        if value:
            causes.append(Cause(path, f"Forbidden: {why}", "FieldValueForbidden"))
    causes += _security_context("spec.securityContext", spec.security_context or {})
    for kind, containers in (
        ("containers", spec.containers),
        ("initContainers", spec.init_containers or []),
    ):
        for i, container in enumerate(containers):
            context = container.security_context or {}
            if context.get("privileged"):
                causes.append(
                    Cause(
                        f"spec.{kind}[{i}].securityContext.privileged",
                        "Forbidden: privileged containers are not offered",
                        "FieldValueForbidden",
                    )
                )
            causes += _security_context(f"spec.{kind}[{i}].securityContext", context)
            for j, port in enumerate(container.ports or []):
                if port.host_port:
                    causes.append(
                        Cause(
                            f"spec.{kind}[{i}].ports[{j}].hostPort",
                            "Forbidden: host ports are not offered",
                            "FieldValueForbidden",
                        )
                    )
    names = [c.name for c in spec.containers] + [c.name for c in spec.init_containers or []]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            causes.append(
                Cause(
                    f"spec.containers[{i}].name",
                    f'Duplicate value: "{name}"',
                    "FieldValueDuplicate",
                )
            )
        seen.add(name)
    return causes


def _security_context(path: str, context: dict[str, Any]) -> list[Cause]:
    """What a securityContext may not ask for: a capability outside the safe set, privilege
    escalation, a seccomp or AppArmor profile other than the runtime's default, an unmasked
    /proc, sysctls. (Pods run with no-new-privileges and the engine's default seccomp profile.)"""
    causes = []

    def forbid(field: str, why: str) -> None:
        causes.append(Cause(f"{path}.{field}", f"Forbidden: {why}", "FieldValueForbidden"))

    capabilities = context.get("capabilities") or {}
    for j, capability in enumerate(capabilities.get("add") or []):
        name = str(capability).upper().removeprefix("CAP_")
        if name not in SAFE_CAPABILITIES:
            forbid(
                f"capabilities.add[{j}]",
                f'capability "{capability}" is not offered; a container may add only '
                f"{', '.join(sorted(SAFE_CAPABILITIES))}",
            )
    if context.get("allowPrivilegeEscalation") is True:
        forbid(
            "allowPrivilegeEscalation",
            "containers run with no-new-privileges; remove allowPrivilegeEscalation or set it "
            "to false",
        )
    for profile in ("seccompProfile", "appArmorProfile"):
        kind = (context.get(profile) or {}).get("type")
        if kind not in (None, "RuntimeDefault"):
            forbid(
                f"{profile}.type",
                f'"{kind}" is not offered: containers run with the runtime\'s default profile '
                "(RuntimeDefault)",
            )
    if context.get("procMount") not in (None, "Default"):
        forbid("procMount", "only the Default /proc mount is offered")
    if context.get("sysctls"):
        forbid("sysctls", "sysctls are not offered")
    for number in ("runAsUser", "runAsGroup", "fsGroup"):
        value = context.get(number)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31
        ):
            causes.append(
                Cause(
                    f"{path}.{number}",
                    f"Invalid value: {value!r}: must be a number from 0 to 2147483647",
                    "FieldValueInvalid",
                )
            )
    return causes


# What the Kubernetes API server adds to every pod (its DefaultTolerationSeconds admission): a pod
# stays on a node that is not ready or unreachable for 5 minutes before it is moved.
DEFAULT_TOLERATIONS: tuple[dict[str, Any], ...] = tuple(
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
)


def with_default_tolerations(tolerations: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The pod's tolerations plus each default one it does not already tolerate (a toleration of
    the same key with effect NoExecute, or with no effect, or of every key)."""
    result = list(tolerations or [])
    for default in DEFAULT_TOLERATIONS:
        covered = any(
            (t.get("key") in (None, "", default["key"]))
            and t.get("effect") in (None, "", "NoExecute")
            and (t.get("key") or t.get("operator") == "Exists")
            for t in result
        )
        if not covered:
            result.append(dict(default))
    return result


def stored_spec(pod: Pod) -> dict[str, Any]:
    """The spec as stored and returned, with Kubernetes' defaults filled in."""
    spec = pod.spec.model_dump(by_alias=True, exclude_none=True)
    spec["tolerations"] = with_default_tolerations(spec.get("tolerations"))
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "tessera")
    spec.setdefault("enableServiceLinks", True)
    if "overhead" in spec:
        spec["overhead"] = _quantity_strings(spec["overhead"])
    for key in ("containers", "initContainers"):
        for container in spec.get(key, []):
            resources = container.setdefault("resources", {})
            for part in ("requests", "limits"):
                if part in resources:
                    resources[part] = _quantity_strings(resources[part])
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = container.get("image", "")
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    return spec


def _quantity_strings(values: dict[str, Any]) -> dict[str, Any]:
    """Quantities written as numbers (`cpu: 2`, `cpu: 0.5`) stored as Kubernetes returns them:
    strings (`"2"`, `"500m"`); clients' typed models accept only strings."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        finite = not isinstance(value, float) or math.isfinite(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and finite:
            number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
            if number == number.to_integral_value():
                value = str(int(number))
            elif (number * 1000) == (number * 1000).to_integral_value():
                value = f"{int(number * 1000)}m"
            else:
                value = _plain(number)
        out[name] = value
    return out


def _cores(milli: int) -> str:
    return (
        format(Decimal(milli) / 1000, "f").rstrip("0").rstrip(".")
        if milli % 1000
        else str(milli // 1000)
    )


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)
