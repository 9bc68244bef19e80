"""GPU faults: a GPU that fails is isolated at once and the pods on it are stopped or placed
again; a repair returns its capacity.

The vocabulary is Kubernetes' device taints (KEP-5055): a fault puts a `NoExecute` taint
(`tessera.io/gpu-fault`) on the GPU and marks it Unhealthy, so nothing new is placed there and
the pods holding a fragment of it are evicted; an admin's `NoSchedule` taint (a drain) keeps new
fragments off a GPU without stopping the pods on it. The rest of the node keeps serving.

Each pod holding a fragment (and, for a pod of a gang that reschedules on fault, every running
member of its gang) is told at once: the `DisruptionTarget` condition with reason
`DeletionByDeviceTaintManager` (what Kubernetes' device taint manager writes), naming the GPU and
the fault, and a Warning event `GPUFault`. Its billing ends at the fault second. After
`TESSERA_GPU_FAULT_GRACE_SECONDS` the agent stops it through the same notice machinery as a
preemption (`app.pods.service.end_preempted`): Failed with reason `GPUFault`, or, annotated
`tessera.io/reschedule-on-fault: "true"`, Pending again under its own name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.callbacks import service as callbacks
from app.constants import TAINT_GPU_FAULT, TESSERA_GROUP
from app.db.engine import next_resource_version
from app.db.models import GPUDevice, Node, table
from app.errors import Cause, NotFound, ResourceRef, invalid
from app.inventory import service as inventory
from app.kube.meta import now, timestamp
from app.pods import repository as pod_rows
from app.pods import service as pods

gpus_t = table(GPUDevice)
nodes_t = table(Node)

KINDS = ("ecc", "xid", "bus", "driver")
KIND_WORDS = {
    "ecc": "an uncorrectable ECC error",
    "xid": "Xid {xid}",
    "bus": "the GPU fell off the bus",
    "driver": "a driver failure",
}
# Xids NVIDIA's device plugin does not treat as a device fault by default (application errors:
# the GPU itself is fine), so they are refused rather than isolating a good GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_XID = 999
MAX_MESSAGE = 1024
FAULT_HISTORY = 16  # faults kept per GPU (the oldest is dropped)
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
MAX_TAINTS = 8


def _not_found(name: str) -> NotFound:
    return NotFound(
        f'gpudevices.{TESSERA_GROUP} "{name}" not found',
        ref=ResourceRef("gpudevices", name, TESSERA_GROUP),
    )


def gpu_name_at(session: Session, *, node: str, index: int) -> str:
    """The name of GPU `index` of `node` (the CLI's NODE GPU_INDEX)."""
    name = session.scalar(
        select(gpus_t.c.name).where(gpus_t.c.node_name == node, gpus_t.c.index == index)
    )
    if name is None:
        raise NotFound(
            f'node "{node}" has no GPU with index {index}: see kubectl get gpu '
            f"--field-selector spec.nodeName={node}",
            ref=ResourceRef("gpudevices", f"{node}/{index}", TESSERA_GROUP),
        )
    return name


def check_fault(name: str, *, kind: str, xid: int | None, message: str) -> None:
    """Refuse a fault report that is not one (before anything is read or written)."""
    causes: list[Cause] = []
    if kind not in KINDS:
        causes.append(
            Cause(
                "spec.kind",
                f'Unsupported value: "{kind}": supported values: '
                + ", ".join(f'"{k}"' for k in KINDS),
                "FieldValueNotSupported",
            )
        )
    if kind == "xid" and xid is None:
        causes.append(Cause("spec.xid", "Required value: a fault of kind xid names its Xid number"))
    if kind != "xid" and xid is not None:
        causes.append(
            Cause("spec.xid", f"Forbidden: only a fault of kind xid has an Xid, not {kind}")
        )
    if xid is not None:
        if not 1 <= xid <= MAX_XID:
            causes.append(
                Cause("spec.xid", f"Invalid value: {xid}: must be between 1 and {MAX_XID}")
            )
        elif xid in APPLICATION_XIDS:
            causes.append(
                Cause(
                    "spec.xid",
                    f"Invalid value: {xid}: Xid {xid} is an application error, not a device "
                    "fault (NVIDIA's device plugin ignores it); the GPU stays in service",
                )
            )
    if len(message) > MAX_MESSAGE:
        causes.append(
            Cause("spec.message", f"Too long: may not be longer than {MAX_MESSAGE} characters")
        )
    if causes:
        raise invalid("GPUFault", name, causes, group=TESSERA_GROUP)


def describe(fault: dict[str, Any]) -> str:
    words = KIND_WORDS[fault["kind"]].format(xid=fault.get("xid"))
    return words + (f" ({fault['message']})" if fault.get("message") else "")


def report_fault(
    session: Session,
    *,
    name: str,
    kind: str,
    xid: int | None = None,
    message: str = "",
    grace_seconds: int,
) -> dict[str, Any]:
    """A GPU failed now: mark it Unhealthy with a NoExecute taint, append the fault to its
    history, and disrupt every pod holding a fragment of it. Returns the GPU object."""
    check_fault(name, kind=kind, xid=xid, message=message)
    at = now()
    fault: dict[str, Any] = {"kind": kind, "time": timestamp(at)}
    if xid is not None:
        fault["xid"] = xid
    if message:
        fault["message"] = message
    # The GPU row first: a bind racing with this waits for its lock and then finds the GPU
    # Unhealthy (`inventory.reserve` takes only from a Healthy GPU), or committed before, and
    # its pod is among the holders read below.
    row = _locked(session, name)
    taints = [t for t in row["taints"] if t.get("key") != TAINT_GPU_FAULT]
    taints.append(
        {"key": TAINT_GPU_FAULT, "value": kind, "effect": NO_EXECUTE, "timeAdded": fault["time"]}
    )
    history = [*row["faults"], fault][-FAULT_HISTORY:]
    _write(session, row, health="Unhealthy", taints=taints, faults=history)
    text = f"GPU {name} (index {row['index']} on node {row['node_name']}) failed: {describe(fault)}"
    told: set[str] = set()
    for uid in pod_rows.holders_of(session, name):
        pod = pods.disrupt_for_fault(
            session, uid=uid, message=text, at=at, grace_seconds=grace_seconds
        )
        if pod is None:
            continue
        told.add(uid)
        notify_gpu_fault(session, pod_row=pod, gpu=name, fault=fault, at=at)
        if pod["pod_group"] and pods.reschedules_on_fault(session, pod):
            # The whole gang goes back: its members on healthy GPUs are told too.
            for mate in pod_rows.group_members(session, pod["namespace"], pod["pod_group"]):
                if mate["uid"] in told:
                    continue
                moved = pods.disrupt_for_fault(
                    session,
                    uid=mate["uid"],
                    message=f"{text}; it holds a member of pod group {pod['pod_group']}, "
                    "which is placed again whole",
                    at=at,
                    grace_seconds=grace_seconds,
                )
                if moved is not None:
                    told.add(mate["uid"])
                    notify_gpu_fault(session, pod_row=moved, gpu=name, fault=fault, at=at)
    return get(session, name=name)


def repair(session: Session, *, name: str) -> dict[str, Any]:
    """The GPU was repaired (or replaced): Healthy again and placeable (the fault's NoExecute
    taint is removed; an admin's NoSchedule taint stays), the last fault gets its repair time."""
    row = _locked(session, name)
    at = timestamp(now())
    history = [dict(f) for f in row["faults"]]
    for fault in history:
        fault.setdefault("repairedTime", at)
    taints = [t for t in row["taints"] if t.get("key") != TAINT_GPU_FAULT]
    _write(session, row, health="Healthy", taints=taints, faults=history)
    return get(session, name=name)


def set_taints(session: Session, *, name: str, taints: list[dict[str, Any]]) -> None:
    """An admin's own taints (a `PATCH` of `spec.taints`): NoSchedule only; the fault's taint is
    kept as it is (only a fault report sets it, only a repair removes it)."""
    row = _locked(session, name)
    causes: list[Cause] = []
    clean: list[dict[str, Any]] = []
    if len(taints) > MAX_TAINTS:
        causes.append(Cause("spec.taints", f"Too many: at most {MAX_TAINTS} taints"))
    keep = [t for t in row["taints"] if t.get("key") == TAINT_GPU_FAULT]
    before = {t["key"]: t for t in row["taints"]}
    for i, taint in enumerate(taints[:MAX_TAINTS]):
        where = f"spec.taints[{i}]"
        if not isinstance(taint, dict):
            causes.append(Cause(where, "Invalid value: a taint is an object {key, value, effect}"))
            continue
        key, value, effect = taint.get("key"), taint.get("value", ""), taint.get("effect")
        if key == TAINT_GPU_FAULT:
            if before.get(key, {}).get("effect") != effect:
                causes.append(
                    Cause(
                        f"{where}.key",
                        f'Forbidden: "{TAINT_GPU_FAULT}" is set by a fault report and removed '
                        "by a repair (tessera gpu fault / tessera gpu repair)",
                    )
                )
            continue
        if not isinstance(key, str) or not 1 <= len(key) <= 253:
            causes.append(Cause(f"{where}.key", "Required value: a key of 1 to 253 characters"))
            continue
        if not isinstance(value, str) or len(value) > 63:
            causes.append(Cause(f"{where}.value", "Invalid value: at most 63 characters"))
            continue
        if effect != NO_SCHEDULE:
            causes.append(
                Cause(
                    f"{where}.effect",
                    f'Unsupported value: "{effect}": supported values: "NoSchedule" (a fault, '
                    "NoExecute, is reported with POST .../fault)",
                    "FieldValueNotSupported",
                )
            )
            continue
        if any(t["key"] == key for t in clean):
            causes.append(Cause(f"{where}.key", f'Duplicate value: "{key}"'))
            continue
        added = before.get(key, {}).get("timeAdded") or timestamp(now())
        clean.append({"key": key, "value": value, "effect": effect, "timeAdded": added})
    if causes:
        raise invalid("GPUDevice", name, causes, group=TESSERA_GROUP)
    if keep + clean != row["taints"]:
        _write(session, row, health=row["health"], taints=keep + clean, faults=row["faults"])


def notify_gpu_fault(
    session: Session, *, pod_row: Any, gpu: str, fault: dict[str, Any], at: datetime
) -> None:
    """The tenant's `GPUFault` callbacks: called once per affected pod, in the fault's
    transaction; the outbox sends the deliveries once it commits."""
    callbacks.emit_gpu_fault(
        session,
        pod=pod_row,
        gpu=gpu,
        node=pod_row["node_name"],
        reason=str(fault["kind"]),
        message=describe(fault),
        at=at,
    )


def get(session: Session, *, name: str) -> dict[str, Any]:
    rows = inventory.list_gpu_rows(session, name)
    if not rows:
        raise _not_found(name)
    holders = inventory.gpu_pods(session, [name], tenant_id=None, admin=True)
    return inventory.gpu_to_api(rows[0], holders.get(name, []))


def _locked(session: Session, name: str) -> Any:
    row = (
        session.execute(select(gpus_t).where(gpus_t.c.name == name).with_for_update())
        .mappings()
        .first()
    )
    if row is None:
        raise _not_found(name)
    return row


def _write(
    session: Session,
    row: Any,
    *,
    health: str,
    taints: list[dict[str, Any]],
    faults: list[dict[str, Any]],
) -> None:
    rv = next_resource_version(session)
    values = {"health": health, "taints": taints, "faults": faults, "resource_version": rv}
    session.execute(update(gpus_t).where(gpus_t.c.name == row["name"]).values(**values))
    inventory.log_gpu_change(session, {**row, **values}, before=row)
