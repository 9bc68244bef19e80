"""Nodes, GPUs and the capacity they hold.

Nodes are Kubernetes `v1/Node` objects; each GPU is its own `tessera.io/v1/GPUDevice`. A node is
registered with its capacity (`status.capacity` with `nvidia.com/gpu`) and its GPU model label,
and Tessera creates its GPUs from that in the same transaction. Free capacity lives in `*_free`
columns that `reserve()` / `release()` change with single UPDATE statements: the database's CHECK
constraints make an over-allocation impossible even between concurrent writers.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import yaml
from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.constants import (
    COMPUTE_CLASSES,
    CPU,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    LABEL_COMPUTE_CLASS,
    LABEL_GPU_MODEL,
    LABEL_HOSTNAME,
    LABEL_NVLINK_DOMAIN,
    LABEL_RACK,
    LABEL_REGION,
    LABEL_RUNTIME,
    LABEL_ZONE,
    MEMORY,
    TAINT_GPU_FAULT,
    TESSERA_GROUP,
)
from app.db.engine import (
    defer_insert,
    defer_update,
    is_check_violation,
    next_resource_version,
    record_change,
)
from app.db.models import GPUAllocation, GPUDevice, GPUModel, Node, Pod, table
from app.errors import (
    AlreadyExists,
    Cause,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ResourceRef,
    invalid,
)
from app.kube.bodies import section
from app.kube.meta import (
    derived_name,
    now,
    timestamp,
    validate_annotations,
    validate_labels,
    validate_name,
)
from app.kube.quantity import (
    QuantityError,
    format_cpu,
    format_mib,
    parse_quantity,
    to_mib,
    to_milli,
)
from app.pods.admission import GPUModelInfo, PoolCatalog

Row = Mapping[Any, Any]
nodes_t = table(Node)
gpus_t = table(GPUDevice)
allocations_t = table(GPUAllocation)

ANNOTATION_FREE_CPU = "tessera.io/free-cpu"
ANNOTATION_FREE_MEMORY = "tessera.io/free-memory"
ANNOTATION_FREE_GPUS = "tessera.io/free-gpus"
ANNOTATION_FREE_GPU_MEMORY = "tessera.io/free-gpu-memory"
COMPUTED_ANNOTATIONS = (
    ANNOTATION_FREE_CPU,
    ANNOTATION_FREE_MEMORY,
    ANNOTATION_FREE_GPUS,
    ANNOTATION_FREE_GPU_MEMORY,
)
NODE_FIELD_SELECTORS = ("metadata.name", "spec.unschedulable")
GPU_FIELD_SELECTORS = ("metadata.name", "spec.nodeName", "spec.model", "status.health")


@dataclass(frozen=True)
class GPUShare:
    """The part of one GPU a pod takes."""

    gpu: str
    memory_mib: int
    core_pct: int


@dataclass(frozen=True)
class GPUSpec:
    index: int
    model: str
    numa_node: int = 0
    pcie_switch: str = ""
    nvlink_domain: str = ""
    rdma_nic: str = ""
    uuid: str = ""  # NVML's ("GPU-..."), when the node's agent read it


@dataclass(frozen=True)
class NodeSpec:
    """A node to register, with its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    cpu_allocatable_milli: int | None = None
    memory_allocatable_mib: int | None = None
    region: str = ""
    zone: str = ""
    rack: str = ""
    compute_classes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    numa_nodes: int = 1
    gpus: tuple[GPUSpec, ...] = ()


# --- GPU models -----------------------------------------------------------------------------


@cache
def builtin_models() -> dict[str, tuple[int, int]]:
    """Model -> (VRAM MiB, SM count), from gpu_models.yaml."""
    raw = yaml.safe_load(Path(__file__).with_name("gpu_models.yaml").read_text())
    return {
        name: (to_mib(parse_quantity(v["memory"])), int(v["smCount"])) for name, v in raw.items()
    }


def ensure_models(session: Session, models: Mapping[str, tuple[int, int]]) -> None:
    existing = {row.name: row for row in session.scalars(select(GPUModel))}
    for name, (vram, sm) in models.items():
        row = existing.get(name)
        if row is None:
            session.add(GPUModel(name=name, vram_mib=vram, sm_count=sm))
        elif (row.vram_mib, row.sm_count) != (vram, sm):
            raise Conflict(
                f"GPU model {name} is already known with {format_mib(row.vram_mib)} and "
                f"{row.sm_count} SMs; an inventory cannot redefine it"
            )
    session.flush()


def load_pool_catalog(session: Session) -> PoolCatalog:
    models = {row.name: (row.vram_mib, row.sm_count) for row in session.scalars(select(GPUModel))}
    per_node = (
        select(GPUDevice.model, GPUDevice.node_name, func.count().label("n"))
        .group_by(GPUDevice.model, GPUDevice.node_name)
        .subquery()
    )
    query = select(per_node.c.model, func.max(per_node.c.n)).group_by(per_node.c.model)
    max_per_model = {model: count for model, count in session.execute(query)}
    return PoolCatalog(
        {
            name: GPUModelInfo(name, vram, sm, int(max_per_model.get(name, 0)))
            for name, (vram, sm) in models.items()
            if name in max_per_model
        }
    )


# --- nodes ----------------------------------------------------------------------------------


