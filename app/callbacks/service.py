"""Callbacks beside their store: the signing secret's rotation, the deliveries, and `emit`,
which writes the outbox rows the delivery worker (app/callbacks/delivery.py) sends after commit.

The Callback object itself is the registry's (app/registry/kinds/callbacks.py: create, read,
list, watch, update, patch, delete). A Callback receives the events of the pods in its own
namespace. `emit` runs inside the transaction of the transition it reports, so a transaction
that rolls back sends nothing, and the (callback, event id) key makes an event emitted twice one
delivery.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.callbacks.destinations import Refused, check_url
from app.constants import TESSERA_GROUP
from app.db.engine import insert_ignoring_duplicates, on_commit
from app.db.models import CallbackDelivery, CallbackSecret, StoredObject, table
from app.errors import Cause
from app.kube.meta import new_uid, now, timestamp

objects_t = table(StoredObject)
secrets_t = table(CallbackSecret)
deliveries_t = table(CallbackDelivery)
Row = Mapping[Any, Any]
API_VERSION = f"{TESSERA_GROUP}/v1"
RESOURCE = "callbacks"

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


def spec_causes(spec: Mapping[str, Any]) -> list[Cause]:
    """What is wrong with a Callback's spec (its URL, event types and description)."""
    causes: list[Cause] = []
    url = str(spec.get("url") or "")
    try:
        check_url(url)
    except Refused as exc:
        shown = url[:200] + ("..." if len(url) > 200 else "")
        causes.append(Cause("spec.url", f'Invalid value: "{shown}": {exc}'))
    events = [str(e) for e in spec.get("events") or []]
    known = ", ".join(EVENT_TYPES)
    if not events:
        causes.append(
            Cause(
                "spec.events",
                f"Required value: name at least one event type ({known})",
                "FieldValueRequired",
            )
        )
    if len(events) > len(EVENT_TYPES) * 4:
        causes.append(Cause("spec.events", f"Too many: list each of {known} at most once"))
    else:
        for i, name in enumerate(events):
            if name not in EVENT_TYPES:
                causes.append(
                    Cause(
                        f"spec.events[{i}]",
                        f'Unsupported value: "{name[:64]}": supported values: {known}',
                        "FieldValueNotSupported",
                    )
                )
            elif name in events[:i]:
                causes.append(
                    Cause(f"spec.events[{i}]", f'Duplicate value: "{name}"', "FieldValueDuplicate")
                )
    description = str(spec.get("description") or "")
    if len(description) > MAX_DESCRIPTION_CHARS:
        causes.append(
            Cause(
                "spec.description",
                f"Too long: {len(description)} characters; at most {MAX_DESCRIPTION_CHARS}",
                "FieldValueTooLong",
            )
        )
    return causes


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def rotate_secret(session: Session, *, callback: dict[str, Any]) -> dict[str, Any]:
    """A new signing secret for `callback` (as its store reads it), effective for every attempt
    from now on (including retries of deliveries emitted before); returned in this answer
    only, in `status.signingSecret`."""
    uid, secret, at = callback["metadata"]["uid"], new_secret(), now()
    changed = session.execute(
        update(secrets_t)
        .where(secrets_t.c.callback_uid == uid)
        .values(secret=secret, rotated_at=at)
    ).rowcount  # type: ignore[attr-defined]
    if not changed:
        session.execute(secrets_t.insert().values(callback_uid=uid, secret=secret, rotated_at=at))
    status = {
        **(callback.get("status") or {}),
        "secretRotationTime": timestamp(at),
        "signingSecret": secret,
    }
    return {**callback, "status": status}


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


def list_deliveries(session: Session, *, uid: str, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` deliveries (at most MAX_DELIVERIES_LISTED) of the callback `uid`."""
    bounded = max(1, min(limit, MAX_DELIVERIES_LISTED))
    return recent_deliveries(session, [uid], limit=bounded).get(uid, [])


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
    query = select(objects_t.c.uid, objects_t.c.body).where(
        objects_t.c.api_group == TESSERA_GROUP,
        objects_t.c.resource == RESOURCE,
        objects_t.c.tenant_id == tenant_id
        if tenant_id is not None
        else objects_t.c.tenant_id.is_(None),
    )
    if namespace is not None:
        query = query.where(objects_t.c.namespace == namespace)
    targets = [
        uid
        for uid, body in session.execute(query)
        if type in ((body.get("spec") or {}).get("events") or [])
    ]
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
