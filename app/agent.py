"""The node agent: runs bound pods and removes terminated ones.

Tessera's nodes here are simulated: a bound pod's containers "start" as soon as the agent sees
it, and a deleted pod is stopped when its grace period ends. The agent also keeps the change log
and the event table to their retention.

It runs inside `tessera dev`, or alone as `tessera agent`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.engine import Database
from app.db.models import Event, Pod
from app.kube.meta import now
from app.pods import service as pods
from app.watch import log as change_log

log = logging.getLogger("tessera.agent")
EVENT_RETENTION = timedelta(hours=1)


def run_once(db: Database, *, keep_changes: int) -> int:
    """One pass; returns how many pods changed state."""
    changed = 0
    to_start = db.read(
        lambda s: list(
            s.scalars(
                select(Pod.uid)
                .where(
                    Pod.node_name.is_not(None),
                    Pod.phase == "Pending",
                    Pod.deletion_timestamp.is_(None),
                )
                .limit(500)
            )
        )
    )
    for uid in to_start:
        changed += db.write(lambda s, uid=uid: pods.start(s, uid=uid))  # type: ignore[misc]
    expired = db.read(
        lambda s: list(s.scalars(select(Pod.uid).where(Pod.deletion_timestamp <= now()).limit(500)))
    )
    for uid in expired:
        changed += db.write(lambda s, uid=uid: pods.finalize(s, uid=uid))  # type: ignore[misc]
    return changed


def housekeeping(db: Database, *, keep_changes: int) -> None:
    def work(session: Session) -> None:
        change_log.compact(session, keep=keep_changes)
        session.execute(delete(Event).where(Event.last_timestamp < now() - EVENT_RETENTION))

    db.write(work)


async def run_forever(db: Database, *, keep_changes: int, interval: float = 0.5) -> None:
    ticks = 0
    while True:
        try:
            await asyncio.to_thread(run_once, db, keep_changes=keep_changes)
            if ticks % 120 == 0:
                await asyncio.to_thread(housekeeping, db, keep_changes=keep_changes)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("agent pass failed; retrying")
        ticks += 1
        await asyncio.sleep(interval)