def create_node(session: Session, spec: NodeSpec) -> dict[str, Any]:
    if session.get(Node, spec.name) is not None:
        raise AlreadyExists(
            f'nodes "{spec.name}" already exists', ref=ResourceRef("nodes", spec.name)
        )
    models = {row.name: row for row in session.scalars(select(GPUModel))}
    for gpu in spec.gpus:
        if gpu.model not in models:
            if gpu.model in builtin_models():
                ensure_models(session, {gpu.model: builtin_models()[gpu.model]})
                models = {row.name: row for row in session.scalars(select(GPUModel))}
            else:
                known = ", ".join(sorted(builtin_models()))
                raise invalid(
                    "Node",
                    spec.name,
                    [
                        Cause(
                            f"metadata.labels.{LABEL_GPU_MODEL}",
                            f'Unsupported value: "{gpu.model}": unknown GPU model; known: {known} (an inventory file can add models)',
                            "FieldValueNotSupported",
                        )
                    ],
                )
    at = now()
    classes = spec.compute_classes or (
        ("gpu",) if spec.gpus else ("general-purpose", "performance")
    )
    labels = {
        LABEL_HOSTNAME: spec.name,
        **({LABEL_REGION: spec.region} if spec.region else {}),
        **({LABEL_ZONE: spec.zone} if spec.zone else {}),
        **({LABEL_RACK: spec.rack} if spec.rack else {}),
        LABEL_COMPUTE_CLASS: "_".join(classes) if len(classes) > 1 else classes[0],
        **spec.labels,
    }
    if spec.gpus:
        labels[LABEL_GPU_MODEL] = spec.gpus[0].model
        domains = {g.nvlink_domain for g in spec.gpus}
        if len(domains) == 1 and "" not in domains:
            labels[LABEL_NVLINK_DOMAIN] = domains.pop()
    cpu_alloc = (
        spec.cpu_allocatable_milli if spec.cpu_allocatable_milli is not None else spec.cpu_milli
    )
    mem_alloc = (
        spec.memory_allocatable_mib if spec.memory_allocatable_mib is not None else spec.memory_mib
    )
    node_values = {
        "name": spec.name,
        "uid": str(uuid.uuid4()),
        "resource_version": next_resource_version(session),
        "created_at": at,
        "labels": labels,
        "annotations": dict(spec.annotations),
        "unschedulable": spec.unschedulable,
        "region": spec.region,
        "zone": spec.zone,
        "rack": spec.rack,
        "compute_classes": ",".join(classes),
        "cpu_capacity_milli": spec.cpu_milli,
        "cpu_allocatable_milli": cpu_alloc,
        "cpu_free_milli": cpu_alloc,
        "memory_capacity_mib": spec.memory_mib,
        "memory_allocatable_mib": mem_alloc,
        "memory_free_mib": mem_alloc,
        "numa_nodes": spec.numa_nodes,
        "ready": True,
    }
    session.execute(nodes_t.insert(), [node_values])
    gpu_rows = []
    for gpu in spec.gpus:
        model = models[gpu.model]
        gpu_rows.append(
            {
                "name": derived_name(spec.name, f"-gpu{gpu.index}"),
                "uid": str(uuid.uuid4()),
                "resource_version": next_resource_version(session),
                "created_at": at,
                "node_name": spec.name,
                "index": gpu.index,
                "model": gpu.model,
                "vram_mib": model.vram_mib,
                "sm_count": model.sm_count,
                "numa_node": gpu.numa_node,
                "pcie_switch": gpu.pcie_switch,
                "nvlink_domain": gpu.nvlink_domain,
                "rdma_nic": gpu.rdma_nic,
                "uuid": gpu.uuid,
                "health": "Healthy",
                "vram_free_mib": model.vram_mib,
                "core_free_pct": 100,
            }
        )
    if gpu_rows:
        session.execute(gpus_t.insert(), gpu_rows)
    _log_node(session, node_values, gpu_rows, "ADDED")
    for gpu_row in gpu_rows:
        _log_gpu(session, gpu_row, node_values, "ADDED")
    return node_to_api(node_values, gpu_rows)


def node_spec_from_api(body: dict[str, Any]) -> NodeSpec:
    """Read a v1 Node as the admin sends it: capacity, topology labels, GPU model label."""
    meta = section(body, "metadata")
    name = str(meta.get("name") or "")
    labels = {str(k): str(v) for k, v in section(meta, "labels").items()}
    annotations = {str(k): str(v) for k, v in section(meta, "annotations").items()}
    status = section(body, "status")
    spec = section(body, "spec")
    capacity = section(status, "capacity")
    allocatable = section(status, "allocatable")
    causes = (
        validate_name(name, "metadata.name")
        + validate_labels(labels, "metadata.labels")
        + validate_annotations(annotations, "metadata.annotations")
    )

    def quantity(where: dict[str, Any], key: str, path: str, required: bool) -> Any:
        if key not in where:
            if required:
                causes.append(
                    Cause(
                        path,
                        f"Required value: give {path} (e.g. {'96' if key == CPU else '384Gi'})",
                        "FieldValueRequired",
                    )
                )
            return None
        try:
            return parse_quantity(where[key])
        except QuantityError as exc:
            causes.append(Cause(path, f"Invalid value: {exc}"))
            return None

    cpu = quantity(capacity, CPU, "status.capacity.cpu", True)
    memory = quantity(capacity, MEMORY, "status.capacity.memory", True)
    cpu_alloc = quantity(allocatable, CPU, "status.allocatable.cpu", False)
    mem_alloc = quantity(allocatable, MEMORY, "status.allocatable.memory", False)
    gpus = quantity(capacity, GPU, f"status.capacity.{GPU}", False)
    gpu_count = int(gpus or 0)
    if not 0 <= gpu_count <= MAX_GPUS_PER_NODE:
        causes.append(
            Cause(
                f"status.capacity.{GPU}",
                f"Invalid value: {gpu_count}: a node holds 0 to {MAX_GPUS_PER_NODE} GPUs",
            )
        )
        gpu_count = 0
    numa_nodes = _small_int(
        annotations, "tessera.io/numa-nodes", 2 if gpu_count >= 4 else 1, causes
    )
    model = labels.get(LABEL_GPU_MODEL)
    if gpu_count and not model:
        causes.append(
            Cause(
                f"metadata.labels.{LABEL_GPU_MODEL}",
                f"Required value: a node with GPUs needs the label {LABEL_GPU_MODEL} (e.g. H200)",
                "FieldValueRequired",
            )
        )
    if cpu is not None and cpu_alloc is not None and cpu_alloc > cpu:
        causes.append(
            Cause("status.allocatable.cpu", "Invalid value: allocatable cannot exceed capacity")
        )
    if memory is not None and mem_alloc is not None and mem_alloc > memory:
        causes.append(
            Cause("status.allocatable.memory", "Invalid value: allocatable cannot exceed capacity")
        )
    classes = tuple(
        c for c in labels.get(LABEL_COMPUTE_CLASS, "").replace("_", ",").split(",") if c
    )
    for c in classes:
        if c not in COMPUTE_CLASSES:
            causes.append(
                Cause(
                    f"metadata.labels.{LABEL_COMPUTE_CLASS}",
                    f'Unsupported value: "{c}": supported: {", ".join(COMPUTE_CLASSES)}',
                    "FieldValueNotSupported",
                )
            )
    topology = _gpu_topology(annotations, gpu_count, model or "", name, causes)
    if causes:
        raise invalid("Node", name, causes)
    return NodeSpec(
        name=name,
        cpu_milli=to_milli(cpu),
        memory_mib=to_mib(memory),
        cpu_allocatable_milli=to_milli(cpu_alloc) if cpu_alloc is not None else None,
        memory_allocatable_mib=to_mib(mem_alloc) if mem_alloc is not None else None,
        region=labels.get(LABEL_REGION, ""),
        zone=labels.get(LABEL_ZONE, ""),
        rack=labels.get(LABEL_RACK, ""),
        compute_classes=classes,
        labels=labels,
        annotations={k: v for k, v in annotations.items() if k not in COMPUTED_ANNOTATIONS},
        unschedulable=bool(spec.get("unschedulable", False)),
        numa_nodes=max(1, numa_nodes),
        gpus=topology,
    )


