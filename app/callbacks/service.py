"""Callbacks: create, read, list, update, delete, rotate the signing secret; and `emit`, which
writes the outbox rows the delivery worker (app/callbacks/delivery.py) sends after commit.

A Callback receives the events of the pods in its own namespace. `emit` runs inside the
transaction of the transition it reports, so a transaction that rolls back sends nothing, and
the (callback, event id) key makes an event emitted twice one delivery.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.callbacks.destinations import Refused, check_url
from app.callbacks.schemas import Callback as CallbackBody
from app.constants import TESSERA_GROUP
from app.db.engine import (
    insert_ignoring_duplicates,
    insert_unless_exists,
    next_resource_version,
    on_commit,
    record_change,
)
from app.db.models import Callback, CallbackDelivery, table
from app.errors import AlreadyExists, Cause, Conflict, Forbidden, NotFound, ResourceRef, invalid
from app.kube.meta import (
    new_uid,
    now,
    timestamp,
    validate_annotations,
    validate_labels,
    validate_name,
)
from app.namespaces.service import CONTENTS, NamespaceInfo, TableContents

callbacks_t = table(Callback)
deliveries_t = table(CallbackDelivery)
Row = Mapping[Any, Any]
API_VERSION = f"{TESSERA_GROUP}/v1"
FIELD_SELECTORS = ("metadata.name", "metadata.namespace")

GPU_FAULT = "GPUFault"
POD_FINISHED = "PodFinished"
EVICTION_NOTICE = "EvictionNotice"
BUDGET_THRESHOLD = "BudgetThreshold"
# The API's event names, and the CloudEvents `type` each is sent as.
EVENT_TYPES = {
    GPU_FAULT: "io.tessera.gpu.fault",
    POD_FINISHED: "io.tessera.pod.finished",
    EVICTION_NOTICE: "io.tessera.pod.eviction-notice",
    BUDGET_THRESHOLD: "io.tessera.budget.threshold",
}
MAX_DESCRIPTION_CHARS = 1024
MAX_PER_NAMESPACE = 50
RECENT_DELIVERIES = 10
MAX_DELIVERIES_LISTED = 500
SECRET_PREFIX = "whsec_"
# Event ids are UUIDv5 of the event's identity in this namespace: stable across emits and retries.
EVENT_ID_NAMESPACE = uuid.UUID("6f1d8a52-3c1e-4f4b-9a57-0c9e5b2d7e11")


def _ref(name: str) -> ResourceRef:
    return ResourceRef("callbacks", name, TESSERA_GROUP)


def _spec_causes(body: CallbackBody) -> list[Cause]:
    causes: list[Cause] = []
    try:
        check_url(body.spec.url)
    except Refused as exc:
        shown = body.spec.url[:200] + ("..." if len(body.spec.url) > 200 else "")
        causes.append(Cause("spec.url", f'Invalid value: "{shown}": {exc}'))
    known = ", ".join(EVENT_TYPES)
    if not body.spec.events:
        causes.append(
            Cause(
                "spec.events",
                f"Required value: name at least one event type ({known})",
                "FieldValueRequired",
            )
        )
    if len(body.spec.events) > len(EVENT_TYPES) * 4:
        causes.append(Cause("spec.events", f"Too many: list each of {known} at most once"))
    else:
        for i, name in enumerate(body.spec.events):
            if name not in EVENT_TYPES:
                causes.append(
                    Cause(
                        f"spec.events[{i}]",
                        f'Unsupported value: "{name[:64]}": supported values: {known}',
                        "FieldValueNotSupported",
                    )
                )
            elif name in body.spec.events[:i]:
                causes.append(
                    Cause(f"spec.events[{i}]", f'Duplicate value: "{name}"', "FieldValueDuplicate")
                )
    description = body.spec.description or ""
    if len(description) > MAX_DESCRIPTION_CHARS:
        causes.append(
            Cause(
                "spec.description",
                f"Too long: {len(description)} characters; at most {MAX_DESCRIPTION_CHARS}",
                "FieldValueTooLong",
            )
        )
    return causes


def _meta_causes(body: CallbackBody) -> list[Cause]:
    return validate_labels(body.metadata.labels or {}, "metadata.labels") + validate_annotations(
        body.metadata.annotations or {}, "metadata.annotations"
    )


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create(session: Session, *, namespace: NamespaceInfo, body: CallbackBody) -> dict[str, Any]:
    """The new callback, with its signing secret in `status.signingSecret`: the only answer
    that ever holds it."""
    name = body.metadata.name or ""
    causes = validate_name(name, "metadata.name") + _meta_causes(body) + _spec_causes(body)
    if causes:
        raise invalid("Callback", name, causes, group=TESSERA_GROUP)
    count = session.execute(
        select(func.count()).where(callbacks_t.c.namespace == namespace.name)
    ).scalar_one()
    if count >= MAX_PER_NAMESPACE:
        raise Forbidden(
            f'callbacks.{TESSERA_GROUP} "{name}" is forbidden: namespace "{namespace.name}" '
            f"already has {count} callbacks, the most it may have: delete one, or subscribe an "
            "existing one to more events",
            ref=_ref(name),
        )
    at = now()
    secret = new_secret()
    values: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "namespace": namespace.name,
        "name": name,
        "tenant_id": namespace.tenant_id,
        "resource_version": next_resource_version(session),
        "created_at": at,
        "labels": dict(body.metadata.labels or {}),
        "annotations": dict(body.metadata.annotations or {}),
        "url": body.spec.url,
        "events": list(body.spec.events),
        "description": body.spec.description or "",
        "secret": secret,
        "secret_rotated_at": at,
    }
    if not insert_unless_exists(session, callbacks_t, values):
        raise AlreadyExists(f'callbacks.{TESSERA_GROUP} "{name}" already exists', ref=_ref(name))
    obj = to_api(values, [])
    _log(session, values, obj, "ADDED")
    return _with_secret(obj, secret)


def _with_secret(obj: dict[str, Any], secret: str) -> dict[str, Any]:
    return {**obj, "status": {**obj["status"], "signingSecret": secret}}


def get_row(session: Session, namespace: str, name: str, *, for_update: bool = False) -> Row:
    query = select(callbacks_t).where(
        callbacks_t.c.namespace == namespace, callbacks_t.c.name == name
    )
    if for_update:
        query = query.with_for_update()
    row = session.execute(query).mappings().first()
    if row is None:
        raise NotFound(f'callbacks.{TESSERA_GROUP} "{name}" not found', ref=_ref(name))
    return row


def get(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    row = get_row(session, namespace, name)
    return to_api(row, recent_deliveries(session, [row["uid"]]).get(row["uid"], []))


def list_callbacks(
    session: Session, *, tenant_id: int | None, namespace: str | None
) -> list[dict[str, Any]]:
    query = select(callbacks_t).order_by(callbacks_t.c.namespace, callbacks_t.c.name)
    if tenant_id is not None:
        query = query.where(callbacks_t.c.tenant_id == tenant_id)
    if namespace is not None:
        query = query.where(callbacks_t.c.namespace == namespace)
    rows = list(session.execute(query).mappings())
    recent = recent_deliveries(session, [r["uid"] for r in rows])
    return [to_api(r, recent.get(r["uid"], [])) for r in rows]


def update_callback(
    session: Session, *, namespace: str, name: str, body: CallbackBody
) -> dict[str, Any]:
    """Labels, annotations and the spec may change (deliveries not yet sent go to the new URL);
    the name and namespace may not."""
    row = get_row(session, namespace, name, for_update=True)
    identity = [
        Cause(path, f'Invalid value: "{value}": field is immutable', "FieldValueInvalid")
        for path, value, current in (
            ("metadata.name", body.metadata.name, name),
            ("metadata.namespace", body.metadata.namespace, namespace),
        )
        if value not in (None, current)
    ]
    if identity:
        raise invalid("Callback", name, identity, group=TESSERA_GROUP)
    wanted_rv = body.metadata.resource_version
    if wanted_rv and wanted_rv != str(row["resource_version"]):
        raise Conflict(
            f'Operation cannot be fulfilled on callbacks.{TESSERA_GROUP} "{name}": the object '
            "has been modified; please apply your changes to the latest version and try again",
            ref=_ref(name),
        )
    causes = _meta_causes(body) + _spec_causes(body)
    if causes:
        raise invalid("Callback", name, causes, group=TESSERA_GROUP)
    changes = {
        "labels": dict(body.metadata.labels or {}),
        "annotations": dict(body.metadata.annotations or {}),
        "url": body.spec.url,
        "events": list(body.spec.events),
        "description": body.spec.description or "",
    }
    recent = recent_deliveries(session, [row["uid"]]).get(row["uid"], [])
    if all(row[k] == v for k, v in changes.items()):
        return to_api(row, recent)
    return _write(session, row, changes, recent)


def rotate_secret(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    """A new signing secret, effective for every attempt from now on (including retries of
    deliveries emitted before); returned in this answer only."""
    row = get_row(session, namespace, name, for_update=True)
    secret = new_secret()
    recent = recent_deliveries(session, [row["uid"]]).get(row["uid"], [])
    obj = _write(session, row, {"secret": secret, "secret_rotated_at": now()}, recent)
    return _with_secret(obj, secret)


def _write(
    session: Session, row: Row, changes: dict[str, Any], recent: list[dict[str, Any]]
) -> dict[str, Any]:
    changes["resource_version"] = next_resource_version(session)
    session.execute(update(callbacks_t).where(callbacks_t.c.uid == row["uid"]).values(**changes))
    updated = {**row, **changes}
    obj = to_api(updated, recent)
    _log(session, updated, to_api(updated, []), "MODIFIED", before=to_api(row, []))
    return obj


def delete_callback(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    """Deletes the callback and its deliveries (pending ones are never sent)."""
    row = get_row(session, namespace, name, for_update=True)
    session.execute(delete(deliveries_t).where(deliveries_t.c.callback_uid == row["uid"]))
    session.execute(delete(callbacks_t).where(callbacks_t.c.uid == row["uid"]))
    gone = {**row, "resource_version": next_resource_version(session)}
    obj = to_api(gone, [])
    _log(session, gone, obj, "DELETED")
    return obj


def to_api(row: Row, recent: Sequence[dict[str, Any]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": row["name"],
        "namespace": row["namespace"],
        "uid": row["uid"],
        "resourceVersion": str(row["resource_version"]),
        "creationTimestamp": timestamp(row["created_at"]),
    }
    if row["labels"]:
        metadata["labels"] = row["labels"]
    if row["annotations"]:
        metadata["annotations"] = row["annotations"]
    spec: dict[str, Any] = {"url": row["url"], "events": list(row["events"])}
    if row["description"]:
        spec["description"] = row["description"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Callback",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "secretRotationTime": timestamp(row["secret_rotated_at"]),
            "recentDeliveries": list(recent),
        },
    }


# --- deliveries -----------------------------------------------------------------------------


def delivery_to_api(row: Row) -> dict[str, Any]:
    out: dict[str, Any] = {
        "eventId": row["event_id"],
        "type": row["type"],
        "subject": row["subject"],
        "time": timestamp(row["at"]),
        "phase": row["status"],
        "attempts": row["attempts"],
    }
    if row["last_attempt_at"] is not None:
        out["lastAttemptTime"] = timestamp(row["last_attempt_at"])
    if row["status"] == "Pending":
        out["nextAttemptTime"] = timestamp(row["next_attempt_at"])
    if row["last_error"]:
        out["lastError"] = row["last_error"]
    if row["response_code"] is not None:
        out["responseCode"] = row["response_code"]
    return out


def recent_deliveries(
    session: Session, callback_uids: Sequence[str], *, limit: int = RECENT_DELIVERIES
) -> dict[str, list[dict[str, Any]]]:
    """Each callback's newest deliveries (newest first)."""
    if not callback_uids:
        return {}
    ranked = select(
        deliveries_t,
        func.row_number()
        .over(
            partition_by=deliveries_t.c.callback_uid,
            order_by=(deliveries_t.c.created_at.desc(), deliveries_t.c.uid.desc()),
        )
        .label("rank"),
    ).where(deliveries_t.c.callback_uid.in_(list(callback_uids)))
    sub = ranked.subquery()
    query = select(sub).where(sub.c.rank <= limit).order_by(sub.c.callback_uid, sub.c.rank)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in session.execute(query).mappings():
        out.setdefault(row["callback_uid"], []).append(delivery_to_api(row))
    return out


