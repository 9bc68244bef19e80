"""Recording and reading events (core/v1 Event)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.engine import defer_insert, next_resource_version, note_change
from app.db.models import Event, table
from app.kube.meta import derived_name, micro_timestamp, new_uid, now, timestamp

events_t = table(Event)

FIELD_SELECTORS = (
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.name",
    "involvedObject.namespace",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "type",
    "source",
    "reportingComponent",
)


@dataclass(frozen=True)
class Involved:
    kind: str
    name: str
    uid: str
    namespace: str | None
    api_version: str = "v1"


def record(
    session: Session,
    *,
    involved: Involved,
    reason: str,
    message: str,
    type: str = "Normal",
    component: str = "tessera-api",
    tenant_id: int | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Add an event about `involved`; cluster-scoped objects' events go to `default`."""
    return record_many(
        session,
        [
            Note(
                involved=involved,
                reason=reason,
                message=message,
                type=type,
                component=component,
                tenant_id=tenant_id,
                at=at,
            )
        ],
    )[0]


@dataclass(frozen=True)
class Note:
    """One event to record (the arguments of `record`)."""

    involved: Involved
    reason: str
    message: str
    type: str = "Normal"
    component: str = "tessera-api"
    tenant_id: int | None = None
    at: datetime | None = None


def record_many(session: Session, notes: Sequence[Note]) -> list[dict[str, Any]]:
    """Add the events of `notes` (inserted, with every other event of the transaction, in one
    statement at commit: nothing reads an event back in the transaction that records it);
    returns their API objects."""
    return [add(session, prepare(note)) for note in notes]


@dataclass(frozen=True)
class Prepared:
    """An event worked out before its transaction (`prepare`): its row and API object, which
    `add` gives their resourceVersion."""

    row: dict[str, Any]
    obj: dict[str, Any]


# A Warning that repeats one about the same object with the same reason within this window is
# counted on that event (`count`, `series`, the latest message and time), as Kubernetes' event
# correlator does, rather than recorded again: a gang waiting for its members, a pod that does
# not fit, say the same thing at every try. A Normal event about a workload is counted so when
# its message is the same too (a controller that says again what it did); a pod's Normal
# events (Started, Pulled, ...) are each their own.
REPEAT_WINDOW = timedelta(minutes=10)

_stamp_lock = threading.Lock()
_last_stamp = 0


def _name_stamp(at: datetime) -> str:
    """The hex nanoseconds of `at`, moved on where needed so that this process never gives two
    events the same: event names sort in time order per object, as Kubernetes names them."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(int(at.timestamp() * 1_000_000_000), _last_stamp + 1)
        return f"{_last_stamp:x}"


def prepare(note: Note) -> Prepared:
    """The row and API object of the event `note` tells of, without a session."""
    at = note.at or now()
    row = {
        "uid": new_uid(),
        "namespace": note.involved.namespace or "default",
        "name": derived_name(note.involved.name, f".{_name_stamp(at)}"),
        "tenant_id": note.tenant_id,
        "resource_version": 0,  # given by `add`
        "created_at": at,
        "involved_kind": note.involved.kind,
        "involved_api_version": note.involved.api_version,
        "involved_name": note.involved.name,
        "involved_namespace": note.involved.namespace,
        "involved_uid": note.involved.uid,
        "type": note.type,
        "reason": note.reason,
        "message": note.message,
        "component": note.component,
        "count": 1,
        "first_timestamp": at,
        "last_timestamp": at,
    }
    return Prepared(row, to_api(row))


def add(session: Session, event: Prepared) -> dict[str, Any]:
    """Record a prepared event in this transaction, at the next resourceVersion; returns its
    API object. Events are only ever inserted, so their table is their own change log
    (`added_after`): they take no row of the store's change log."""
    rv = next_resource_version(session)
    row, obj = event.row, event.obj
    counted_kind = row["type"] == "Warning" or row["involved_kind"] != "Pod"
    repeated = _repeated(session, row) if counted_kind else None
    if repeated is not None:
        counted = {
            **repeated,
            "count": repeated["count"] + 1,
            "message": row["message"],
            "last_timestamp": row["last_timestamp"],
            "resource_version": rv,
        }
        session.execute(
            update(events_t)
            .where(events_t.c.uid == repeated["uid"])
            .values(
                count=counted["count"],
                message=counted["message"],
                last_timestamp=counted["last_timestamp"],
                resource_version=rv,
            )
        )
        note_change(session, rv, "Event")
        return to_api(counted)
    row["resource_version"] = rv
    obj["metadata"]["resourceVersion"] = str(rv)
    defer_insert(session, events_t, row)
    note_change(session, rv, "Event")
    return obj