def default_gpu_layout(
    node: str,
    count: int,
    model: str,
    *,
    numa_nodes: int = 2,
    nvlink_domain_size: int | None = None,
    gpus_per_switch: int = 2,
) -> tuple[GPUSpec, ...]:
    """The usual server layout: GPUs split evenly over NUMA nodes, two per PCIe switch, and
    NVLink domains of `nvlink_domain_size` GPUs (default: all of the node's GPUs)."""
    size = nvlink_domain_size or count
    numa = max(1, min(numa_nodes, count))
    return tuple(
        GPUSpec(
            index=i,
            model=model,
            numa_node=i * numa // max(count, 1),
            pcie_switch=derived_name(node, f"-pcie{i // gpus_per_switch}", limit=63),
            nvlink_domain=derived_name(node, f"-nvl{i // size}", limit=127) if size > 1 else "",
            rdma_nic=derived_name(node, f"-nic{i // gpus_per_switch}", limit=63),
        )
        for i in range(count)
    )


MAX_GPUS_PER_NODE = 64


def _small_int(annotations: dict[str, str], key: str, default: int, causes: list[Cause]) -> int:
    """An annotation holding a count from 1 to MAX_GPUS_PER_NODE."""
    raw = annotations.get(key)
    if raw is None:
        return default
    if raw.isascii() and raw.isdigit() and 1 <= int(raw[:4]) <= MAX_GPUS_PER_NODE:
        return int(raw)
    causes.append(
        Cause(
            f"metadata.annotations.{key}",
            f'Invalid value: "{raw[:40]}": must be a whole number from 1 to {MAX_GPUS_PER_NODE}',
        )
    )
    return default


def _gpu_topology(
    annotations: dict[str, str], count: int, model: str, node: str, causes: list[Cause]
) -> tuple[GPUSpec, ...]:
    raw = annotations.get("tessera.io/gpu-topology")
    if raw is None:
        return default_gpu_layout(
            node,
            count,
            model,
            nvlink_domain_size=_small_int(
                annotations, "tessera.io/nvlink-domain-size", count or 1, causes
            ),
        )
    try:
        items = orjson.loads(raw)
        gpus = tuple(
            GPUSpec(
                index=int(item.get("index", i)),
                model=str(item.get("model", model)),
                numa_node=int(item.get("numaNode", 0)),
                pcie_switch=str(item.get("pcieSwitch", "")),
                nvlink_domain=str(item.get("nvlinkDomain", "")),
                rdma_nic=str(item.get("rdmaNic", "")),
                uuid=str(item.get("uuid", "")),
            )
            for i, item in enumerate(items)
        )
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        causes.append(
            Cause(
                "metadata.annotations.tessera.io/gpu-topology",
                'Invalid value: expected a JSON list like [{"index": 0, "numaNode": 0, "pcieSwitch": "s0", "nvlinkDomain": "d0"}]',
            )
        )
        return ()
    for i, gpu in enumerate(gpus):
        bad = [
            f"{field} must be 0 to {MAX_GPUS_PER_NODE - 1}"
            for field, value in (("index", gpu.index), ("numaNode", gpu.numa_node))
            if not 0 <= value < MAX_GPUS_PER_NODE
        ] + [
            f"{field} may have at most {limit} characters"
            for field, value, limit in (
                ("pcieSwitch", gpu.pcie_switch, 63),
                ("nvlinkDomain", gpu.nvlink_domain, 127),
                ("rdmaNic", gpu.rdma_nic, 63),
                ("model", gpu.model, 63),
                ("uuid", gpu.uuid, 96),
            )
            if len(value) > limit
        ]
        if bad:
            causes.append(
                Cause(
                    "metadata.annotations.tessera.io/gpu-topology",
                    f"Invalid value: GPU {i}: {'; '.join(bad)}",
                )
            )
    if len(gpus) != count:
        causes.append(
            Cause(
                "metadata.annotations.tessera.io/gpu-topology",
                f"Invalid value: lists {len(gpus)} GPUs but status.capacity says {count}",
            )
        )
    return gpus


def get_node_row(session: Session, name: str) -> Row:
    row = session.execute(select(nodes_t).where(nodes_t.c.name == name)).mappings().first()
    if row is None:
        raise NotFound(f'nodes "{name}" not found', ref=ResourceRef("nodes", name))
    return row


def gpus_of(session: Session, node_names: Sequence[str] | None = None) -> dict[str, list[Row]]:
    query = select(gpus_t).order_by(gpus_t.c.node_name, gpus_t.c.index)
    if node_names is not None:
        query = query.where(gpus_t.c.node_name.in_(node_names))
    out: dict[str, list[Row]] = {}
    for row in session.execute(query).mappings():
        out.setdefault(row["node_name"], []).append(row)
    return out


def get_node(session: Session, name: str) -> dict[str, Any]:
    row = get_node_row(session, name)
    return node_to_api(row, gpus_of(session, [name]).get(name, []))


def list_nodes(session: Session) -> list[dict[str, Any]]:
    rows = list(session.execute(select(nodes_t).order_by(nodes_t.c.name)).mappings())
    gpus = gpus_of(session)
    return [node_to_api(row, gpus.get(row["name"], [])) for row in rows]


