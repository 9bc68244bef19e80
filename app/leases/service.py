"""Leases (`coordination.k8s.io/v1`): a holder's claim, kept by renewing it.

The API serves them through the registry (app/registry/kinds/leases.py: every verb). A node
agent keeps one in `kube-node-lease` named like its node; the control plane reads its
`renewTime` to tell a live node from a lost one (app/agent.py). Here: reading one, and leader
election (`acquire`, `held`, `release`), which writes the lease's row directly, as the store
would (a new resourceVersion, the change logged).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from app.constants import COORDINATION_GROUP
from app.db.engine import insert_unless_exists, next_resource_version
from app.errors import NotFound, ResourceRef
from app.kube.meta import now
from app.registry.kinds.leases import LeaseStrategy, leases_t
from app.registry.store import Store

log = logging.getLogger("tessera.leases")
Row = Mapping[Any, Any]
STRATEGY = LeaseStrategy()


def _store() -> Store:
    return Store(STRATEGY)


def get_row(session: Session, namespace: str, name: str) -> Row:
    row = (
        session.execute(
            select(leases_t).where(leases_t.c.namespace == namespace, leases_t.c.name == name)
        )
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(
            f'leases.{COORDINATION_GROUP} "{name}" not found',
            ref=ResourceRef("leases", name, COORDINATION_GROUP),
        )
    return row


def get(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    return _store().get(session, namespace=namespace, name=name)


def to_api(row: Row) -> dict[str, Any]:
    """The lease of `row`, as the API serves it."""
    return _store().stored(row)


def _log(
    session: Session, row: Row, obj: dict[str, Any], event_type: str, *, before: Any = None
) -> None:
    """A leader election's write in the change log, as the store logs every other write of a
    lease (a row it inserted may carry no tenant: the control plane's leases have none)."""
    _store()._log({"tenant_id": None, **row}, obj, event_type, session, before=before)


# --- leader election --------------------------------------------------------------------------
#
# One active scheduler, as kube-scheduler elects one: the candidates race for one Lease (in
# `kube-system`), the holder renews it, and a standby takes it once the holder's last renewal is
# older than the lease's duration. The leader's writes check, in their own transaction and with
# the lease row locked, that it still holds an unexpired lease (`held`): a leader that lost its
# lease (paused, cut off from the database) binds nothing more, and no other candidate can take
# the lease before it has expired, so two leaders never write at once. Every candidate judges by
# one clock, the database's (`database_time`), so candidates on hosts whose clocks disagree
# cannot both believe they hold it.


def database_time(session: Session) -> datetime:
    """Now, by the database's clock: PostgreSQL's server, one clock for every process of the
    store wherever it runs; on SQLite this host's, which every process of that store shares."""
    if session.get_bind().dialect.name == "postgresql":
        value: datetime = session.execute(select(func.clock_timestamp())).scalar_one()
        return value.astimezone(UTC)
    return now()


@dataclass(frozen=True)
class Claim:
    """A candidate for a lease: who it is, and how long its renewals keep the lease."""

    namespace: str
    name: str
    holder: str
    duration_seconds: int


def _locked(session: Session, claim: Claim, *, lock: str = "wait") -> Row | None:
    """The lease's row: locked, waiting for the lock (`wait`) or not at all if another
    transaction holds it (`skip`: then None); or read without a lock (`none`)."""
    query = select(leases_t).where(
        leases_t.c.namespace == claim.namespace, leases_t.c.name == claim.name
    )
    if lock != "none":
        query = query.with_for_update(skip_locked=lock == "skip")
    return session.execute(query).mappings().first()


# A transaction of the holder that still locks the lease's row once the lease has expired (its
# process paused, swapped out or cut off in the middle of a write) is ended by the candidate
# that takes the lease over. The server's idle-in-transaction time-out does not always end it:
# a session whose client stopped in the middle of a pipeline of statements is not idle (it
# waits for the rest of the pipeline) and is never timed out, and it would hold the lease
# for as long as its process stays stopped. Only transactions begun before the lease expired
# are ended (a write of the holder that checked the lease while it was valid); another
# candidate's attempt, begun later, is waited for.
# The row's locker is its xmax: a transaction id, or a subtransaction's (a write of a batch runs
# in a savepoint), which only the lock each transaction and subtransaction holds on its own id
# names the backend of.
_END_EXPIRED_HOLDERS = text(
    """SELECT pg_terminate_backend(a.pid, 2000)
    FROM leases AS l
    JOIN pg_locks AS k ON k.locktype = 'transactionid' AND k.transactionid = l.xmax
      AND k.mode = 'ExclusiveLock' AND k.granted
    JOIN pg_stat_activity AS a ON a.pid = k.pid
    WHERE l.namespace = :namespace AND l.name = :name
      AND a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND a.xact_start < :expired_at"""
)


def _take_row(session: Session, claim: Claim, row: Row) -> Row | None:
    """Lock the expired lease's `row` for taking it over, ending first the transactions begun
    before it expired that still lock it (`_END_EXPIRED_HOLDERS`); None: it is locked still
    (by a transaction begun since, another candidate's), for the next attempt."""
    if session.get_bind().dialect.name != "postgresql":
        return _locked(session, claim)  # one writer at a time: no lock to wait for
    locked = _locked(session, claim, lock="skip")
    if locked is not None:
        return locked
    renew, duration = row["renew_time"], row["lease_duration_seconds"]
    if renew is not None and duration is not None:
        ended = session.execute(
            _END_EXPIRED_HOLDERS,
            {
                "namespace": claim.namespace,
                "name": claim.name,
                "expired_at": renew + timedelta(seconds=duration),
            },
        ).all()
        if ended:
            log.warning(
                "ended %d transaction(s) begun before the lease %s/%s expired that still "
                "locked it, to take it over",
                len(ended),
                claim.namespace,
                claim.name,
            )
    return _locked(session, claim, lock="skip")


def _expired(row: Row, at: datetime) -> bool:
    renew, duration = row["renew_time"], row["lease_duration_seconds"]
    return renew is None or duration is None or renew + timedelta(seconds=duration) <= at


def acquire(session: Session, *, claim: Claim, at: datetime) -> bool:
    """Take or renew the lease for `claim.holder`: when it holds it already, when nobody does, or
    when its holder's last renewal has expired. False: another candidate holds it.

    A candidate reads the row first without a lock: while the holder's lease is valid it
    returns at once, never queued behind the holder's writes (which lock the row: `held`)."""
    row = _locked(session, claim, lock="none")
    if row is not None and row["holder_identity"] != claim.holder:
        if not _expired(row, at):
            return False
        row = _take_row(session, claim, row)
        if row is None:
            return False  # still locked: the next attempt
    else:
        row = _locked(session, claim)
    if row is None:
        values = {
            "uid": str(uuid.uuid4()),
            "namespace": claim.namespace,
            "name": claim.name,
            "resource_version": next_resource_version(session),
            "tenant_id": None,
            "created_at": at,
            "deletion_timestamp": None,
            "labels": {},
            "body": {},
            "holder_identity": claim.holder,
            "lease_duration_seconds": claim.duration_seconds,
            "acquire_time": at,
            "renew_time": at,
            "lease_transitions": 0,
        }
        if not insert_unless_exists(session, leases_t, values):
            return False  # another candidate created it first: try again next round
        _log(session, values, to_api(values), "ADDED")
        return True
    ours = row["holder_identity"] == claim.holder
    if not ours and not _expired(row, at):
        return False
    changes: dict[str, Any] = {
        "holder_identity": claim.holder,
        "lease_duration_seconds": claim.duration_seconds,
        "renew_time": at,
        "resource_version": next_resource_version(session),
    }
    if not ours:
        changes["acquire_time"] = at
        changes["lease_transitions"] = (row["lease_transitions"] or 0) + 1
    session.execute(update(leases_t).where(leases_t.c.uid == row["uid"]).values(**changes))
    updated = {**row, **changes}
    _log(session, updated, to_api(updated), "MODIFIED", before=to_api(row))
    return True


def held(session: Session, *, claim: Claim, at: datetime) -> bool:
    """Whether `claim.holder` holds the lease, unexpired, now; the row stays locked until the
    caller's transaction ends, so nobody takes the lease while the caller's write commits."""
    row = _locked(session, claim)
    return row is not None and row["holder_identity"] == claim.holder and not _expired(row, at)


def release(session: Session, *, claim: Claim, at: datetime) -> bool:
    """Give up the lease `claim.holder` holds, as a leader that stops does (client-go's
    ReleaseOnCancel): no holder, no renewal, so the next candidate takes it at its next attempt
    instead of after the lease's duration. False (nothing changed): it held no lease."""
    row = _locked(session, claim)
    if row is None or row["holder_identity"] != claim.holder:
        return False
    changes: dict[str, Any] = {
        "holder_identity": None,
        "renew_time": None,
        "resource_version": next_resource_version(session),
    }
    session.execute(update(leases_t).where(leases_t.c.uid == row["uid"]).values(**changes))
    updated = {**row, **changes}
    _log(session, updated, to_api(updated), "MODIFIED", before=to_api(row))
    return True
