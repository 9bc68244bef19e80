"""The control plane's node loop: the built-in simulation of nodes no agent manages, node
leases, and housekeeping.

A node is *agent-managed* once it has a Lease in `kube-node-lease` (its agent, agent/, runs its
pods and reports their status through the API). Any other node is simulated here: a bound pod's
containers "start" as soon as this loop sees it, a deleted pod is stopped when its grace period
ends, a preempted BestEffort pod when its notice period ends, and a pod on a GPU that failed when
its fault grace period ends (all three through `disruption_deadline`). A `Deferred` in-place
resize is retried here, as the kubelet retries it: each pass gives it the room as soon as its node
has it (another pod ended or shrank); the scheduler is not the place, since it places unbound pods
and a resize never moves a pod. The agent also keeps the change log
and the event table to their retention.

Each pass also reports a heartbeat for every ready node to the usage ledger (where billing of
a pod that vanishes while the control plane is down is closed), and housekeeping closes the
daily statements of days that are over and rolls usage up by the hour (`ledger.roll_up`).

For agent-managed nodes this loop watches the leases: a node whose lease expired is NotReady
(Ready=Unknown, NodeStatusUnknown; the scheduler places nothing there), and after
`node_lost_grace_seconds` its pods fail with reason NodeLost, their billing ended at the last
renewal. A node whose agent renews again is Ready again. A lease expires by this loop's clock,
a lease duration after it saw the renewal (`LeaseWatch`): the renewTime itself is the node's
clock, which may disagree with the control plane's. A node's pods are not billed while it is
silent: from its last renewal when its lease expires (or when two renewals turn out further apart
than the lease, say across a control plane outage, by the renewals kept with the heartbeats even
across this loop's restarts) until it is seen renewing again.

It runs inside `tessera dev` and `tessera serve`'s companion `tessera agent`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from app.budgets import service as budgets
from app.constants import NODE_LEASE_NAMESPACE
from app.db.engine import Database, WriteQueue, current_resource_version, written_between
from app.db.models import Event, Lease, Node, Pod
from app.inventory import service as inventory
from app.kube.meta import now
from app.metrics import notice_given
from app.pods import service as pods
from app.settings import Settings
from app.watch import log as change_log
from billing import ledger

log = logging.getLogger("tessera.agent")
EVENT_RETENTION = timedelta(hours=1)


def _managed() -> Any:
    """The names of agent-managed nodes (those with a Lease in kube-node-lease)."""
    return select(Lease.name).where(Lease.namespace == NODE_LEASE_NAMESPACE)


def run_once(db: Database, *, keep_changes: int, starts: StartCursor | None = None) -> int:
    """One pass; returns how many pods changed state. `starts`: where the last pass's look for
    bound pods to start got to (None: look at every pod)."""
    changed = start_bound(db, starts)
    expired = db.read(_deleted_past_grace)
    changed += _each(db, pods.finalize, expired)
    for uid, conditions in db.read(_disrupted_past_deadline):
        if db.write(lambda s, uid=uid: pods.end_preempted(s, uid=uid)):  # type: ignore[misc]
            changed += 1
            if not pods.fault_disrupted({"conditions": conditions}):
                notice_given(conditions, at=now())
    for uid in db.read(_deferred_resizes_that_fit):
        changed += db.write(lambda s, uid=uid: pods.retry_resize(s, uid=uid))  # type: ignore[misc]
    return changed


def _planned_for_now(session: Session) -> None:
    """PostgreSQL: plan this transaction's queries for their parameters, every time.

    The pass's lookups find the few pods with a column of a partial index set, and run every
    half second on a connection that prepares them. A plan the connection cached when the
    pods table was small (a generic plan, kept once it is prepared) scans the whole table, on
    every pass, until the table is next analysed: in a burst on a fresh database, 2,000 pages
    and 4 ms a lookup at 10,000 pods. Planned for the moment, they use the partial index."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


def _deleted_past_grace(session: Session) -> list[str]:
    _planned_for_now(session)
    return list(session.scalars(select(Pod.uid).where(Pod.deletion_timestamp <= now()).limit(500)))


def _disrupted_past_deadline(session: Session) -> list[tuple[str, list[Any]]]:
    _planned_for_now(session)
    query = select(Pod.uid, Pod.conditions).where(Pod.disruption_deadline <= now()).limit(500)
    return [(uid, conditions) for uid, conditions in session.execute(query)]


START_BATCH = 128  # pods started per transaction: creates wait for the counter lock no longer
START_PASS = 8192  # pods started per pass at most, so a pass always ends
FULL_LOOK_SECONDS = 60.0  # how often the look for bound pods reads every pod again