def update_node(
    session: Session, name: str, desired: dict[str, Any], *, by_node: bool = False
) -> dict[str, Any]:
    """Apply an admin's change: labels, annotations and `spec.unschedulable` (cordon).
    `by_node`: the change comes from the node's own agent, which may change its annotations
    and the label naming its runtime (as Kubernetes' NodeRestriction keeps a kubelet from undoing
    an admin's cordon or relabelling its node to attract or repel pods)."""
    row = (
        session.execute(select(nodes_t).where(nodes_t.c.name == name).with_for_update())
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(f'nodes "{name}" not found', ref=ResourceRef("nodes", name))
    meta = section(desired, "metadata")
    wanted_rv = meta.get("resourceVersion")
    if wanted_rv not in (None, "") and str(wanted_rv) != str(row["resource_version"]):
        raise Conflict(
            f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; please apply your changes to the latest version and try again',
            ref=ResourceRef("nodes", name),
        )
    labels = {str(k): str(v) for k, v in section(meta, "labels").items()}
    annotations = {
        str(k): str(v)
        for k, v in section(meta, "annotations").items()
        if k not in COMPUTED_ANNOTATIONS
    }
    causes = validate_labels(labels, "metadata.labels") + validate_annotations(
        annotations, "metadata.annotations"
    )
    for key in (LABEL_ZONE, LABEL_REGION, LABEL_RACK, LABEL_GPU_MODEL, LABEL_HOSTNAME):
        if row["labels"].get(key) != labels.get(key):
            causes.append(
                Cause(
                    f"metadata.labels.{key}",
                    "Forbidden: topology and model labels describe the hardware and cannot change; re-register the node",
                    "FieldValueForbidden",
                )
            )
    if causes:
        raise invalid("Node", name, causes)
    unschedulable = bool((desired.get("spec") or {}).get("unschedulable", False))
    changes = {
        k: v
        for k, v in {
            "labels": labels,
            "annotations": annotations,
            "unschedulable": unschedulable,
        }.items()
        if row[k] != v
    }
    gpus = gpus_of(session, [name]).get(name, [])
    shown = node_to_api(row, gpus)  # its labels as read: with the ones Tessera adds
    refused = {"unschedulable"} & changes.keys()
    current = shown["metadata"].get("labels", {})
    if {k: v for k, v in labels.items() if k != LABEL_RUNTIME} != {
        k: v for k, v in current.items() if k != LABEL_RUNTIME
    }:
        refused.add("labels")
    if by_node and refused:
        what = " and ".join(
            {"labels": "its labels", "unschedulable": "its cordon (spec.unschedulable)"}[k]
            for k in sorted(refused)
        )
        raise Forbidden(
            f'node "{name}" may not change {what}: a node agent may change only its '
            f"annotations and its {LABEL_RUNTIME} label; other labels and cordons are the "
            "admin's (kubectl label / cordon with the admin token)"
        )
    if not changes:
        return shown
    changes["resource_version"] = next_resource_version(session)
    session.execute(update(nodes_t).where(nodes_t.c.name == name).values(**changes))
    updated = {**row, **changes}
    _log_node(session, updated, gpus, "MODIFIED", before=node_to_api(row, gpus))
    return node_to_api(updated, gpus)


def delete_node(session: Session, name: str) -> dict[str, Any]:
    row = get_node_row(session, name)
    bound = session.scalar(select(func.count()).select_from(Pod).where(Pod.node_name == name)) or 0
    if bound:
        raise Conflict(
            f'nodes "{name}" still runs {bound} pod(s): cordon it (spec.unschedulable: true) and wait for them to finish, or delete them',
            ref=ResourceRef("nodes", name),
        )
    gpus = gpus_of(session, [name]).get(name, [])
    session.execute(delete(gpus_t).where(gpus_t.c.node_name == name))
    session.execute(delete(nodes_t).where(nodes_t.c.name == name))
    gone = {**row, "resource_version": next_resource_version(session)}
    for gpu in gpus:
        _log_gpu(
            session, {**gpu, "resource_version": next_resource_version(session)}, row, "DELETED"
        )
    _log_node(session, gone, gpus, "DELETED")
    return node_to_api(gone, gpus)


# --- GPUs -----------------------------------------------------------------------------------


def list_gpu_rows(session: Session, name: str | None = None) -> list[Row]:
    query = (
        select(gpus_t, nodes_t.c.zone, nodes_t.c.region, nodes_t.c.rack)
        .join(nodes_t, nodes_t.c.name == gpus_t.c.node_name)
        .order_by(gpus_t.c.node_name, gpus_t.c.index)
    )
    if name is not None:
        query = query.where(gpus_t.c.name == name)
    return list(session.execute(query).mappings())


def gpu_node(session: Session, name: str) -> str | None:
    """The node a GPU device is on (None when there is no such GPU)."""
    return session.scalar(select(gpus_t.c.node_name).where(gpus_t.c.name == name))


def gpu_pods(
    session: Session, gpu_names: Sequence[str] | None, *, tenant_id: int | None, admin: bool
) -> dict[str, list[dict[str, Any]]]:
    """Who holds each GPU: the admin sees every pod; a tenant sees only its own."""
    query = select(
        allocations_t.c.gpu_name,
        allocations_t.c.vram_mib,
        allocations_t.c.core_pct,
        Pod.namespace,
        Pod.name,
        Pod.tenant_id,
    ).join(Pod, Pod.uid == allocations_t.c.pod_uid)
    if gpu_names is not None:
        query = query.where(allocations_t.c.gpu_name.in_(gpu_names))
    if not admin:
        query = query.where(Pod.tenant_id == tenant_id)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in session.execute(query):
        out.setdefault(row.gpu_name, []).append(
            {
                "namespace": row.namespace,
                "name": row.name,
                "memory": format_mib(row.vram_mib),
                "corePercent": row.core_pct,
            }
        )
    return out


def update_gpu(session: Session, name: str, desired: dict[str, Any]) -> Row:
    """Admin change of a GPU: labels are derived; `status.health` isolates a faulty GPU."""
    rows = list_gpu_rows(session, name)
    if not rows:
        raise NotFound(
            f'gpudevices.{TESSERA_GROUP} "{name}" not found',
            ref=ResourceRef("gpudevices", name, TESSERA_GROUP),
        )
    row = rows[0]
    health = (desired.get("status") or {}).get("health", row["health"])
    if health not in ("Healthy", "Unhealthy"):
        raise invalid(
            "GPUDevice",
            name,
            [
                Cause(
                    "status.health",
                    f'Unsupported value: "{health}": supported values: "Healthy", "Unhealthy"',
                    "FieldValueNotSupported",
                )
            ],
            group=TESSERA_GROUP,
        )
    if health == row["health"]:
        return row
    if health == "Healthy" and any(t.get("key") == TAINT_GPU_FAULT for t in row["taints"]):
        raise invalid(
            "GPUDevice",
            name,
            [
                Cause(
                    "status.health",
                    "Forbidden: the GPU has a reported fault; repair it with POST "
                    f"/apis/{TESSERA_GROUP}/v1/gpudevices/{name}/repair (tessera gpu repair)",
                )
            ],
            group=TESSERA_GROUP,
        )
    rv = next_resource_version(session)
    session.execute(
        update(gpus_t).where(gpus_t.c.name == name).values(health=health, resource_version=rv)
    )
    updated = {**row, "health": health, "resource_version": rv}
    _log_gpu(session, updated, row, "MODIFIED", before=row)
    return updated


# --- capacity -------------------------------------------------------------------------------


def placeable(row: Row) -> bool:
    """New fragments may be placed on the GPU: Healthy, and no NoSchedule or NoExecute taint."""
    return row["health"] == "Healthy" and not any(
        t.get("effect") in ("NoSchedule", "NoExecute") for t in row.get("taints") or ()
    )


def reserve(session: Session, *, pod: Row, node_name: str, gpus: list[GPUShare]) -> None:
    """Take the pod's CPU, memory and GPU fragments from `node_name`, or raise Conflict."""
    node = session.execute(select(nodes_t).where(nodes_t.c.name == node_name)).mappings().first()
    rows = (
        {
            r["name"]: r
            for r in session.execute(
                select(gpus_t).where(gpus_t.c.name.in_([g.gpu for g in gpus]))
            ).mappings()
        }
        if gpus
        else {}
    )
    _check_target(pod, node, node_name, rows, gpus)
    try:
        updated, gpu_rows = _move_capacity(
            session,
            node_name,
            cpu_milli=-pod["cpu_milli"],
            memory_mib=-pod["memory_mib"],
            shares=[(g.gpu, -g.memory_mib, -g.core_pct) for g in gpus],
        )
    except IntegrityError as exc:
        if not is_check_violation(exc):
            raise
        raise _no_room(pod, node_name, gpus) from exc
    if gpus:
        session.execute(
            allocations_t.insert(),
            [
                {
                    "pod_uid": pod["uid"],
                    "gpu_name": g.gpu,
                    "vram_mib": g.memory_mib,
                    "core_pct": g.core_pct,
                }
                for g in gpus
            ],
        )
    all_gpus = gpus_of(session, [node_name]).get(node_name, [])
    _log_node(session, updated, all_gpus, "MODIFIED")
    for gpu_row in gpu_rows:
        _log_gpu(session, gpu_row, updated, "MODIFIED")


def _check_target(
    pod: Mapping[Any, Any],
    node: Mapping[Any, Any] | None,
    node_name: str,
    rows: Mapping[Any, Mapping[Any, Any]],
    gpus: Sequence[GPUShare],
) -> None:
    """Refuse a binding of `pod` to `node` (its row, None if there is no such node) and the GPU
    fragments `gpus` (`rows`: the rows of those GPUs) that no free capacity could make right: no
    such node, cordoned or not ready, the wrong compute class, or shares that do not match the
    pod's request or the GPUs."""
    name = pod["name"]
    if node is None:
        raise invalid(
            "Binding", name, [Cause("target.name", f'Invalid value: "{node_name}": no such node')]
        )
    if node["unschedulable"] or not node["ready"]:
        raise Conflict(
            f'node "{node_name}" is cordoned or not ready: choose another node',
            ref=ResourceRef("pods", name),
        )
    if pod["compute_class"] not in node["compute_classes"].split(","):
        raise Conflict(
            f'node "{node_name}" does not serve compute class "{pod["compute_class"]}" (it serves {node["compute_classes"]})',
            ref=ResourceRef("pods", name),
        )
    problems: list[str] = []
    if len({g.gpu for g in gpus}) != len(gpus):
        problems.append("a GPU is listed twice")
    if pod["gpu_count"]:
        if len(gpus) != pod["gpu_count"]:
            problems.append(
                f"the pod asks for {pod['gpu_count']} whole GPU(s), the binding gives {len(gpus)}"
            )
    elif pod["gpu_memory_mib"]:
        if len(gpus) != 1:
            problems.append("a slice takes exactly one GPU")
    elif gpus:
        problems.append("the pod asks for no GPU")
    for share in gpus:
        row = rows.get(share.gpu)
        if row is None or row["node_name"] != node_name:
            problems.append(f'GPU "{share.gpu}" is not on node "{node_name}"')
            continue
        if row["health"] != "Healthy":
            problems.append(f'GPU "{share.gpu}" is unhealthy')
        elif not placeable(row):
            keys = ", ".join(t["key"] for t in row["taints"])
            problems.append(f'GPU "{share.gpu}" is tainted ({keys}): nothing new is placed on it')
        if pod["gpu_model"] and row["model"] != pod["gpu_model"]:
            problems.append(
                f'GPU "{share.gpu}" is a {row["model"]}, the pod asks for {pod["gpu_model"]}'
            )
        if pod["gpu_count"] and (share.memory_mib, share.core_pct) != (row["vram_mib"], 100):
            problems.append(
                f'a whole GPU takes all of "{share.gpu}" ({format_mib(row["vram_mib"])}, 100%)'
            )
        if pod["gpu_memory_mib"] and (share.memory_mib, share.core_pct) != (
            pod["gpu_memory_mib"],
            pod["gpu_core_pct"],
        ):
            problems.append(
                f"the slice is {format_mib(pod['gpu_memory_mib'])} + {pod['gpu_core_pct']}%, the binding gives {format_mib(share.memory_mib)} + {share.core_pct}%"
            )
    if problems:
        raise invalid(
            "Binding",
            name,
            [
                Cause(
                    "metadata.annotations.tessera.io/gpu-allocation",
                    "Invalid value: " + "; ".join(problems),
                )
            ],
        )


def _no_room(pod: Mapping[Any, Any], node_name: str, gpus: Sequence[GPUShare]) -> Conflict:
    wanted = f"{format_cpu(pod['cpu_milli'])} CPU / {format_mib(pod['memory_mib'])}"
    if gpus:
        wanted += " and " + ", ".join(
            f"{format_mib(g.memory_mib)} + {g.core_pct}% of {g.gpu}" for g in gpus
        )
    return Conflict(
        f'node "{node_name}" does not have {wanted} free any more: the placement is stale, schedule again',
        ref=ResourceRef("pods", pod["name"]),
    )


Target = tuple[Mapping[Any, Any], str, Sequence[GPUShare]]  # (pod row, node name, GPU fragments)


@dataclass(frozen=True)
class Known:
    """Rows a caller read before its write (the scheduler keeps the pool's and the pending
    pods'), by key: pods by uid, nodes and GPUs by name, and the names of each node's GPUs."""

    pods: Mapping[str, Row]
    nodes: Mapping[str, Row]
    gpus: Mapping[str, Row]
    node_gpus: Mapping[str, Collection[str]]

    def targets(self, node_names: Sequence[str]) -> tuple[dict[str, Row], dict[str, Row]]:
        """The known rows of these nodes and of all their GPUs."""
        nodes = {n: self.nodes[n] for n in node_names if n in self.nodes}
        gpus = {g: self.gpus[g] for n in nodes for g in self.node_gpus.get(n, ())}
        return nodes, gpus


def unchanged(current: Mapping[Any, Row], known: Mapping[Any, Row]) -> bool:
    """Whether `locked_rows` found exactly the `known` rows, every one still current."""
    return len(current) == len(known) and all(known.get(k) is row for k, row in current.items())


def locked_rows(
    session: Session,
    target: Table,
    key: str,
    keys: Sequence[Any],
    known: Mapping[Any, Row] | None,
    *,
    where: Any = None,
) -> dict[Any, Row]:
    """Lock the rows of `target` whose `key` is in `keys` (or that match `where`), in key
    order, and return them by key. With `known` rows read before, only the keys and
    resourceVersions are read under the lock: a known row at the same version is current (every
    write of these tables takes a new version) and is used as it is; the others are read whole."""
    column = target.c[key]
    condition = column.in_(keys) if where is None else where
    if known is None:
        query = select(target).where(condition).order_by(column).with_for_update()
        return {r[key]: r for r in session.execute(query).mappings()}
    query = select(column, target.c.resource_version).where(condition).order_by(column)
    current: dict[Any, int] = {k: v for k, v in session.execute(query.with_for_update())}
    rows = {
        k: known[k]
        for k, version in current.items()
        if k in known and known[k]["resource_version"] == version
    }
    stale = [k for k in current if k not in rows]
    if stale:
        query = select(target).where(column.in_(stale))
        rows.update((r[key], r) for r in session.execute(query).mappings())
    return rows


def lock_targets(
    session: Session, node_names: Sequence[str], known: Known | None
) -> tuple[dict[str, Row], dict[str, Row]]:
    """Lock the rows of these nodes and of all their GPUs (`locked_rows`); both by name."""
    nodes = locked_rows(session, nodes_t, "name", node_names, known.nodes if known else None)
    gpus = locked_rows(
        session,
        gpus_t,
        "name",
        [],
        known.gpus if known else None,
        where=gpus_t.c.node_name.in_(node_names),
    )
    return nodes, gpus


@dataclass
class Reservation:
    """Bindings' capacity worked out from rows (`plan_reservations`): each group's outcome, the
    nodes and GPUs it changes as they will be (their rows with the new free amounts, and their
    API objects for watchers) and the GPU fragments to insert. `write_reservation` writes it,
    giving every changed object its resourceVersion."""

    outcomes: list[Conflict | Invalid | None]
    nodes: dict[str, dict[str, Any]]
    gpus: dict[str, dict[str, Any]]
    node_objects: dict[str, dict[str, Any]]
    gpu_objects: dict[str, dict[str, Any]]
    fragments: list[dict[str, Any]]


def plan_reservations(
    groups: Sequence[Sequence[Target]], nodes: Mapping[str, Row], gpus: Mapping[str, Row]
) -> Reservation:
    """`reserve` for many bindings at once, worked out from these rows (`nodes`: the named
    ones; `gpus`: all of theirs) without a session; `write_reservation` writes it. Each group
    (a gang's members, or one pod) is reserved whole or not at all: a group that fails a check
    of `reserve`, or no longer fits what the earlier groups left, gets that error (and takes
    nothing); the others go on."""
    free_nodes = {name: dict(row) for name, row in nodes.items()}
    free_gpus = {name: dict(row) for name, row in gpus.items()}
    outcomes: list[Conflict | Invalid | None] = []
    touched_nodes: set[str] = set()
    touched_gpus: set[str] = set()
    fragments: list[dict[str, Any]] = []
    for group in groups:
        node_free: dict[str, tuple[int, int]] = {}
        gpu_free: dict[str, tuple[int, int]] = {}
        try:
            for pod, node_name, shares in group:
                node = free_nodes.get(node_name)
                _check_target(pod, node, node_name, free_gpus, shares)
                assert node is not None
                cpu, memory = node_free.get(
                    node_name, (node["cpu_free_milli"], node["memory_free_mib"])
                )
                cpu, memory = cpu - pod["cpu_milli"], memory - pod["memory_mib"]
                taken = []
                for share in shares:
                    gpu = free_gpus[share.gpu]
                    vram, core = gpu_free.get(
                        share.gpu, (gpu["vram_free_mib"], gpu["core_free_pct"])
                    )
                    taken.append((share.gpu, vram - share.memory_mib, core - share.core_pct))
                if cpu < 0 or memory < 0 or any(v < 0 or c < 0 for _, v, c in taken):
                    raise _no_room(pod, node_name, shares)
                node_free[node_name] = (cpu, memory)
                gpu_free.update((gpu, (v, c)) for gpu, v, c in taken)
        except (Conflict, Invalid) as exc:
            outcomes.append(exc)
            continue
        outcomes.append(None)
        for node_name, (cpu, memory) in node_free.items():
            free_nodes[node_name].update(cpu_free_milli=cpu, memory_free_mib=memory)
        for gpu_name, (vram, core) in gpu_free.items():
            free_gpus[gpu_name].update(vram_free_mib=vram, core_free_pct=core)
        touched_nodes.update(node_free)
        touched_gpus.update(gpu_free)
        fragments += [
            {
                "pod_uid": pod["uid"],
                "gpu_name": s.gpu,
                "vram_mib": s.memory_mib,
                "core_pct": s.core_pct,
            }
            for pod, _, shares in group
            for s in shares
        ]
    of_node: dict[str, list[dict[str, Any]]] = {}
    for gpu in sorted(free_gpus.values(), key=lambda g: (g["node_name"], g["index"])):
        of_node.setdefault(gpu["node_name"], []).append(gpu)
    changed_nodes = {name: free_nodes[name] for name in sorted(touched_nodes)}
    changed_gpus = {name: free_gpus[name] for name in sorted(touched_gpus)}
    return Reservation(
        outcomes,
        changed_nodes,
        changed_gpus,
        {name: node_to_api(row, of_node.get(name, [])) for name, row in changed_nodes.items()},
        {
            name: gpu_to_api(_located(row, free_nodes[row["node_name"]]))
            for name, row in changed_gpus.items()
        },
        fragments,
    )


def write_reservation(session: Session, reservation: Reservation) -> None:
    """Write a planned reservation: each changed node and GPU once (its final free amounts)
    at a new resourceVersion, the fragments, and each changed object logged once for watchers;
    the rows of nodes and GPUs must be locked."""
    if not reservation.nodes:
        return
    for rows, objects in (
        (reservation.nodes, reservation.node_objects),
        (reservation.gpus, reservation.gpu_objects),
    ):
        for name, row in rows.items():
            rv = next_resource_version(session)
            row["resource_version"] = rv
            objects[name]["metadata"]["resourceVersion"] = str(rv)
    # Written as the transaction commits, with its other rows (one round trip): the rows are
    # locked, and nothing reads them back. The CHECK constraints still stand behind the arithmetic.
    defer_update(
        session,
        nodes_t,
        "name",
        ("cpu_free_milli", "memory_free_mib", "resource_version"),
        list(reservation.nodes.values()),
    )
    defer_update(
        session,
        gpus_t,
        "name",
        ("vram_free_mib", "core_free_pct", "resource_version"),
        list(reservation.gpus.values()),
    )
    for fragment in reservation.fragments:
        defer_insert(session, allocations_t, fragment)
    for kind, objects, selectable in (
        ("Node", reservation.node_objects, NODE_FIELD_SELECTORS),
        ("GPUDevice", reservation.gpu_objects, GPU_FIELD_SELECTORS),
    ):
        for name, obj in objects.items():
            record_change(
                session,
                {
                    "resource_version": int(obj["metadata"]["resourceVersion"]),
                    "kind": kind,
                    "namespace": None,
                    "name": name,
                    "tenant_id": None,
                    "type": "MODIFIED",
                    "object": obj,
                },
                selectable=selectable,
            )


def release(session: Session, *, pod: Row) -> None:
    """Give a bound pod's capacity back to its node and GPUs."""
    node_name = pod["node_name"]
    shares = list(
        session.execute(
            select(allocations_t).where(allocations_t.c.pod_uid == pod["uid"])
        ).mappings()
    )
    updated, gpu_rows = _move_capacity(
        session,
        node_name,
        cpu_milli=pod["cpu_milli"],
        memory_mib=pod["memory_mib"],
        shares=[(share["gpu_name"], share["vram_mib"], share["core_pct"]) for share in shares],
    )
    session.execute(delete(allocations_t).where(allocations_t.c.pod_uid == pod["uid"]))
    _log_node(session, updated, gpus_of(session, [node_name]).get(node_name, []), "MODIFIED")
    for gpu_row in gpu_rows:
        _log_gpu(session, gpu_row, updated, "MODIFIED")


def resize(session: Session, *, pod: Row, cpu_milli: int, memory_mib: int) -> Row | None:
    """Change what a bound pod holds of its node's CPU and memory to `cpu_milli` / `memory_mib`
    if the node has the room; returns the node row, or None (nothing written) when it has not.

    One conditional UPDATE: the node's row lock orders it with concurrent binds and resizes
    (PostgreSQL re-checks the condition on the row it waited for), and the CHECK constraints
    would refuse an over-allocation anyway. A shrink always fits."""
    node_name = pod["node_name"]
    more_cpu = cpu_milli - pod["cpu_milli"]
    more_memory = memory_mib - pod["memory_mib"]
    node = (
        session.execute(
            update(nodes_t)
            .where(
                nodes_t.c.name == node_name,
                nodes_t.c.cpu_free_milli >= more_cpu,
                nodes_t.c.memory_free_mib >= more_memory,
            )
            .values(
                cpu_free_milli=nodes_t.c.cpu_free_milli - more_cpu,
                memory_free_mib=nodes_t.c.memory_free_mib - more_memory,
                resource_version=next_resource_version(session),
            )
            .returning(*nodes_t.c)
        )
        .mappings()
        .first()
    )
    if node is None:
        return None
    _log_node(session, node, gpus_of(session, [node_name]).get(node_name, []), "MODIFIED")
    return node


def _move_capacity(
    session: Session,
    node_name: str,
    *,
    cpu_milli: int,
    memory_mib: int,
    shares: Sequence[tuple[str, int, int]],
) -> tuple[Row, list[Row]]:
    """Add to a node's free CPU and memory and to its GPUs' free VRAM and SM % (negative amounts
    take). The database's CHECK constraints refuse a result below zero or above the total with
    an IntegrityError; a GPU taken from must still be healthy."""
    node = (
        session.execute(
            update(nodes_t)
            .where(nodes_t.c.name == node_name)
            .values(
                cpu_free_milli=nodes_t.c.cpu_free_milli + cpu_milli,
                memory_free_mib=nodes_t.c.memory_free_mib + memory_mib,
                resource_version=next_resource_version(session),
            )
            .returning(*nodes_t.c)
        )
        .mappings()
        .one()
    )
    gpu_rows: list[Row] = []
    for gpu, vram_mib, core_pct in shares:
        query = update(gpus_t).where(gpus_t.c.name == gpu)
        if vram_mib < 0 or core_pct < 0:
            query = query.where(gpus_t.c.health == "Healthy")
        row = (
            session.execute(
                query.values(
                    vram_free_mib=gpus_t.c.vram_free_mib + vram_mib,
                    core_free_pct=gpus_t.c.core_free_pct + core_pct,
                    resource_version=next_resource_version(session),
                ).returning(*gpus_t.c)
            )
            .mappings()
            .first()
        )
        if row is None:
            raise Conflict(f'GPU "{gpu}" turned unhealthy: schedule again')
        gpu_rows.append(row)
    return node, gpu_rows


# --- shapes ---------------------------------------------------------------------------------


# Labels every Kubernetes node carries (the kubelet sets them); an inventory may override them.
NODE_DEFAULT_LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


def node_to_api(row: Row, gpus: Sequence[Row]) -> dict[str, Any]:
    labels = {**NODE_DEFAULT_LABELS, **row["labels"]}
    healthy = [g for g in gpus if g["health"] == "Healthy"]
    capacity = {
        CPU: format_cpu(row["cpu_capacity_milli"]),
        MEMORY: format_mib(row["memory_capacity_mib"]),
        "pods": "1000",
    }
    allocatable = {
        CPU: format_cpu(row["cpu_allocatable_milli"]),
        MEMORY: format_mib(row["memory_allocatable_mib"]),
        "pods": "1000",
    }
    if gpus:
        capacity[GPU] = str(len(gpus))
        capacity[GPU_MEMORY] = format_mib(sum(g["vram_mib"] for g in gpus))
        capacity[GPU_CORE] = str(100 * len(gpus))
        allocatable[GPU] = str(len(healthy))
        allocatable[GPU_MEMORY] = format_mib(sum(g["vram_mib"] for g in healthy))
        allocatable[GPU_CORE] = str(100 * len(healthy))
    annotations = dict(row["annotations"])
    annotations[ANNOTATION_FREE_CPU] = format_cpu(row["cpu_free_milli"])
    annotations[ANNOTATION_FREE_MEMORY] = format_mib(row["memory_free_mib"])
    if gpus:
        annotations[ANNOTATION_FREE_GPUS] = str(
            sum(
                1
                for g in healthy
                if g["core_free_pct"] == 100 and g["vram_free_mib"] == g["vram_mib"]
            )
        )
        annotations[ANNOTATION_FREE_GPU_MEMORY] = format_mib(
            sum(g["vram_free_mib"] for g in healthy)
        )
    spec: dict[str, Any] = {}
    if row["unschedulable"]:
        spec["unschedulable"] = True
        spec["taints"] = [
            {
                "key": "node.kubernetes.io/unschedulable",
                "effect": "NoSchedule",
                "timeAdded": timestamp(row["created_at"]),
            }
        ]
    created = timestamp(row["created_at"])
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": row["name"],
            "uid": row["uid"],
            "resourceVersion": str(row["resource_version"]),
            "creationTimestamp": created,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [_ready_condition(row, created)],
            "addresses": [{"type": "Hostname", "address": row["name"]}],
            "nodeInfo": {
                "kubeletVersion": "v1.32.0-tessera",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "tessera://1",
                "operatingSystem": labels["kubernetes.io/os"],
                "architecture": labels["kubernetes.io/arch"],
                "osImage": "Tessera",
                "kernelVersion": "",
                "machineID": "",
                "systemUUID": row["uid"],
                "bootID": "",
            },
        },
    }


