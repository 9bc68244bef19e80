"""Reading and compacting the change log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from app.db.engine import current_resource_version
from app.db.models import Change, Counter, table
from app.events import service as events

COMPACTED = "compacted"
changes_t = table(Change)


def compacted_before(session: Session) -> int:
    """Changes at or below this resourceVersion are gone (a watch from there gets 410)."""
    row = session.get(Counter, COMPACTED)
    return row.value if row is not None else 0


def read_after(
    session: Session,
    *,
    after: int,
    kind: str,
    namespace: str | None,
    tenant_id: int | None,
    scoped: bool,
    limit: int = 500,
) -> tuple[list[Mapping[Any, Any]], int]:
    """Changes of `kind` newer than `after`, and the store's resourceVersion when read.

    The version is read first, so every change at or below it that is not in the result does
    not concern this watch: it is safe to send as a bookmark.
    """
    upto = current_resource_version(session)
    if kind == "Event":
        added = events.added_after(
            session,
            after=after,
            upto=upto,
            namespace=namespace,
            tenant_id=tenant_id,
            scoped=scoped,
            limit=limit,
        )
        full = len(added) == limit
        return list(added), int(added[-1]["resource_version"]) if full else upto
    query = (
        select(
            changes_t.c.resource_version,
            changes_t.c.type,
            changes_t.c.object,
            changes_t.c.previous,
        )
        .where(
            changes_t.c.kind == kind,
            changes_t.c.resource_version > after,
            changes_t.c.resource_version <= upto,
        )
        .order_by(changes_t.c.resource_version)
        .limit(limit)
    )
    if namespace is not None:
        query = query.where(changes_t.c.namespace == namespace)
    if scoped:
        query = query.where(changes_t.c.tenant_id == tenant_id)
    rows: list[Mapping[Any, Any]] = list(session.execute(query).mappings())
    if len(rows) == limit:
        upto = rows[-1]["resource_version"]
    return rows, upto


def newest_after(session: Session, after: int) -> tuple[int, dict[str, int]]:
    """The store's resourceVersion, and the newest change of each kind above `after` and at or
    below it (events, kept in a table of their own, as kind Event): what a process's watches
    are woken for when no notification told them (app/watch/notify.py, `follow_log`)."""
    upto = current_resource_version(session)
    if upto <= after:
        return upto, {}
    newest: dict[str, int] = {
        kind: int(version)
        for kind, version in session.execute(
            select(changes_t.c.kind, func.max(changes_t.c.resource_version))
            .where(changes_t.c.resource_version > after, changes_t.c.resource_version <= upto)
            .group_by(changes_t.c.kind)
        )
    }
    event = session.scalar(
        select(func.max(events.events_t.c.resource_version)).where(
            events.events_t.c.resource_version > after,
            events.events_t.c.resource_version <= upto,
        )
    )
    if event is not None:
        newest["Event"] = int(event)
    return upto, newest


def compact(session: Session, *, keep: int) -> int:
    """Drop all but the newest `keep` changes; returns how many were removed.

    Counted in entries, not in resourceVersions: versions are not contiguous (a transaction
    reserves a block of them, events take theirs from the same counter), so a distance in
    versions would keep far fewer changes than asked."""
    cutoff_rv = session.scalar(
        select(changes_t.c.resource_version)
        .order_by(changes_t.c.resource_version.desc())
        .offset(max(keep, 0))
        .limit(1)
    )
    if cutoff_rv is None or cutoff_rv <= compacted_before(session):
        return 0
    removed = session.execute(delete(changes_t).where(changes_t.c.resource_version <= cutoff_rv))
    if session.get(Counter, COMPACTED) is None:
        session.add(Counter(name=COMPACTED, value=cutoff_rv))
    else:
        session.execute(
            text("UPDATE counters SET value = :v WHERE name = :n"), {"v": cutoff_rv, "n": COMPACTED}
        )
    return int(removed.rowcount or 0)  # type: ignore[attr-defined]