@dataclass
class StartCursor:
    """How far the node loop has looked for bound pods to start: every pod written up to
    `version` was seen (-1: none yet). A pass reads only the pods written since, by the
    resourceVersion index, not every pod in the Pending phase: that index lookup also walks the
    entries of every pod that was Pending once, until the table is vacuumed (about 1,700 pages
    a pass in a burst of 10,000 pods). Every `FULL_LOOK_SECONDS` a pass reads them all again."""

    version: int = -1
    full_at: float = float("-inf")  # when (monotonic) the last look at every pod was


def start_bound(db: Database, cursor: StartCursor | None = None) -> int:
    """Start the pods the scheduler bound to simulated nodes: `START_BATCH` per transaction,
    until none is left (or `START_PASS` were started); returns how many were started. Each
    batch is read and worked out before its write, which only checks that the pods are as
    read (`pods.apply_updates`). `cursor`: only the pods written since it (and it moves on)."""
    cursor = cursor or StartCursor()
    if time.monotonic() - cursor.full_at > FULL_LOOK_SECONDS:
        cursor.version, cursor.full_at = -1, time.monotonic()
    since = cursor.version
    started = 0
    while started < START_PASS:
        version, rows = db.read(partial(_bound_not_started, since=since))
        if not rows:
            cursor.version = version
            break
        at = now()
        updates = [pods.prepare_start(row, at=at) for row in rows]
        done = db.write(partial(pods.apply_updates, updates=updates))
        started += len(done)
        if len(rows) < START_BATCH and len(done) == len(rows):
            cursor.version = version  # all of them are started: their writes are newer
            break
        if not done:
            break
    return started


def _bound_not_started(session: Session, *, since: int) -> tuple[int, list[Any]]:
    """The store's resourceVersion, and up to `START_BATCH` pods bound to simulated nodes whose
    containers have not started, written after `since` and up to that version (read first:
    what commits later is written above it)."""
    version = current_resource_version(session)
    query = (
        select(Pod.__table__)
        .where(
            Pod.node_name.is_not(None),
            Pod.node_name.not_in(_managed()),  # their agents start them
            Pod.phase == "Pending",
            Pod.deletion_timestamp.is_(None),
        )
        .order_by(Pod.uid)
        .limit(START_BATCH)
    )
    if since >= 0:
        query = query.where(written_between(Pod.resource_version, since, version))
    return version, list(session.execute(query).mappings())


def _each(db: Database, write: Any, uids: list[str]) -> int:
    """`write(session, uid=...)` for every pod, grouped into a few transactions (each pod's
    write in a savepoint of its own, so one that fails is undone alone); how many changed."""
    if not uids:
        return 0
    writer = WriteQueue(db)
    try:
        futures = [writer.submit(partial(write, uid=uid)) for uid in uids]
        return sum(bool(future.result()) for future in futures)
    finally:
        writer.close()


def _deferred_resizes_that_fit(session: Session) -> list[str]:
    """The pods whose Deferred resize their node has the room for now, oldest ask first (the
    write re-checks it under the node's row lock)."""
    _planned_for_now(session)
    return list(
        session.scalars(
            select(Pod.uid)
            .join(Node, Node.name == Pod.node_name)
            .where(
                # "> 0" (a resize asks for some CPU) and not "IS NOT NULL": the same pods, but
                # a table never analysed yet is taken to have almost every row non-null, and
                # scanned whole; an inequality's estimate keeps the partial index.
                Pod.resize_cpu_milli > 0,
                Pod.phase.not_in(pods.TERMINAL_PHASES),
                Pod.deletion_timestamp.is_(None),
                Node.cpu_free_milli >= Pod.resize_cpu_milli - Pod.cpu_milli,
                Node.memory_free_mib >= Pod.resize_memory_mib - Pod.memory_mib,
            )
            .order_by(Pod.resource_version)
            .limit(500)
        )
    )


def heartbeat(db: Database) -> None:
    """The simulated nodes hold their pods as long as they are ready; an agent-managed node
    held them until its lease was last renewed."""

    def work(session: Session) -> None:
        ready = session.scalars(
            select(Node.name).where(Node.ready.is_(True), Node.name.not_in(_managed()))
        )
        ledger.heartbeat(session, nodes=ready, at=now())
        renewed = session.execute(
            select(Lease.name, Lease.renew_time)
            .join(Node, Node.name == Lease.name)
            .where(Lease.namespace == NODE_LEASE_NAMESPACE, Lease.renew_time.is_not(None))
        )
        latest = now()
        for name, at in renewed:
            if at is not None:  # the node's clock: never a heartbeat from the future
                ledger.heartbeat(session, nodes=[name], at=min(at, latest), renewed=at)

    db.write(work)