def _ready_condition(row: Row, created: str | None) -> dict[str, Any]:
    lost = row.get("lost_since")
    if lost is not None:
        return {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Tessera stopped hearing from the node's agent: its Lease in "
            "kube-node-lease expired; nothing new is placed here, and its pods fail with reason "
            "NodeLost unless it comes back in time",
            "lastHeartbeatTime": created,
            "lastTransitionTime": timestamp(lost),
        }
    return {
        "type": "Ready",
        "status": "True" if row["ready"] else "False",
        "reason": "TesseraNodeReady" if row["ready"] else "TesseraNodeNotReady",
        "message": "node is ready" if row["ready"] else "node is not ready",
        "lastHeartbeatTime": created,
        "lastTransitionTime": created,
    }


def set_lost(session: Session, name: str, *, since: datetime | None) -> bool:
    """Mark an agent-managed node lost (`since`: when its lease expired; Ready=Unknown, the
    scheduler places nothing on it) or back (None: Ready again). False when nothing changed."""
    row = (
        session.execute(select(nodes_t).where(nodes_t.c.name == name).with_for_update())
        .mappings()
        .first()
    )
    if row is None or (row["lost_since"] is None) == (since is None):
        return False
    changes = {
        "lost_since": since,
        "ready": since is None,
        "resource_version": next_resource_version(session),
    }
    session.execute(update(nodes_t).where(nodes_t.c.name == name).values(**changes))
    gpus = gpus_of(session, [name]).get(name, [])
    _log_node(session, {**row, **changes}, gpus, "MODIFIED", before=node_to_api(row, gpus))
    return True


