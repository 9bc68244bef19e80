"""The views of an answer a client may ask for in `Accept`, as the Kubernetes API serves them.

- `application/json;as=Table;v=v1;g=meta.k8s.io`: server-side printing. `kubectl get` prints the
  Table's rows; columns with priority 0 are shown by default, priority 1 only with `-o wide`.
- `application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io` (a list) and
  `...;as=PartialObjectMetadata;...` (one object, or each object of a watch): only the metadata,
  what metadata-only informers and garbage collectors read.
- anything else: the object itself, as JSON. A client that asks only for a view this server does
  not have (another group or version, a list view of one object) gets `406 Not Acceptable`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from app.constants import (
    ANNOTATION_GPU_ALLOCATION,
    ANNOTATION_POD_USE_SPEC,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    LABEL_ZONE,
)

TABLE_MEDIA_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"
Column = tuple[str, str, str, int]  # name, type, description, priority
Obj = dict[str, Any]


TABLE = "Table"
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST_MEDIA_TYPE = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
PARTIAL_MEDIA_TYPE = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
MAX_ACCEPT_ITEMS = 32
_PLAIN = {"application/json", "application/*", "*/*", "*", "application/yaml", ""}


def negotiate(accept: str | None, *, is_list: bool, watch: bool = False) -> str:
    """The view the client asked for: `TABLE`, `PARTIAL` or "" (the object itself).

    The media types of `Accept` are taken in order; the first this server can answer wins."""
    if not accept:
        return ""
    asked_for_a_view = False
    for item in accept.split(",")[:MAX_ACCEPT_ITEMS]:
        media, _, raw = item.partition(";")
        params: dict[str, str] = {}
        for part in raw.split(";"):
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip()
        view = params.get("as")
        if view is None:
            if media.strip().lower() in _PLAIN:
                return ""
            continue
        asked_for_a_view = True
        if params.get("g") != "meta.k8s.io" or params.get("v") != "v1":
            continue
        if view == TABLE:
            return TABLE
        if view == "PartialObjectMetadataList" and (is_list or watch):
            return PARTIAL
        if view == PARTIAL and (not is_list or watch):
            return PARTIAL
    if asked_for_a_view:
        from app.errors import NotAcceptable

        raise NotAcceptable(
            "only the following media types are accepted: application/json, "
            f"{TABLE_MEDIA_TYPE}, " + (PARTIAL_LIST_MEDIA_TYPE if is_list else PARTIAL_MEDIA_TYPE)
        )
    return ""


def partial(obj: Obj) -> Obj:
    """One object as `PartialObjectMetadata`, or a list as `PartialObjectMetadataList`."""
    if obj.get("kind", "").endswith("List") and "items" in obj:
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {},
            "items": [partial(item) for item in obj["items"]],
        }
    return {"kind": PARTIAL, "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def human_duration(seconds: float) -> str:
    """Kubernetes' short ages: 5s, 3m2s, 4h, 2d3h, 400d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


def age(timestamp: str | None, now: datetime | None = None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration(((now or datetime.now(UTC)) - then).total_seconds())


# --- pods -----------------------------------------------------------------------------------

POD_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the pod.", 0),
    ("Ready", "string", "Ready containers / all containers.", 0),
    ("Status", "string", "The pod's phase or reason.", 0),
    ("Restarts", "string", "Container restarts.", 0),
    ("Age", "string", "Time since creation.", 0),
    ("Spec", "string", "The sold compute spec (tessera.io/pod-use-spec).", 1),
    ("GPU", "string", "Whole GPUs or the GPU slice asked for.", 1),
    ("Node", "string", "The node the pod runs on.", 1),
    ("Nominated Node", "string", "Node nominated by preemption.", 1),
    ("Readiness Gates", "string", "Readiness gates.", 1),
]


