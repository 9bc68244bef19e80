"""The Pod as Tessera accepts it: the Kubernetes `v1/Pod` shape.

Fields Tessera acts on are typed; nested objects it stores and returns but does not interpret
(probes, volumes, security contexts, ...) are kept as free-form objects. Fields that have no
meaning in a serverless pool (`hostNetwork`, `nodeName`, ...) are refused at admission with a
message saying why.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from app.kube.meta import INT64_MAX, Int32, KubeModel, ListMeta, ObjectMeta, Quantity


def merge_by(key: str) -> dict[str, Any]:
    """The strategic-merge metadata of a list merged element by element on `key` (as in
    Kubernetes' OpenAPI): kubectl apply, edit and diff read it to patch only what changed."""
    return {
        "json_schema_extra": {
            "x-kubernetes-patch-merge-key": key,
            "x-kubernetes-patch-strategy": "merge",
        }
    }


class ResourceRequirements(KubeModel):
    """What the container needs. The pod's demand (the larger of summed requests and summed
    limits) is rounded up to the nearest sold spec, written to the annotation
    tessera.io/pod-use-spec, and billed."""

    limits: dict[str, Quantity] | None = Field(
        default=None, description="Upper bounds; same resource names as requests."
    )
    requests: dict[str, Quantity] | None = Field(
        default=None,
        description="cpu (0.25, or 0.5 steps to 16, then 24/32/48/64 vCPU), memory (1 GiB "
        "steps, 1 to 8 GiB per vCPU), and either nvidia.com/gpu (whole GPUs) or a slice of ONE "
        "GPU: tessera.io/gpu-memory (VRAM, e.g. 20Gi) with tessera.io/gpu-core (SM %, 1..100).",
    )
    claims: list[dict[str, Any]] | None = None


class ContainerPort(KubeModel):
    container_port: int = Field(ge=1, le=65535)
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] | None = None
    host_port: Int32 | None = Field(default=None, alias="hostPort")
    host_ip: str | None = Field(default=None, alias="hostIP")


class EnvVar(KubeModel):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class Container(KubeModel):
    name: str
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    working_dir: str | None = None
    ports: list[ContainerPort] | None = Field(default=None, **merge_by("containerPort"))
    env_from: list[dict[str, Any]] | None = None
    env: list[EnvVar] | None = Field(default=None, **merge_by("name"))
    resources: ResourceRequirements | None = None
    resize_policy: list[dict[str, Any]] | None = None
    restart_policy: str | None = None
    volume_mounts: list[dict[str, Any]] | None = Field(default=None, **merge_by("mountPath"))
    volume_devices: list[dict[str, Any]] | None = None
    liveness_probe: dict[str, Any] | None = None
    readiness_probe: dict[str, Any] | None = None
    startup_probe: dict[str, Any] | None = None
    lifecycle: dict[str, Any] | None = None
    termination_message_path: str | None = None
    termination_message_policy: str | None = None
    image_pull_policy: Literal["Always", "Never", "IfNotPresent"] | None = None
    security_context: dict[str, Any] | None = None
    stdin: bool | None = None
    stdin_once: bool | None = None
    tty: bool | None = None


class PodSpec(KubeModel):
    containers: list[Container] = Field(**merge_by("name"))
    init_containers: list[Container] | None = Field(default=None, **merge_by("name"))
    volumes: list[dict[str, Any]] | None = Field(default=None, **merge_by("name"))
    restart_policy: Literal["Always", "OnFailure", "Never"] | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=INT64_MAX)
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=INT64_MAX)
    dns_policy: str | None = None
    dns_config: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    service_account_name: str | None = None
    service_account: str | None = None
    automount_service_account_token: bool | None = None
    node_name: str | None = None
    host_network: bool | None = None
    host_pid: bool | None = Field(default=None, alias="hostPID")
    host_ipc: bool | None = Field(default=None, alias="hostIPC")
    host_users: bool | None = None
    share_process_namespace: bool | None = None
    security_context: dict[str, Any] | None = None
    image_pull_secrets: list[dict[str, Any]] | None = Field(default=None, **merge_by("name"))
    hostname: str | None = None
    subdomain: str | None = None
    set_hostname_as_fqdn: bool | None = Field(default=None, alias="setHostnameAsFQDN")
    affinity: dict[str, Any] | None = None
    scheduler_name: str | None = None
    tolerations: list[dict[str, Any]] | None = None
    host_aliases: list[dict[str, Any]] | None = None
    priority_class_name: str | None = None
    priority: Int32 | None = None
    preemption_policy: str | None = None
    readiness_gates: list[dict[str, Any]] | None = None
    runtime_class_name: str | None = None
    enable_service_links: bool | None = None
    overhead: dict[str, Quantity] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = None
    os: dict[str, Any] | None = None
    scheduling_gates: list[dict[str, Any]] | None = None
    resource_claims: list[dict[str, Any]] | None = None


class PodCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_probe_time: str | None = None
    last_transition_time: str | None = None


class PodStatus(KubeModel):
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"] | None = Field(
        default=None, description="Pending until the scheduler binds the pod to capacity."
    )
    conditions: list[PodCondition] | None = Field(default=None, **merge_by("type"))
    message: str | None = None
    reason: str | None = None
    host_ip: str | None = Field(default=None, alias="hostIP")
    pod_ip: str | None = Field(default=None, alias="podIP")
    pod_ips: list[dict[str, str]] | None = Field(default=None, alias="podIPs", max_length=2)
    start_time: str | None = None
    qos_class: str | None = None
    container_statuses: list[dict[str, Any]] | None = None
    init_container_statuses: list[dict[str, Any]] | None = None
    nominated_node_name: str | None = None