def gpu_to_api(row: Row, pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = {
        LABEL_GPU_MODEL: row["model"],
        LABEL_HOSTNAME: row["node_name"],
    }
    for key, column in ((LABEL_ZONE, "zone"), (LABEL_REGION, "region"), (LABEL_RACK, "rack")):
        if row.get(column):
            labels[key] = row[column]
    if row["nvlink_domain"]:
        labels[LABEL_NVLINK_DOMAIN] = row["nvlink_domain"]
    status: dict[str, Any] = {
        "health": row["health"],
        "free": {"memory": format_mib(row["vram_free_mib"]), "corePercent": row["core_free_pct"]},
        "allocated": {
            "memory": format_mib(row["vram_mib"] - row["vram_free_mib"]),
            "corePercent": 100 - row["core_free_pct"],
        },
    }
    if pods is not None:
        status["pods"] = pods
    if row.get("faults"):
        status["faults"] = row["faults"]
    return {
        "apiVersion": f"{TESSERA_GROUP}/v1",
        "kind": "GPUDevice",
        "metadata": {
            "name": row["name"],
            "uid": row["uid"],
            "resourceVersion": str(row["resource_version"]),
            "creationTimestamp": timestamp(row["created_at"]),
            "labels": labels,
        },
        "spec": {
            "nodeName": row["node_name"],
            "index": row["index"],
            "model": row["model"],
            "memory": format_mib(row["vram_mib"]),
            "smCount": row["sm_count"],
            "numaNode": row["numa_node"],
            "pcieSwitch": row["pcie_switch"],
            "nvlinkDomain": row["nvlink_domain"],
            "rdmaNic": row["rdma_nic"],
            **({"uuid": row["uuid"]} if row.get("uuid") else {}),
            **({"taints": row["taints"]} if row.get("taints") else {}),
        },
        "status": status,
    }


def _log_node(
    session: Session,
    row: Row,
    gpus: Sequence[Row],
    event_type: str,
    *,
    before: dict[str, Any] | None = None,
) -> None:
    record_change(
        session,
        {
            "resource_version": row["resource_version"],
            "kind": "Node",
            "namespace": None,
            "name": row["name"],
            "tenant_id": None,
            "type": event_type,
            "object": node_to_api(row, gpus),
        },
        before=before,
        selectable=NODE_FIELD_SELECTORS,
    )


def log_gpu_change(session: Session, row: Row, *, before: Row) -> None:
    """Log a GPU's change (its health, taints or faults) for watchers, and its node's: the
    node's allocatable GPUs count only the healthy ones."""
    node = (
        session.execute(
            update(nodes_t)
            .where(nodes_t.c.name == row["node_name"])
            .values(resource_version=next_resource_version(session))
            .returning(*nodes_t.c)
        )
        .mappings()
        .one()
    )
    _log_gpu(session, row, node, "MODIFIED", before=before)
    _log_node(session, node, gpus_of(session, [node["name"]]).get(node["name"], []), "MODIFIED")


def _located(gpu: Row, node: Row) -> dict[str, Any]:
    """A GPU's row with its node's place (zone, region, rack), as `gpu_to_api` labels it."""
    return {**gpu, **{key: node.get(key, "") for key in ("zone", "region", "rack")}}


def _log_gpu(
    session: Session, row: Row, node: Row, event_type: str, *, before: Row | None = None
) -> None:
    record_change(
        session,
        {
            "resource_version": row["resource_version"],
            "kind": "GPUDevice",
            "namespace": None,
            "name": row["name"],
            "tenant_id": None,
            "type": event_type,
            "object": gpu_to_api(_located(row, node)),
        },
        before=gpu_to_api(_located(before, node)) if before is not None else None,
        selectable=GPU_FIELD_SELECTORS,
    )


__all__ = ["GPUShare", "GPUSpec", "Invalid", "NodeSpec"]