def pod_status(pod: Obj) -> str:
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    if status.get("reason"):
        return str(status["reason"])
    for condition in status.get("conditions") or []:
        if (
            condition["type"] == "PodScheduled"
            and condition["status"] == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return "Pending"
    return str(status.get("phase", "Unknown"))


def pod_gpu(pod: Obj) -> str:
    """`2x GPU`, or a slice as `VRAM/SM%`: as placed (the allocation annotation) once it is, so a
    share that followed from the GPU's model shows what the pod got; as asked before."""
    limits: dict[str, Any] = {}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        for source in (resources.get("requests") or {}, resources.get("limits") or {}):
            for key in (GPU, GPU_MEMORY, GPU_CORE):
                if key in source:
                    limits[key] = source[key]
    if GPU in limits:
        return f"{limits[GPU]}x GPU"
    placed = _allocation(pod)
    if placed:
        memory = sum(int(part.get("memoryMiB", 0)) for part in placed)
        return f"{_mebibytes(memory)}/{sum(int(p.get('corePercent', 0)) for p in placed)}%"
    if GPU_CORE in limits:
        return f"{limits.get(GPU_MEMORY, '-')}/{limits[GPU_CORE]}%"
    if GPU_MEMORY in limits:
        return str(limits[GPU_MEMORY])  # its SM share follows from the GPU it is placed on
    return "<none>"


def _allocation(pod: Obj) -> list[dict[str, Any]]:
    text = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_GPU_ALLOCATION)
    if not text:
        return []
    try:
        parts = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _mebibytes(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def pod_row(pod: Obj) -> list[Any]:
    status = pod.get("status") or {}
    containers = pod["spec"].get("containers", [])
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        pod_status(pod),
        str(restarts),
        age(pod["metadata"].get("creationTimestamp")),
        (pod["metadata"].get("annotations") or {}).get(ANNOTATION_POD_USE_SPEC, "<none>"),
        pod_gpu(pod),
        pod["spec"].get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        _readiness_gates(pod),
    ]


def _readiness_gates(pod: Obj) -> str:
    """`ready/all` of the pod's readiness gates, as kubectl prints them."""
    gates = [g.get("conditionType") for g in pod["spec"].get("readinessGates") or []]
    if not gates:
        return "<none>"
    true = {
        c["type"]
        for c in (pod.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    return f"{sum(1 for g in gates if g in true)}/{len(gates)}"


# --- nodes ----------------------------------------------------------------------------------

NODE_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the node.", 0),
    ("Status", "string", "Ready, and whether it is cordoned.", 0),
    ("Roles", "string", "Compute classes the node serves.", 0),
    ("Age", "string", "Time since registration.", 0),
    ("Version", "string", "Node agent version.", 0),
    ("GPU", "string", "GPU model x count.", 1),
    ("Free GPU", "string", "Whole GPUs free.", 1),
    ("CPU Free", "string", "Free vCPU.", 1),
    ("Zone", "string", "Zone.", 1),
    ("Rack", "string", "Rack.", 1),
]


def node_row(node: Obj) -> list[Any]:
    labels = node["metadata"].get("labels") or {}
    annotations = node["metadata"].get("annotations") or {}
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
    )
    status = "Ready" if ready else "NotReady"
    if node["spec"].get("unschedulable"):
        status += ",SchedulingDisabled"
    gpus = node["status"]["capacity"].get(GPU)
    return [
        node["metadata"]["name"],
        status,
        labels.get("tessera.io/compute-class", "<none>").replace("_", ","),
        age(node["metadata"].get("creationTimestamp")),
        node["status"].get("nodeInfo", {}).get("kubeletVersion", ""),
        f"{labels.get('tessera.io/gpu-model', '?')}x{gpus}" if gpus else "<none>",
        annotations.get("tessera.io/free-gpus", "<none>"),
        annotations.get("tessera.io/free-cpu", ""),
        labels.get(LABEL_ZONE, "<none>"),
        labels.get("tessera.io/rack", "<none>"),
    ]


# --- GPUs -----------------------------------------------------------------------------------

GPU_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the GPU.", 0),
    ("Node", "string", "Node it is in.", 0),
    ("Model", "string", "GPU model.", 0),
    ("VRAM Free", "string", "Free / total VRAM.", 0),
    ("SM Free", "string", "Free share of the SMs.", 0),
    ("Health", "string", "Healthy or Unhealthy.", 0),
    ("Last Fault", "string", "The last fault reported, how long ago, and if repaired.", 0),
    ("Pods", "string", "Pods holding part of it (your own only).", 0),
    ("Taints", "string", "Device taints (key:effect): NoExecute a fault, NoSchedule a drain.", 1),
    ("NVLink Domain", "string", "NVLink domain.", 1),
    ("NUMA", "string", "NUMA node.", 1),
    ("Age", "string", "Time since registration.", 1),
]


def last_fault(faults: list[Obj] | None) -> str:
    """ "xid 79 (3m)", "ecc (2h, repaired)", or "<none>"."""
    if not faults:
        return "<none>"
    fault = faults[-1]
    what = fault["kind"] + (f" {fault['xid']}" if fault.get("xid") is not None else "")
    when = age(fault.get("time"))
    return f"{what} ({when}, repaired)" if fault.get("repairedTime") else f"{what} ({when})"