def list_deliveries(
    session: Session, *, namespace: str, name: str, limit: int
) -> list[dict[str, Any]]:
    row = get_row(session, namespace, name)
    bounded = max(1, min(limit, MAX_DELIVERIES_LISTED))
    return recent_deliveries(session, [row["uid"]], limit=bounded).get(row["uid"], [])


def event_id(*, tenant_id: int | None, type: str, subject: str, key: str) -> str:
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{tenant_id}/{type}/{subject}/{key}"))


def emit(
    session: Session,
    *,
    tenant_id: int | None,
    type: str,
    subject: str,
    data: Mapping[str, Any],
    at: datetime,
    namespace: str | None = None,
    key: str | None = None,
) -> str:
    """Queue event `type` (GPUFault, PodFinished, EvictionNotice) about `subject` (e.g.
    `namespaces/NS/pods/NAME`) for every callback of the tenant subscribed to it: those of
    `namespace` (the pod's) when given, else all of the tenant's. Writes in `session`'s
    transaction; returns the event id, which `key` (default: `at`) makes stable, so emitting the
    same transition twice is one delivery. The delivery worker is woken after commit."""
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown callback event type {type!r}; known: {', '.join(EVENT_TYPES)}")
    ident = event_id(tenant_id=tenant_id, type=type, subject=subject, key=key or at.isoformat())
    query = select(callbacks_t.c.uid, callbacks_t.c.events)
    query = query.where(
        callbacks_t.c.tenant_id == tenant_id
        if tenant_id is not None
        else callbacks_t.c.tenant_id.is_(None)
    )
    if namespace is not None:
        query = query.where(callbacks_t.c.namespace == namespace)
    targets = [uid for uid, events in session.execute(query) if type in events]
    if not targets:
        return ident
    created = now()
    insert_ignoring_duplicates(
        session,
        deliveries_t,
        [
            {
                "uid": new_uid(),
                "callback_uid": uid,
                "tenant_id": tenant_id,
                "event_id": ident,
                "type": type,
                "subject": subject[:512],
                "at": at,
                "data": dict(data),
                "created_at": created,
                "status": "Pending",
                "attempts": 0,
                "next_attempt_at": created,
                "lease_until": None,
                "last_attempt_at": None,
                "last_error": None,
                "response_code": None,
                "delivered_at": None,
            }
            for uid in targets
        ],
    )
    from app.callbacks import delivery

    on_commit(session, delivery.wake)
    return ident


