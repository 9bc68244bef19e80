"""Pod groups beside their store: which group holds a name (a pod's admission), and the
scheduler's verdicts on a gang (`note_unplaced`, `note_placed`).

The PodGroup objects of both API groups are the registry's (app/registry/kinds/podgroups.py:
create, read, list, watch, update, patch, delete, deletecollection). A pod's gang is named by
name alone (pods.pod_group), so a name is unique per namespace across both groups; the
`pod_groups` row beside each object is what the scheduler reads (scheduler/loop.py) and what
these functions write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.constants import (
    LABEL_COSCHEDULING_POD_GROUP,
    LABEL_POD_GROUP,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    TESSERA_GROUP,
)
from app.db.models import PodGroup, StoredObject, table
from app.kube.meta import now
from app.registry.kinds.podgroups import (
    CoschedulingPodGroupStrategy,
    PodGroupStrategy,
    member_counts,
)
from app.registry.store import Store

groups_t = table(PodGroup)
objects_t = table(StoredObject)
Row = Mapping[Any, Any]
API_VERSION = f"{TESSERA_GROUP}/v1"
COSCHEDULING_API_VERSION = f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}"
STRATEGIES = {TESSERA_GROUP: PodGroupStrategy(), SCHEDULING_GROUP: CoschedulingPodGroupStrategy()}
# The change log's kind per group: a watch of one group never sees the other's objects.
CHANGE_KIND = {group: strategy.log_kind for group, strategy in STRATEGIES.items()}
MEMBER_LABEL = {TESSERA_GROUP: LABEL_POD_GROUP, SCHEDULING_GROUP: LABEL_COSCHEDULING_POD_GROUP}
GROUP_OF_LABEL = {label: group for group, label in MEMBER_LABEL.items()}
API_VERSIONS = {TESSERA_GROUP: API_VERSION, SCHEDULING_GROUP: COSCHEDULING_API_VERSION}


def group_of(session: Session, namespace: str, name: str) -> str | None:
    """The API group of the PodGroup of this name in the namespace; None when there is none."""
    query = select(groups_t.c.api_group).where(
        groups_t.c.namespace == namespace, groups_t.c.name == name
    )
    return session.execute(query).scalar()


def exists(session: Session, namespace: str, name: str) -> bool:
    return group_of(session, namespace, name) is not None


def _locked(session: Session, uid: str) -> Row | None:
    """The group's `pod_groups` row, read under its object's row lock (the lock every write of
    the object takes first, so a change of the PodGroup and a verdict come one after the
    other); None when it is gone."""
    held = session.execute(
        select(objects_t.c.uid).where(objects_t.c.uid == uid).with_for_update()
    ).scalar()
    if held is None:
        return None
    return session.execute(select(groups_t).where(groups_t.c.uid == uid)).mappings().first()


def _verdict(session: Session, row: Row, **changes: Any) -> None:
    """Write the scheduler's verdict on a group, which its status shows: watchers see it."""
    session.execute(update(groups_t).where(groups_t.c.uid == row["uid"]).values(**changes))
    Store(STRATEGIES[row["api_group"]]).status_changed(
        session, namespace=row["namespace"], name=row["name"]
    )


def note_unplaced(session: Session, *, uid: str, reason: str) -> str | None:
    """The scheduler tried this group's complete gang and could not place it (`reason`, the
    solver's words). The first try starts the clock of `spec.scheduleTimeoutSeconds`; once it
    has run out the group is marked timed out with the reason, and the message its pods are
    told is returned (None while it may still wait, and for a group marked already: it is
    tried again, with the scheduler's back-off, without telling its pods again)."""
    row = _locked(session, uid)
    if row is None or row["failed_reason"] or row["schedule_timeout_seconds"] is None:
        return None
    at = now()
    since = row["scheduling_since"]
    if since is None:
        session.execute(update(groups_t).where(groups_t.c.uid == uid).values(scheduling_since=at))
        return None
    since = since if since.tzinfo else since.replace(tzinfo=at.tzinfo)
    if (at - since).total_seconds() < row["schedule_timeout_seconds"]:
        return None
    failed = (
        f"not placed within scheduleTimeoutSeconds ({row['schedule_timeout_seconds']}s): {reason}"
    )
    _verdict(session, row, failed_reason=failed[:4000])
    return timeout_message({**row, "failed_reason": failed[:4000]})


def timeout_message(row: Row) -> str:
    """What the pods of a timed-out group are told."""
    return (
        f'pod group "{row["name"]}" timed out: {row["failed_reason"]}; it is tried again, '
        "backing off as a pod that does not fit does, and at once when the PodGroup changes"
    )


def note_placed(session: Session, *, uid: str) -> bool:
    """The gang of a timed-out group was placed on a later try: once its members are bound
    the mark goes (its status shows it scheduled). False when nothing changed (no mark, or a
    bind that went stale)."""
    row = _locked(session, uid)
    if row is None or not row["failed_reason"]:
        return False
    counts = member_counts(session, namespace=row["namespace"], names=[row["name"]])
    if counts.get((row["namespace"], row["name"]), {}).get("scheduled", 0) < row["min_member"]:
        return False
    _verdict(session, row, failed_reason=None, scheduling_since=None)
    return True