def gpu_row(gpu: Obj) -> list[Any]:
    status, spec = gpu["status"], gpu["spec"]
    pods = status.get("pods")
    return [
        gpu["metadata"]["name"],
        spec["nodeName"],
        spec["model"],
        f"{status['free']['memory']}/{spec['memory']}",
        f"{status['free']['corePercent']}%",
        status["health"],
        last_fault(status.get("faults")),
        ",".join(f"{p['namespace']}/{p['name']}" for p in pods) if pods else "<none>",
        ",".join(f"{t['key']}:{t['effect']}" for t in spec.get("taints") or ()) or "<none>",
        spec.get("nvlinkDomain") or "<none>",
        str(spec.get("numaNode", 0)),
        age(gpu["metadata"].get("creationTimestamp")),
    ]


# --- the rest -------------------------------------------------------------------------------

NAMESPACE_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the namespace.", 0),
    ("Status", "string", "Active or Terminating.", 0),
    ("Age", "string", "Time since creation.", 0),
]


def namespace_row(ns: Obj) -> list[Any]:
    return [
        ns["metadata"]["name"],
        ns["status"]["phase"],
        age(ns["metadata"].get("creationTimestamp")),
    ]


EVENT_COLUMNS: list[Column] = [
    ("Last Seen", "string", "Time since the event last happened.", 0),
    ("Type", "string", "Normal or Warning.", 0),
    ("Reason", "string", "Short reason.", 0),
    ("Object", "string", "What it is about.", 0),
    ("Message", "string", "What happened.", 0),
]


def event_row(event: Obj) -> list[Any]:
    involved = event["involvedObject"]
    return [
        age(event.get("lastTimestamp")),
        event["type"],
        event["reason"],
        f"{involved['kind'].lower()}/{involved['name']}",
        event["message"],
    ]


PODGROUP_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the pod group.", 0),
    ("Min", "string", "Pods placed together (spec.minMember).", 0),
    ("Members", "string", "Pods in the group.", 0),
    ("Scheduled", "string", "Members placed.", 0),
    ("Status", "string", "Pending, Waiting, Scheduled or Running.", 0),
    ("Topology", "string", "Required (and preferred) topology level.", 0),
    ("Age", "string", "Time since creation.", 0),
]


def podgroup_row(group: Obj) -> list[Any]:
    topology = group["spec"].get("topology") or {}
    level = topology.get("required") or "<none>"
    if topology.get("preferred"):
        level += f" (prefer {topology['preferred']})"
    status = group["status"]
    return [
        group["metadata"]["name"],
        str(group["spec"]["minMember"]),
        str(status["members"]),
        str(status["scheduled"]),
        status["phase"],
        level,
        age(group["metadata"].get("creationTimestamp")),
    ]


TENANT_COLUMNS: list[Column] = [
    ("Name", "string", "Tenant.", 0),
    ("Age", "string", "Time since creation.", 0),
]


def tenant_row(tenant: Obj) -> list[Any]:
    return [tenant["metadata"]["name"], age(tenant["metadata"].get("creationTimestamp"))]


PRICE_COLUMNS: list[Column] = [
    ("Name", "string", "Price version.", 0),
    ("Effective", "string", "When it takes effect (UTC).", 0),
    ("Phase", "string", "Scheduled, Active or Superseded.", 0),
    ("BestEffort", "string", "Fraction of list price BestEffort pods pay.", 0),
    ("Tiers", "string", "Commitment tiers: minimum per day -> discount.", 1),
    ("Warnings", "string", "A rate of 0, or more than 10x off the version before.", 0),
    ("Age", "string", "Time since creation.", 0),
]


def price_row(price: Obj) -> list[Any]:
    spec = price["spec"]
    tiers = ", ".join(
        f"{t['minPerDay']}:{t['discount']}" for t in spec.get("commitmentTiers") or []
    )
    return [
        price["metadata"]["name"],
        spec["effectiveFrom"],
        price["status"]["phase"],
        spec["bestEffortFraction"],
        tiers or "<none>",
        "; ".join(price["status"].get("warnings") or []) or "<none>",
        age(price["metadata"].get("creationTimestamp")),
    ]


COMMITMENT_COLUMNS: list[Column] = [
    ("Name", "string", "Plan.", 0),
    ("Amount", "string", "Committed per UTC day.", 0),
    ("Active", "string", "The amount committed today.", 0),
    ("Discount", "string", "Today's discount off list price.", 0),
    ("Next", "string", "A change that takes effect on a later day.", 0),
    ("Saved", "string", "This month so far: list price minus owed (negative: cost more).", 0),
    ("Age", "string", "Time since creation.", 0),
]