def _held(session: Session, *, node: str) -> list[str]:
    query = select(Pod.uid).where(Pod.node_name == node, Pod.phase.not_in(pods.TERMINAL_PHASES))
    return list(session.scalars(query))


def _lose(session: Session, *, uid: str, last_heartbeat: datetime) -> bool:
    return pods.node_lost(session, uid=uid, last_heartbeat=last_heartbeat)


@dataclass(frozen=True)
class Renewal:
    """A node lease's last renewal as `LeaseWatch` saw it."""

    renew_time: datetime  # as the node's agent wrote it, by the node's clock
    seen_at: datetime  # when this loop saw it, by this process's clock
    seen_monotonic: float  # the same moment, by this process's monotonic clock
    # seen while this loop watched; False for a renewal found at its start on a node already
    # lost, which is no sign of life (the node stays lost until it renews again)
    alive: bool
    # The renewal before this one, when the node had gone longer than its lease without
    # renewing (its agent was down, or the control plane was): by the node's clock, never later
    # than this loop saw it. Its pods are not billed for that silence.
    silent_since: datetime | None = None


class LeaseWatch:
    """When this loop saw each node lease renewed.

    A lease's renewTime is written by its holder, by the holder's clock. Judged by this
    process's clock, a node whose clock runs a minute behind would be lost (and its pods
    failed) while it renews on time, and one whose clock runs ahead would stay Ready long
    after its agent stopped. So, as Kubernetes' node lifecycle controller does, a lease counts
    as renewed when its renewTime changes, at the moment this loop sees the change, and expires
    a lease duration later by this loop's monotonic clock. A lease first seen when the loop
    starts gets a whole duration from then, unless its node is lost already."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = now,
    ) -> None:
        self.monotonic = monotonic
        self.wall = wall
        self._seen: dict[str, Renewal] = {}
        # What the loop before this one saw last (`ledger.last_renewals`): (renewTime, when);
        # None until read, at this loop's first pass.
        self.remembered: dict[str, tuple[datetime, datetime]] | None = None

    def observe(
        self, name: str, renew_time: datetime, *, lost: bool, lasts: float | None = None
    ) -> tuple[Renewal, bool]:
        """The renewal of `name`'s lease, given its renewTime now (`lost`: its node is), and
        whether it is new. `lasts`: the lease's duration; renewals further apart than that
        (by the node's clock, whoever's clock it is) leave a silence (`silent_since`)."""
        last = self._seen.get(name)
        if last is not None and last.renew_time == renew_time:
            return last, False
        silent_since = None
        before = (last.renew_time, last.seen_at) if last is not None else None
        if before is None and self.remembered:
            before = self.remembered.get(name)  # what the loop before this one saw last
        if (
            before is not None
            and lasts is not None
            and (renew_time - before[0]).total_seconds() > lasts
        ):
            silent_since = min(before)
        seen = Renewal(
            renew_time,
            self.wall(),
            self.monotonic(),
            alive=last is not None or not lost,
            silent_since=silent_since,
        )
        self._seen[name] = seen
        return seen, True

    def forget_all_but(self, names: set[str]) -> None:
        """Drop what was seen of leases that are gone."""
        for name in set(self._seen) - names:
            del self._seen[name]


def check_leases(db: Database, *, settings: Settings, watch: LeaseWatch) -> int:
    """Agent-managed nodes: NotReady once the lease expired, Ready again once renewed, and
    their pods lost `node_lost_grace_seconds` after expiry. Returns how many things changed.
    `watch`: what this loop has seen of the leases so far, kept across passes (a new one sees
    every lease renewed just now)."""
    at, monotonic = watch.wall(), watch.monotonic()
    if watch.remembered is None:
        watch.remembered = db.read(ledger.last_renewals)
    leases = db.read(
        lambda s: list(
            s.execute(
                select(Node.name, Node.lost_since, Lease.renew_time, Lease.lease_duration_seconds)
                .join(Lease, Lease.name == Node.name)
                .where(Lease.namespace == NODE_LEASE_NAMESPACE)
            ).all()
        )
    )
    watch.forget_all_but({name for name, *_ in leases})
    changed = 0
    grace = timedelta(seconds=settings.node_lost_grace_seconds)
    for name, lost_since, renewed, duration in leases:
        if renewed is None:
            continue
        lasts = duration or settings.node_lease_seconds
        seen, new = watch.observe(name, renewed, lost=lost_since is not None, lasts=lasts)
        if new and seen.silent_since is not None:
            # Renewals further apart than the lease (say, the control plane was down and saw
            # none): its pods are billed neither for that silence nor, if the node comes back,
            # less than while it is back.
            db.write(partial(_silent, node=name, since=seen.silent_since))
            log.warning(
                "node %s did not renew its lease from %s until %s: not billed meanwhile",
                name,
                seen.silent_since,
                seen.seen_at,
            )
        if seen.alive and monotonic - seen.seen_monotonic <= lasts:
            if lost_since is not None:
                changed += db.write(lambda s, n=name: inventory.set_lost(s, n, since=None))  # type: ignore[misc]
                log.info("node %s renewed its lease: Ready again", name)
            if new and (lost_since is not None or seen.silent_since is not None):
                db.write(partial(_back, node=name, at=seen.seen_at))
            continue
        # billed to the last renewal, by the node's clock, but never past when it was seen
        last = min(renewed, seen.seen_at)
        if lost_since is None:
            lost_since = seen.seen_at + timedelta(seconds=lasts)
            changed += db.write(lambda s, n=name, e=lost_since: inventory.set_lost(s, n, since=e))  # type: ignore[misc]
            log.warning("node %s: lease expired at %s, NotReady", name, lost_since)
            # Its pods may come back with it, but are not billed while it is silent.
            db.write(partial(_silent, node=name, since=last))
        if at > lost_since + grace:
            for uid in db.read(partial(_held, node=name)):
                changed += db.write(partial(_lose, uid=uid, last_heartbeat=last))
    return changed


def _held_rows(session: Session, node: str) -> list[Any]:
    query = select(Pod.__table__).where(
        Pod.node_name == node, Pod.phase.not_in(pods.TERMINAL_PHASES)
    )
    return list(session.execute(query).mappings())


def _silent(session: Session, *, node: str, since: datetime) -> int:
    """The pods `node` holds are not billed from `since`, its last renewal."""
    return ledger.node_silent(
        session, _held_rows(session, node), node=node, at=since, recorded_at=now()
    )


def _back(session: Session, *, node: str, at: datetime) -> int:
    """`node` renews again (seen at `at`): the pods it still holds are billed again."""
    return ledger.node_back(session, _held_rows(session, node), at=at, recorded_at=now())


def housekeeping(db: Database, *, keep_changes: int, settings: Settings | None = None) -> None:
    settings = settings or Settings()

    def work(session: Session) -> None:
        change_log.compact(session, keep=keep_changes)
        session.execute(delete(Event).where(Event.last_timestamp < now() - EVENT_RETENTION))

    db.write(work)
    db.write(
        lambda s: ledger.close_due(
            s,
            at=now(),
            delay=timedelta(seconds=settings.billing_close_delay_seconds),
            currency=settings.billing_currency,
            minor_digits=settings.billing_minor_digits,
        )
    )
    db.write(lambda s: ledger.roll_up(s, at=now(), currency=settings.billing_currency))


def check_budgets(
    db: Database, *, settings: Settings, at: datetime | None = None
) -> list[budgets.Metered]:
    """Meter the spend of every tenant with limits (app/budgets/service.py): thresholds
    crossed are told, and a spent budget's running pods stopped if it asks for it."""
    money = budgets.Money(settings.billing_currency, settings.billing_minor_digits)
    return db.write(lambda s: budgets.meter(s, at=at or now(), money=money, stop=_stop_for_budget))


def _stop_for_budget(session: Session, row: Any, reached: datetime) -> None:
    pods.stop_for_budget(session, namespace=row["namespace"], name=row["name"], reached=reached)


async def run_forever(
    db: Database, *, keep_changes: int, interval: float = 0.5, settings: Settings | None = None
) -> None:
    settings = settings or Settings()
    ticks = 0
    budget_every = max(1, round(settings.budget_check_seconds / interval))
    starts = StartCursor()
    leases = LeaseWatch()
    log.info("the node loop runs every %.2g s", interval)
    while True:
        try:
            await asyncio.to_thread(run_once, db, keep_changes=keep_changes, starts=starts)
            await asyncio.to_thread(check_leases, db, settings=settings, watch=leases)
            if ticks % 10 == 0:
                await asyncio.to_thread(heartbeat, db)
            if ticks % 120 == 0:
                await asyncio.to_thread(
                    housekeeping, db, keep_changes=keep_changes, settings=settings
                )
            if ticks % budget_every == 0:
                await asyncio.to_thread(check_budgets, db, settings=settings)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("agent pass failed; retrying")
        ticks += 1
        await asyncio.sleep(interval)
