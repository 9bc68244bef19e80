"""Node and GPUDevice as the API returns them (documentation and `kubectl explain`).

The inventory serialises its rows directly (`service.node_to_api`, `service.gpu_to_api`); these
models describe that output in the OpenAPI document, so clients know the shapes and the API
tests check every answer against them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta

Health = Literal["Healthy", "Unhealthy"]


class Taint(KubeModel):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    time_added: str | None = None


class NodeSpec(KubeModel):
    unschedulable: bool | None = Field(
        default=None, description="Cordoned: the solver places no new pod here."
    )
    taints: list[Taint] | None = None


class NodeCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_heartbeat_time: str | None = None
    last_transition_time: str | None = None


class NodeAddress(KubeModel):
    type: str
    address: str


class NodeSystemInfo(KubeModel):
    kubelet_version: str
    kube_proxy_version: str
    container_runtime_version: str
    operating_system: str
    architecture: str
    os_image: str
    kernel_version: str
    machine_id: str = Field(alias="machineID")
    system_uuid: str = Field(alias="systemUUID")
    boot_id: str = Field(alias="bootID")


class NodeStatus(KubeModel):
    capacity: dict[str, str] = Field(
        description="cpu, memory, pods and, on GPU nodes, nvidia.com/gpu, tessera.io/gpu-memory "
        "(VRAM of all GPUs) and tessera.io/gpu-core (100 per GPU)."
    )
    allocatable: dict[str, str] = Field(
        description="What pods may use: CPU and memory as registered (at most the capacity), "
        "GPU resources of healthy GPUs only. Free amounts are in the node's annotations."
    )
    conditions: list[NodeCondition]
    addresses: list[NodeAddress]
    node_info: NodeSystemInfo


class Node(KubeModel):
    """A machine of the pool. Topology is in its labels: topology.kubernetes.io/region and
    /zone, tessera.io/rack, tessera.io/nvlink-domain, tessera.io/gpu-model."""

    api_version: Literal["v1"] = "v1"
    kind: Literal["Node"] = "Node"
    metadata: ObjectMeta
    spec: NodeSpec
    status: NodeStatus


class NodeList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["NodeList"] = "NodeList"
    metadata: ListMeta
    items: list[Node]


class GPUDeviceSpec(KubeModel):
    node_name: str = Field(description="The node the GPU is in.")
    index: int = Field(ge=0, description="The GPU's index on its node.")
    model: str = Field(description="GPU model, e.g. H200 (also the tessera.io/gpu-model label).")
    memory: str = Field(description="VRAM of the GPU, e.g. 141Gi.")
    sm_count: int = Field(
        gt=0, description="Streaming multiprocessors; 100 % of tessera.io/gpu-core."
    )
    numa_node: int = Field(ge=0, description="The host NUMA node the GPU is attached to.")
    pcie_switch: str = Field(description="PCIe switch shared with the node's other GPUs, if any.")
    nvlink_domain: str = Field(description="NVLink domain; GPUs in one domain talk fastest.")
    rdma_nic: str = Field(description="RDMA NIC nearest the GPU, if any.")
    uuid: str | None = Field(
        default=None,
        max_length=96,
        description="NVML's UUID of the GPU (GPU-...), as its node's agent read it: the GPU a "
        "container is given by. Absent on nodes that do not run containers.",
    )
    taints: list[Taint] | None = Field(
        default=None,
        description="Device taints (KEP-5055): NoExecute is a fault (tessera.io/gpu-fault), set by "
        "a fault report and removed by a repair; an admin may add NoSchedule taints to drain the "
        "GPU without stopping its pods. Either keeps new fragments off the GPU.",
    )


class GPUAmount(KubeModel):
    memory: str = Field(description="VRAM, e.g. 20Gi.")
    core_percent: int = Field(ge=0, le=100, description="Share of the GPU's SMs, in %.")


class GPUHolder(KubeModel):
    """A pod holding a share of the GPU; a tenant sees only its own pods here."""

    namespace: str
    name: str
    memory: str
    core_percent: int = Field(ge=0, le=100)


FaultKind = Literal["ecc", "xid", "bus", "driver"]


class GPUFaultRecord(KubeModel):
    """One fault of the GPU's bounded history (the newest last)."""

    kind: FaultKind = Field(
        description="ecc (uncorrectable), xid (a fatal Xid), bus (fell off), driver."
    )
    xid: int | None = Field(default=None, ge=1, le=999, description="The Xid, for kind xid.")
    message: str | None = Field(default=None, max_length=1024)
    time: str = Field(description="When the fault was reported (RFC 3339).")
    repaired_time: str | None = Field(default=None, description="When the GPU was repaired.")


class GPUDeviceStatus(KubeModel):
    health: Health = Field(description="Unhealthy GPUs are isolated: nothing new is placed there.")
    free: GPUAmount = Field(description="What is still free on the GPU.")
    allocated: GPUAmount = Field(description="What pods hold on the GPU.")
    pods: list[GPUHolder] | None = Field(
        default=None, description="Pods holding a share (only in reads of one GPU or lists)."
    )
    faults: list[GPUFaultRecord] | None = Field(
        default=None, description="The GPU's last faults (at most 16), the newest last."
    )


class GPUDevice(KubeModel):
    """One GPU of the pool: the unit the solver slices (VRAM and SM %) or gives whole."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["GPUDevice"] = "GPUDevice"
    metadata: ObjectMeta
    spec: GPUDeviceSpec
    status: GPUDeviceStatus


class GPUDeviceList(KubeModel):
    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["GPUDeviceList"] = "GPUDeviceList"
    metadata: ListMeta
    items: list[GPUDevice]


class GPUFaultSpec(KubeModel):
    kind: FaultKind = Field(
        description="ecc: uncorrectable ECC error; xid: an Xid NVIDIA's device plugin treats as "
        "fatal (e.g. 48, 62, 63, 64, 74, 79, 94, 95); bus: fell off the bus; driver: driver failure."
    )
    xid: int | None = Field(
        default=None, strict=True, description="The Xid number (kind xid only), 1-999."
    )
    message: str = Field(default="", description="What was seen (at most 1024 characters).")


class GPUFault(KubeModel):
    """A fault report (POST .../gpudevices/{name}/fault): the GPU is Unhealthy at once and the
    pods on it are stopped after TESSERA_GPU_FAULT_GRACE_SECONDS (or placed again)."""

    api_version: Literal["tessera.io/v1"] | None = "tessera.io/v1"
    kind: Literal["GPUFault"] | None = "GPUFault"
    spec: GPUFaultSpec