class _Reported(BaseModel):
    """What a node reports: fields Tessera does not keep (hostIP, ...) are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


Text = Annotated[str, Field(max_length=1024)]
Reason = Annotated[str, Field(max_length=64)]
Time = Annotated[str, Field(max_length=64)]


class ContainerStateRunning(_Reported):
    started_at: Time | None = None


class ContainerStateWaiting(_Reported):
    reason: Reason | None = None
    message: Text | None = None


class ContainerStateTerminated(_Reported):
    exit_code: Int32
    signal: Int32 | None = None
    reason: Reason | None = None
    message: Text | None = None
    started_at: Time | None = None
    finished_at: Time | None = None
    container_id: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, alias="containerID"
    )


class ContainerState(_Reported):
    running: ContainerStateRunning | None = None
    waiting: ContainerStateWaiting | None = None
    terminated: ContainerStateTerminated | None = None


class ReportedContainerStatus(_Reported):
    name: Annotated[str, Field(max_length=63)]
    state: ContainerState = Field(default_factory=ContainerState)
    last_state: ContainerState = Field(default_factory=ContainerState)
    ready: bool = False
    started: bool | None = None
    restart_count: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    image: Annotated[str, Field(max_length=1024)] | None = None
    image_id: Annotated[str, Field(max_length=1024)] | None = Field(default=None, alias="imageID")
    container_id: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, alias="containerID"
    )


class ReportedCondition(_Reported):
    """A condition as reported: the node decides Ready and ContainersReady (readiness probes);
    the others are Tessera's and ignored here."""

    type: Annotated[str, Field(max_length=64)]
    status: Literal["True", "False", "Unknown"]
    reason: Reason | None = None


class ReportedPodStatus(_Reported):
    """A pod's status as its node reports it (`PUT pods/{name}/status`)."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"]
    reason: Reason | None = None
    message: Text | None = None
    start_time: Time | None = None
    container_statuses: list[ReportedContainerStatus] | None = Field(default=None, max_length=64)
    init_container_statuses: list[ReportedContainerStatus] | None = Field(
        default=None, max_length=64
    )
    pod_ip: Annotated[str, Field(max_length=64)] | None = Field(default=None, alias="podIP")
    conditions: list[ReportedCondition] | None = Field(default=None, max_length=32)


MAX_LOG_LINES_PER_BATCH = 1000
MAX_LOG_LINE_CHARS = 16 * 1024
MAX_LOG_BODY_BYTES = 1024 * 1024


class PodLogLineIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    time: Time  # RFC 3339, when the container wrote it
    text: Annotated[str, Field(max_length=MAX_LOG_LINE_CHARS)]


class PodLogBatch(BaseModel):
    """Lines a node agent sends for one run of a container (`POST pods/{name}/log`, a Tessera
    extension): the run is the container's restartCount while it wrote them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    restart_count: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    lines: list[PodLogLineIn] = Field(max_length=MAX_LOG_LINES_PER_BATCH)


class Pod(KubeModel):
    """A unit of work: containers with the vCPU, memory and GPU (whole or a slice) they need.
    Tessera picks where it runs from the pooled inventory; labels tessera.io/compute-class,
    tessera.io/compute-qos and tessera.io/gpu-model steer the choice."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["Pod"] | None = "Pod"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec
    status: PodStatus | None = None


class PodList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["PodList"] = "PodList"
    metadata: ListMeta
    items: list[Pod]


class PodBatch(KubeModel):
    """Tessera's create of many pods in one request (`POST /apis/tessera.io/v1/namespaces/{ns}/
    podbatches`): `items` are the pods to create, each as `POST .../pods` takes it; in the
    answer, each item is what that create answers, in order: the pod created or a Status."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["PodBatch"] = "PodBatch"
    items: list[dict[str, Any]] = Field(max_length=500)


class ObjectReference(KubeModel):
    kind: str | None = None
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    api_version: str | None = None
    resource_version: str | None = None
    field_path: str | None = None


class Binding(KubeModel):
    """The scheduler's decision for one pod. Tessera's GPU fragments travel in the annotation
    `tessera.io/gpu-allocation`: a JSON list of `{"gpu": NAME, "memoryMiB": N, "corePercent": N}`."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["Binding"] | None = "Binding"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    target: ObjectReference


class DeleteOptions(KubeModel):
    api_version: str | None = None
    kind: str | None = None
    grace_period_seconds: int | None = Field(default=None, ge=0, le=INT64_MAX)
    propagation_policy: str | None = None
    preconditions: dict[str, Any] | None = None
    orphan_dependents: bool | None = None
    dry_run: list[str] | None = None


class Eviction(KubeModel):
    """A request to stop a pod gracefully (`policy/v1`, as `kubectl drain` sends it): a deletion
    with these options, after which the pod carries the `DisruptionTarget` condition (reason
    `EvictionByEvictionAPI`) while it stops."""

    api_version: Literal["policy/v1", "policy/v1beta1"] | None = "policy/v1"
    kind: Literal["Eviction"] | None = "Eviction"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    delete_options: DeleteOptions | None = None