def _repeated(session: Session, row: Mapping[str, Any]) -> Mapping[Any, Any] | None:
    """The latest event about the same object with the same type and reason (and message, for
    a Normal one), if recent."""
    query = select(events_t).where(
        events_t.c.namespace == row["namespace"],
        events_t.c.involved_name == row["involved_name"],
        events_t.c.involved_uid == row["involved_uid"],
        events_t.c.type == row["type"],
        events_t.c.reason == row["reason"],
        events_t.c.last_timestamp >= row["last_timestamp"] - REPEAT_WINDOW,
    )
    if row["type"] != "Warning":
        query = query.where(events_t.c.message == row["message"])
    return (
        session.execute(query.order_by(events_t.c.resource_version.desc()).limit(1))
        .mappings()
        .first()
    )


def added_after(
    session: Session,
    *,
    after: int,
    upto: int,
    namespace: str | None,
    tenant_id: int | None,
    scoped: bool,
    limit: int,
) -> list[dict[str, Any]]:
    """The events recorded after resourceVersion `after` and up to `upto`, oldest first, as
    the change log's rows (ADDED) for a watch of events."""
    query = (
        select(events_t)
        .where(events_t.c.resource_version > after, events_t.c.resource_version <= upto)
        .order_by(events_t.c.resource_version)
        .limit(limit)
    )
    if namespace is not None:
        query = query.where(events_t.c.namespace == namespace)
    if scoped:
        query = query.where(events_t.c.tenant_id == tenant_id)
    return [
        {
            "resource_version": row["resource_version"],
            "type": "ADDED" if row["count"] == 1 else "MODIFIED",  # a repeat, counted
            "object": to_api(row),
            "previous": None,
        }
        for row in session.execute(query).mappings()
    ]


def to_api(row: Mapping[Any, Any]) -> dict[str, Any]:
    involved: dict[str, Any] = {
        "kind": row["involved_kind"],
        "name": row["involved_name"],
        "uid": row["involved_uid"],
        "apiVersion": row["involved_api_version"],
    }
    if row["involved_namespace"]:
        involved["namespace"] = row["involved_namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": row["name"],
            "namespace": row["namespace"],
            "uid": row["uid"],
            "resourceVersion": str(row["resource_version"]),
            "creationTimestamp": timestamp(row["created_at"]),
        },
        "involvedObject": involved,
        "reason": row["reason"],
        "message": row["message"],
        "type": row["type"],
        "source": {"component": row["component"]},
        "reportingComponent": row["component"],
        "reportingInstance": "",
        "firstTimestamp": timestamp(row["first_timestamp"]),
        "lastTimestamp": timestamp(row["last_timestamp"]),
        "count": row["count"],
        **(
            {
                "series": {
                    "count": row["count"],
                    "lastObservedTime": micro_timestamp(row["last_timestamp"]),
                }
            }
            if row["count"] > 1
            else {}
        ),
    }


def in_time_order(obj: dict[str, Any]) -> tuple[str, str]:
    """Events list oldest first in each namespace (in the order they were last recorded: their
    resourceVersions), rather than by name: `kubectl get events` reads as a log."""
    meta = obj["metadata"]
    return meta.get("namespace", ""), f"{int(meta['resourceVersion']):020d}"


def list_rows(
    session: Session, *, tenant_id: int | None, admin: bool, namespace: str | None
) -> list[Mapping[Any, Any]]:
    query = select(Event.__table__).order_by(Event.namespace, Event.resource_version)
    if namespace is not None:
        query = query.where(Event.namespace == namespace)
    if not admin:
        query = query.where(Event.tenant_id == tenant_id)
    return list(session.execute(query).mappings())