def pod_subject(row: Row) -> str:
    return f"namespaces/{row['namespace']}/pods/{row['name']}"


def emit_pod_finished(
    session: Session,
    row: Row,
    *,
    phase: str,
    reason: str,
    exit_code: int | None,
    at: datetime,
    message: str | None = None,
) -> None:
    """A pod ended (Succeeded or Failed): tell its namespace's PodFinished callbacks."""
    data: dict[str, Any] = {
        "namespace": row["namespace"],
        "name": row["name"],
        "uid": row["uid"],
        "phase": phase,
        "reason": reason,
    }
    if exit_code is not None:
        data["exitCode"] = exit_code
    if message:
        data["message"] = message
    emit(
        session,
        tenant_id=row["tenant_id"],
        namespace=row["namespace"],
        type=POD_FINISHED,
        subject=pod_subject(row),
        data=data,
        at=at,
        key=row["uid"],
    )


def emit_eviction_notice(
    session: Session, row: Row, *, deadline: datetime, reason: str, message: str, at: datetime
) -> None:
    """A pod will be stopped at `deadline` (a preemption's notice, an eviction's grace)."""
    emit(
        session,
        tenant_id=row["tenant_id"],
        namespace=row["namespace"],
        type=EVICTION_NOTICE,
        subject=pod_subject(row),
        data={
            "namespace": row["namespace"],
            "name": row["name"],
            "uid": row["uid"],
            "reason": reason,
            "message": message,
            "deadline": timestamp(deadline),
            "noticeSeconds": max(0, int((deadline - at).total_seconds())),
        },
        at=at,
        key=f"{row['uid']}/{reason}",
    )