def commitment_row(plan: Obj) -> list[Any]:
    """A plan's row; without its status (a watch's event: the change log keeps none) the
    status' cells are <unknown>."""
    status = plan.get("status") or {}
    following = status.get("nextChange")
    amount = plan.get("spec", {}).get("amountPerDay", "")
    return [
        plan["metadata"]["name"],
        f"{amount} {status['currency']}" if "currency" in status else amount,
        status.get("activeAmountPerDay", "<unknown>"),
        status.get("discount", "<unknown>"),
        f"{following['amountPerDay']} from {following['day']}" if following else "<none>",
        status["thisMonth"]["savings"] if "thisMonth" in status else "<none>",
        age(plan["metadata"].get("creationTimestamp")),
    ]


STATEMENT_COLUMNS: list[Column] = [
    ("Name", "string", "The UTC day.", 0),
    ("Phase", "string", "Provisional while the day is open; Closed is final.", 0),
    ("Total", "string", "What is owed for the day.", 0),
    ("Lines", "integer", "Lines on the statement.", 0),
    ("Closed", "string", "When it was closed.", 1),
]


def statement_row(statement: Obj) -> list[Any]:
    status = statement["status"]
    return [
        statement["metadata"]["name"],
        status["phase"],
        f"{status['total']} {status['currency']}",
        len(status["lines"]),
        status.get("closedAt") or "<none>",
    ]


COSCHEDULING_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the pod group.", 0),
    ("Phase", "string", "Pending, Scheduling, Scheduled, Running, Finished or Failed.", 0),
    ("MinMember", "integer", "Pods placed together (spec.minMember).", 0),
    ("Running", "integer", "Members running.", 0),
    ("Succeeded", "integer", "Members that succeeded.", 0),
    ("Failed", "integer", "Members that failed.", 0),
    ("Age", "string", "Time since creation.", 0),
    ("Topology", "string", "The tessera.io/topology-required annotation.", 1),
]


def coscheduling_row(group: Obj) -> list[Any]:
    status = group["status"]
    required = (group["metadata"].get("annotations") or {}).get("tessera.io/topology-required")
    return [
        group["metadata"]["name"],
        status["phase"],
        group["spec"]["minMember"],
        status["running"],
        status["succeeded"],
        status["failed"],
        age(group["metadata"].get("creationTimestamp")),
        required or "<none>",
    ]


PRINTERS: dict[str, tuple[list[Column], Callable[[Obj], list[Any]]]] = {
    "Pod": (POD_COLUMNS, pod_row),
    "Node": (NODE_COLUMNS, node_row),
    "GPUDevice": (GPU_COLUMNS, gpu_row),
    "Namespace": (NAMESPACE_COLUMNS, namespace_row),
    "Event": (EVENT_COLUMNS, event_row),
    "Tenant": (TENANT_COLUMNS, tenant_row),
    "Price": (PRICE_COLUMNS, price_row),
    "Statement": (STATEMENT_COLUMNS, statement_row),
}


def to_table(
    kind: str,
    objects: list[Obj],
    *,
    resource_version: str | None = None,
    continue_token: str | None = None,
    include_object: str = "Metadata",
    columns: bool = True,
) -> Obj:
    definitions, row_of = PRINTERS[kind]
    rows = []
    for obj in objects:
        row: Obj = {"cells": row_of(obj)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    metadata: Obj = {}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if continue_token:
        metadata["continue"] = continue_token
    table: Obj = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "rows": rows,
    }
    if columns:
        table["columnDefinitions"] = [
            {
                "name": name,
                "type": type_,
                "format": "name" if name == "Name" else "",
                "description": description,
                "priority": priority,
            }
            for name, type_, description, priority in definitions
        ]
    else:
        table["columnDefinitions"] = None
    return table


def tabulate(payload: Obj, include_object: str = "Metadata") -> Obj:
    """A list or a single object as a Table (kinds without a printer are returned unchanged)."""
    kind = payload.get("kind", "")
    group = str(payload.get("apiVersion", "")).rpartition("/")[0]
    listed = kind.endswith("List") and "items" in payload
    kind = kind.removesuffix("List") if listed else kind
    if f"{kind}.{group}" in PRINTERS:  # a kind two groups serve: this group's printer
        kind = f"{kind}.{group}"
    if listed and kind in PRINTERS:
        meta = payload.get("metadata") or {}
        return to_table(
            kind,
            payload["items"],
            resource_version=meta.get("resourceVersion"),
            continue_token=meta.get("continue"),
            include_object=include_object,
        )
    if not listed and kind in PRINTERS:
        return to_table(
            kind,
            [payload],
            resource_version=payload["metadata"].get("resourceVersion"),
            include_object=include_object,
        )
    return payload