def emit_gpu_fault(
    session: Session,
    *,
    pod: Row,
    gpu: str,
    node: str | None,
    reason: str,
    message: str,
    at: datetime,
) -> None:
    """A GPU holding a fragment of `pod` failed: for whoever marks GPUs unhealthy to call, once
    per affected pod, in the transaction that records the fault."""
    emit(
        session,
        tenant_id=pod["tenant_id"],
        namespace=pod["namespace"],
        type=GPU_FAULT,
        subject=pod_subject(pod),
        data={
            "namespace": pod["namespace"],
            "name": pod["name"],
            "uid": pod["uid"],
            "gpu": gpu,
            "node": node,
            "reason": reason,
            "message": message,
        },
        at=at,
        key=f"{pod['uid']}/{gpu}/{at.isoformat()}",
    )


def _log(
    session: Session,
    row: Row,
    obj: dict[str, Any],
    event_type: str,
    *,
    before: dict[str, Any] | None = None,
) -> None:
    record_change(
        session,
        {
            "resource_version": row["resource_version"],
            "kind": "Callback",
            "namespace": row["namespace"],
            "name": row["name"],
            "tenant_id": row["tenant_id"],
            "type": event_type,
            "object": obj,
        },
        before=before,
        selectable=FIELD_SELECTORS,
    )


# A namespace's deletion deletes its callbacks through `delete_callback`, so watchers see each go.
CONTENTS.append(
    TableContents(
        callbacks_t,
        lambda s, row: delete_callback(s, namespace=row["namespace"], name=row["name"]),
    )
)
