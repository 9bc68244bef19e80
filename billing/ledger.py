"""The usage ledger: the one billing module that touches the database.

- `record(session, transitions)` is the entry point every lifecycle transition calls, in its
  own transaction, with the time the transition took effect and its reason; it takes a batch (a
  scheduling cycle's binds in one call). Ids are deterministic, duplicates are ignored.
- `segments(...)` reads events back and folds them (`billing.usage`); nothing is ever updated.
- `reconcile(...)` runs at start-up: open usage of a pod that vanished while the control plane
  was down is closed at its node's last heartbeat (never at restart time); a bound pod with no
  start (bound before metering existed) is started at its bind time.
- `node_silent(...)` / `node_back(...)` pause and resume the billing of a node's pods while it
  renews no lease (the node loop calls them); a pod is never billed for its node's silence.
- `audit(...)` checks the ledger against the pod history and what nodes reported
  (`tessera billing audit`).
- `close_day(...)` writes a tenant's final statement of a day; late usage of a closed day
  becomes an adjustment line on the next one. `close_due(...)` closes every day from a tenant's
  first day of usage or of a plan.
- `record_credit(...)`: an operator's credit of a window, shown on statements as its own line.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.orm import Session

from app.constants import NODE_LEASE_NAMESPACE
from app.db.engine import defer_insert, insert_ignoring_duplicates, next_resource_version, upsert
from app.db.models import (
    BillingCredit,
    Change,
    CommitmentTerm,
    GPUDevice,
    Lease,
    Node,
    Pod,
    PriceVersion,
    Statement,
    Tenant,
    UsageEvent,
    UsageHeartbeat,
    UsageHour,
    UsageRollup,
    table,
)
from app.db.models import (
    Event as EventRow,
)
from billing import prices as price_lists
from billing import tally
from billing.commitments import Term, amount_on, settle
from billing.prices import PriceBook
from billing.rating import rate
from billing.statements import (
    CREDIT,
    DayStatement,
    Line,
    adjustment,
    credit_line,
    day_lines,
    from_minor,
    to_minor,
)
from billing.tally import RateKey, TallyKey, Units
from billing.usage import (
    PAUSE,
    RESUME,
    START,
    STOP,
    Event,
    PodRef,
    PodUsage,
    Reason,
    Segment,
    Spec,
    Transition,
    finished_at,
    fold,
    whole_second,
)

log = logging.getLogger("tessera.billing")
events_t = table(UsageEvent)
credits_t = table(BillingCredit)
heartbeats_t = table(UsageHeartbeat)
pods_t = table(Pod)
nodes_t = table(Node)
prices_t = table(PriceVersion)
terms_t = table(CommitmentTerm)
statements_t = table(Statement)
hours_t = table(UsageHour)
rollups_t = table(UsageRollup)
changes_t = table(Change)
k8s_events_t = table(EventRow)
DAY = timedelta(days=1)
TERMINAL = ("Succeeded", "Failed")  # a pod in these phases holds no capacity


# --- writing ----------------------------------------------------------------------------------


def record(
    session: Session, transitions: Sequence[Transition], *, recorded_at: datetime | None = None
) -> None:
    """Append the usage events of `transitions` (one INSERT for the batch; repeats ignored)."""
    if not transitions:
        return
    written = recorded_at or datetime.now(UTC)
    insert_ignoring_duplicates(session, events_t, [_row(t.event(written)) for t in transitions])


def record_at_commit(
    session: Session, transitions: Sequence[Transition], *, recorded_at: datetime
) -> None:
    """`record`, written as the transaction commits with its other deferred rows (one round
    trip): for a writer that does not read the usage back in the same transaction."""
    for transition in transitions:
        row = _row(transition.event(recorded_at))
        defer_insert(session, events_t, row, skip_duplicates=True)


def _row(event: Event) -> dict[str, Any]:
    spec = event.spec
    return {
        "id": event.id,
        "pod_uid": event.pod.uid,
        "tenant_id": event.pod.tenant_id,
        "namespace": event.pod.namespace,
        "pod_name": event.pod.name,
        "kind": event.kind,
        "reason": event.reason,
        "seq": event.seq,
        "at": event.at,
        "recorded_at": event.recorded_at,
        "node_name": event.node_name,
        "compute_class": spec.compute_class if spec else "",
        "qos": spec.qos if spec else "",
        "gpu_model": spec.gpu_model if spec else None,
        "cpu_milli": spec.cpu_milli if spec else 0,
        "memory_mib": spec.memory_mib if spec else 0,
        "gpu_vram_mib": spec.gpu_vram_mib if spec else 0,
        "gpu_core_pct": spec.gpu_core_pct if spec else 0,
        "workload": event.pod.workload,
    }


def pod_ref(pod: Mapping[Any, Any]) -> PodRef:
    return PodRef(pod["uid"], pod["tenant_id"], pod["namespace"], pod["name"], pod.get("workload"))


def pod_spec(
    pod: Mapping[Any, Any], *, shares: Iterable[tuple[int, int]] = (), gpu_model: str | None = None
) -> Spec:
    """What a pod row holds: its sold spec and its GPU shares as (VRAM MiB, SM %) pairs."""
    vram = core = 0
    for memory_mib, core_pct in shares:
        vram += memory_mib
        core += core_pct
    return Spec(
        cpu_milli=pod["cpu_milli"],
        memory_mib=pod["memory_mib"],
        compute_class=pod["compute_class"],
        qos=pod["qos"],
        gpu_model=(gpu_model or pod["gpu_model"]) if vram or core else None,
        gpu_vram_mib=vram,
        gpu_core_pct=core,
    )


def gpu_model_of(session: Session, gpu_name: str) -> str | None:
    return session.scalar(select(GPUDevice.model).where(GPUDevice.name == gpu_name))


def started(
    pod: Mapping[Any, Any],
    *,
    at: datetime,
    node_name: str,
    shares: Sequence[tuple[int, int]],
    gpu_model: str | None,
) -> Transition:
    return Transition(
        pod_ref(pod),
        Reason.BIND,
        at,
        pod_spec(pod, shares=shares, gpu_model=gpu_model),
        node_name=node_name,
    )


def resized(session: Session, pod: Mapping[Any, Any], *, at: datetime) -> Transition:
    """A bound pod's in-place resize took effect at `at`: `pod` is its row as resized, with
    `resizes` counting this one (the event's seq, so a replay of it is ignored). The GPU share,
    which a resize never changes, is carried over."""
    shares = _shares(session, pod["uid"])
    model = gpu_model_of(session, shares[0][0]) if shares else None
    return Transition(
        pod_ref(pod),
        Reason.RESIZE,
        at,
        pod_spec(pod, shares=[(v, c) for _, v, c in shares], gpu_model=model),
        seq=pod["resizes"],
        node_name=pod["node_name"],
    )


def stopped(pod: Mapping[Any, Any], *, at: datetime, reason: Reason) -> Transition:
    return Transition(pod_ref(pod), reason, at, node_name=pod.get("node_name"))


def node_silent(
    session: Session,
    pods: Sequence[Mapping[Any, Any]],
    *,
    node: str,
    at: datetime,
    recorded_at: datetime,
) -> int:
    """The node of `pods` (rows of pods it holds) went silent past its lease: their billing
    pauses at `at`, its last renewal (never before a pod's start). Pods already paused keep
    their pause; a repeat is ignored. So do the pods of that node whose billing stopped after
    `at` (a deletion ended at its grace deadline while the node was silent): the earlier end
    wins. Returns how many were paused."""
    rows = {p["uid"]: p for p in pods}
    for uid, tenant, namespace, name in session.execute(
        select(
            events_t.c.pod_uid, events_t.c.tenant_id, events_t.c.namespace, events_t.c.pod_name
        ).where(
            # (a stop after `at` was recorded after it: the recorded_at index finds it)
            events_t.c.recorded_at >= whole_second(at),
            events_t.c.node_name == node,
            events_t.c.kind == STOP,
            events_t.c.at > whole_second(at),
        )
    ):
        rows.setdefault(
            uid,
            {
                "uid": uid,
                "tenant_id": tenant,
                "namespace": namespace,
                "name": name,
                "node_name": node,
            },
        )
    held = _usage_of(session, list(rows))
    transitions = []
    for row in rows.values():
        pod_usage = held.get(row["uid"])
        if pod_usage is None or pod_usage.started is None or pod_usage.paused:
            continue
        if pod_usage.stopped is not None and pod_usage.stopped <= whole_second(at):
            continue
        assert pod_usage.started is not None
        when = max(whole_second(at), pod_usage.started)
        seq = int((when - pod_usage.started).total_seconds())
        transitions.append(
            Transition(pod_ref(row), Reason.NODE_SILENT, when, seq=seq, node_name=row["node_name"])
        )
    record(session, transitions, recorded_at=recorded_at)
    return len(transitions)


def node_back(
    session: Session, pods: Sequence[Mapping[Any, Any]], *, at: datetime, recorded_at: datetime
) -> int:
    """The node of `pods` renews again: the billing of those paused resumes at `at` (each
    resume names its pause by the pause's seq, so a repeat is ignored). Returns how many."""
    held = _usage_of(session, [p["uid"] for p in pods])
    transitions = []
    for row in pods:
        pod_usage = held.get(row["uid"])
        if pod_usage is None or not pod_usage.open or not pod_usage.paused:
            continue
        assert pod_usage.started is not None
        since = pod_usage.pauses[-1][0]
        seq = int((since - pod_usage.started).total_seconds())
        transitions.append(
            Transition(
                pod_ref(row),
                Reason.NODE_BACK,
                max(whole_second(at), since),
                seq=seq,
                node_name=row["node_name"],
            )
        )
    record(session, transitions, recorded_at=recorded_at)
    return len(transitions)


def _usage_of(session: Session, uids: Sequence[str]) -> dict[str, PodUsage]:
    if not uids:
        return {}
    rows = session.execute(select(events_t).where(events_t.c.pod_uid.in_(list(uids)))).mappings()
    return fold(_event(r) for r in rows)


def heartbeat(
    session: Session, *, nodes: Iterable[str], at: datetime, renewed: datetime | None = None
) -> None:
    """Nodes known to hold their pods at `at` (where reconciliation may close usage);
    `renewed`: their lease's renewTime as seen (one node's)."""
    upsert(
        session,
        heartbeats_t,
        [{"node_name": n, "at": whole_second(at), "renewed": renewed} for n in sorted(set(nodes))],
        update=["at", "renewed"],
    )


def last_renewals(session: Session) -> dict[str, tuple[datetime, datetime]]:
    """Each agent-managed node's renewTime as the node loop last saw it, and that heartbeat."""
    rows = session.execute(
        select(heartbeats_t.c.node_name, heartbeats_t.c.renewed, heartbeats_t.c.at).where(
            heartbeats_t.c.renewed.is_not(None)
        )
    )
    return {name: (renewed, at) for name, renewed, at in rows}


# --- reading ----------------------------------------------------------------------------------


def _event(row: Mapping[Any, Any]) -> Event:
    spec = None
    if row["kind"] not in (STOP, PAUSE, RESUME):
        spec = Spec(
            cpu_milli=row["cpu_milli"],
            memory_mib=row["memory_mib"],
            compute_class=row["compute_class"],
            qos=row["qos"],
            gpu_model=row["gpu_model"],
            gpu_vram_mib=row["gpu_vram_mib"],
            gpu_core_pct=row["gpu_core_pct"],
        )
    return Event(
        id=row["id"],
        pod=PodRef(
            row["pod_uid"], row["tenant_id"], row["namespace"], row["pod_name"], row["workload"]
        ),
        kind=row["kind"],
        reason=row["reason"],
        seq=row["seq"],
        at=row["at"],
        spec=spec,
        node_name=row["node_name"],
        recorded_at=row["recorded_at"],
    )


def events(
    session: Session,
    *,
    tenant_id: int | None = None,
    namespace: str | None = None,
    pod_uid: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[Event]:
    """Every event of the pods whose usage may overlap [start, end), in the caller's scope, in
    the order they took effect (`Event.order`: time, then start before change before stop)."""
    query = select(events_t)
    scope = []
    if tenant_id is not None:
        scope.append(events_t.c.tenant_id == tenant_id)
    if namespace is not None:
        scope.append(events_t.c.namespace == namespace)
    if pod_uid is not None:
        scope.append(events_t.c.pod_uid == pod_uid)
    query = query.where(*scope)
    if end is not None:
        query = query.where(events_t.c.at < end)
    if start is not None:
        done = events_t.alias("done")
        query = query.where(
            ~exists().where(
                done.c.pod_uid == events_t.c.pod_uid, done.c.kind == STOP, done.c.at <= start
            )
        )
    return sorted((_event(r) for r in session.execute(query).mappings()), key=lambda e: e.order)


def usage(session: Session, **scope: Any) -> dict[str, PodUsage]:
    return fold(events(session, **scope))


def segments(session: Session, **scope: Any) -> list[Segment]:
    return [s for u in usage(session, **scope).values() for s in u.segments]


def pod_uid(session: Session, namespace: str, name: str) -> str | None:
    """The uid of a pod by name: the live one, else the last one billed under that name."""
    uid = session.scalar(select(Pod.uid).where(Pod.namespace == namespace, Pod.name == name))
    if uid is None:
        uid = session.scalar(
            select(events_t.c.pod_uid)
            .where(events_t.c.namespace == namespace, events_t.c.pod_name == name)
            .order_by(events_t.c.at.desc())
            .limit(1)
        )
    return uid


def price_book(session: Session, *, currency: str) -> PriceBook:
    versions = [
        price_lists.parse(r.name, r.spec, currency=currency)
        for r in session.execute(select(prices_t.c.name, prices_t.c.spec))
    ]
    return PriceBook(versions)


def commitment_terms(session: Session, tenant_id: int) -> list[Term]:
    rows = session.execute(
        select(terms_t).where(terms_t.c.tenant_id == tenant_id).order_by(terms_t.c.id)
    ).mappings()
    return [Term(r["effective_day"], Decimal(r["amount_minor"]), r["id"]) for r in rows]


# --- reconciliation -------------------------------------------------------------------------


@dataclass
class Reconciled:
    closed: list[Transition] = field(default_factory=list)
    opened: list[Transition] = field(default_factory=list)


def reconcile(session: Session, *, at: datetime) -> Reconciled:
    """Make the ledger agree with live pods after a restart (idempotent)."""
    result = Reconciled()
    open_usage = {uid: u for uid, u in _open_or_bound(session).items() if u.open}
    live = {
        r["uid"]: r
        for r in session.execute(
            select(pods_t).where(pods_t.c.uid.in_(list(open_usage)))
        ).mappings()
    }
    beats = dict(session.execute(select(heartbeats_t.c.node_name, heartbeats_t.c.at)).all())
    for uid, pod_usage in open_usage.items():
        row = live.get(uid)
        if row is not None and row["node_name"] is not None and row["phase"] not in TERMINAL:
            continue
        last_event = max((s.end or s.start for s in pod_usage.segments), default=pod_usage.started)
        assert last_event is not None
        node = _node_of(session, uid)
        seen = beats.get(node) if node else None
        closing = max(min(seen, at), last_event) if seen is not None else last_event
        result.closed.append(
            Transition(pod_usage.pod, Reason.RECONCILE, closing, kind=STOP, node_name=node)
        )
    unmetered = session.execute(
        select(pods_t).where(
            pods_t.c.node_name.is_not(None),
            ~exists().where(events_t.c.pod_uid == pods_t.c.uid, events_t.c.kind == START),
        )
    ).mappings()
    for row in unmetered:
        shares = _shares(session, row["uid"])
        model = gpu_model_of(session, shares[0][0]) if shares else None
        result.opened.append(
            Transition(
                pod_ref(row),
                Reason.RECONCILE,
                row["bound_at"] or at,
                pod_spec(row, shares=[(v, c) for _, v, c in shares], gpu_model=model),
                node_name=row["node_name"],
                kind=START,
            )
        )
    record(session, [*result.opened, *result.closed], recorded_at=at)
    return result


def _open_or_bound(session: Session) -> dict[str, PodUsage]:
    stopped_pods = select(events_t.c.pod_uid).where(events_t.c.kind == STOP)
    rows = session.execute(
        select(events_t).where(events_t.c.pod_uid.not_in(stopped_pods))
    ).mappings()
    return fold(_event(r) for r in rows)


def _node_of(session: Session, uid: str) -> str | None:
    return session.scalar(
        select(events_t.c.node_name)
        .where(events_t.c.pod_uid == uid, events_t.c.node_name.is_not(None))
        .order_by(events_t.c.at.desc())
        .limit(1)
    )


def _shares(session: Session, uid: str) -> list[tuple[str, int, int]]:
    from app.db.models import GPUAllocation

    rows = session.execute(
        select(GPUAllocation.gpu_name, GPUAllocation.vram_mib, GPUAllocation.core_pct).where(
            GPUAllocation.pod_uid == uid
        )
    ).all()
    return [(g, v, c) for g, v, c in rows]


# --- audit ------------------------------------------------------------------------------------


@dataclass
class Audit:
    pods: int = 0
    billed_seconds: int = 0
    held_seconds: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.billed_seconds == self.held_seconds


def audit(
    session: Session,
    *,
    at: datetime,
    tenant_id: int | None = None,
    close_delay: timedelta | None = None,
) -> Audit:
    """The completeness and truth check: every billable transition in the pod history has its
    usage event, billed seconds per pod equal the seconds its capacity was held (its node's
    silences aside), and nothing is billed past what the nodes reported.

    Pod history is what the control plane still has: live pods (bound ones must be billed from
    their bind time and still open), the `Scheduled` events (each bind must have its start at the
    same second) and the change log's deletions of bound pods (each must have its stop). Against
    the truth: a pod billed past the end its node reported (its containers' finishedAt), past
    the grace deadline of its deletion, or past the last renewal of its node while that node is
    lost. With `close_delay`: every day that is due to be closed and has a commitment or usage
    has its closed statement."""
    now = whole_second(at)
    result = Audit()
    all_usage = usage(session, tenant_id=tenant_id)
    scope_pods = select(pods_t)
    if tenant_id is not None:
        scope_pods = scope_pods.where(pods_t.c.tenant_id == tenant_id)
    live = {r["uid"]: r for r in session.execute(scope_pods).mappings()}
    for uid, row in live.items():
        pod_usage = all_usage.get(uid)
        if pod_usage is not None:
            _check_truth(
                result,
                _name(row),
                pod_usage,
                now,
                statuses=row["container_statuses"],
                deadline=row["deletion_timestamp"] if row["node_name"] else None,
            )
        if row["node_name"] is None or row["phase"] in TERMINAL:
            if uid in all_usage and all_usage[uid].open:
                result.problems.append(
                    f"{_name(row)}: holds no capacity ({row['phase']}), but its usage is open"
                )
            continue
        pod_usage = all_usage.get(uid)
        if pod_usage is None or pod_usage.started is None:
            result.problems.append(f"{_name(row)}: bound at {row['bound_at']} but never billed")
            continue
        if row["bound_at"] is not None and pod_usage.started != whole_second(row["bound_at"]):
            result.problems.append(
                f"{_name(row)}: billed from {pod_usage.started}, bound at {row['bound_at']}"
            )
        # A pod whose GPU failed is billed up to the fault, one stopped for its tenant's
        # budget up to the second the limit was reached, and each holds its capacity until it
        # has stopped (its grace period): the stops allowed while a pod is still bound.
        if not pod_usage.open and pod_usage.stop_reason not in (Reason.GPU_FAULT, Reason.BUDGET):
            result.problems.append(f"{_name(row)}: still bound, but billing stopped")
    for uid, pod_usage in all_usage.items():
        result.pods += 1
        label = f"{pod_usage.pod.namespace}/{pod_usage.pod.name} ({uid})"
        result.problems += [f"{label}: {a}" for a in pod_usage.anomalies]
        if pod_usage.started is None:
            continue
        end = pod_usage.stopped if pod_usage.stopped is not None else now
        held = max(0, int((end - pod_usage.started).total_seconds()))
        held -= pod_usage.paused_seconds(now)
        billed = pod_usage.billed_seconds(now)
        result.held_seconds += held
        result.billed_seconds += billed
        if billed != held:
            result.problems.append(f"{label}: billed {billed} s, held {held} s")
        if pod_usage.open and uid not in live:
            result.problems.append(f"{label}: gone, but its usage is open (run reconcile)")
    binds = select(k8s_events_t.c.involved_uid, k8s_events_t.c.first_timestamp).where(
        k8s_events_t.c.reason == "Scheduled", k8s_events_t.c.involved_kind == "Pod"
    )
    if tenant_id is not None:
        binds = binds.where(k8s_events_t.c.tenant_id == tenant_id)
    for uid, when in session.execute(binds):
        pod_usage = all_usage.get(uid)
        if pod_usage is None or pod_usage.started != whole_second(when):
            result.problems.append(
                f"pod {uid}: bound at {when} (event Scheduled) but not billed from then"
            )
    deletions = select(changes_t.c.object).where(
        changes_t.c.kind == "Pod", changes_t.c.type == "DELETED"
    )
    if tenant_id is not None:
        deletions = deletions.where(changes_t.c.tenant_id == tenant_id)
    for (obj,) in session.execute(deletions):
        if not obj.get("spec", {}).get("nodeName"):
            continue
        uid = obj["metadata"]["uid"]
        pod_usage = all_usage.get(uid)
        label = f"{obj['metadata']['namespace']}/{obj['metadata']['name']} ({uid})"
        if pod_usage is None or pod_usage.stopped is None:
            result.problems.append(f"{label}: removed while bound, but billing never stopped")
            continue
        deadline = obj["metadata"].get("deletionTimestamp")
        _check_truth(
            result,
            label,
            pod_usage,
            now,
            statuses=obj.get("status", {}).get("containerStatuses"),
            deadline=_parse(deadline) if isinstance(deadline, str) else None,
        )
    _check_lost_nodes(session, result, all_usage, now)
    if close_delay is not None:
        _check_statements(session, result, at=at, delay=close_delay, tenant_id=tenant_id)
    return result


def _parse(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def _billed_until(pod_usage: PodUsage, now: datetime) -> datetime | None:
    """The last second a pod is billed for (its last segment's end, `now` while one is open)."""
    ends = [s.end if s.end is not None else now for s in pod_usage.segments]
    return max(ends) if ends else None


def _check_truth(
    result: Audit,
    label: str,
    pod_usage: PodUsage,
    now: datetime,
    *,
    statuses: Any,
    deadline: datetime | None,
) -> None:
    """A pod billed past the end its node reported, or past its deletion's grace deadline."""
    until = _billed_until(pod_usage, now)
    if until is None:
        return
    reported = finished_at(statuses) if isinstance(statuses, list) else None
    # (a pod its node saw end before its bind is billed from the bind, not flagged)
    if (
        pod_usage.stopped is not None
        and reported is not None
        and until > max(whole_second(reported), pod_usage.started or until)
    ):
        result.problems.append(
            f"{label}: billed until {until.isoformat()}, past the end its node reported "
            f"({whole_second(reported).isoformat()})"
        )
    if deadline is not None and until > whole_second(deadline):
        result.problems.append(
            f"{label}: billed until {until.isoformat()}, past its deletion's grace deadline "
            f"({whole_second(deadline).isoformat()})"
        )


def _check_lost_nodes(
    session: Session, result: Audit, all_usage: Mapping[str, PodUsage], now: datetime
) -> None:
    """No pod of a node that is lost is billed past that node's last renewal."""
    lost: dict[str, datetime] = {
        name: renewed
        for name, renewed in session.execute(
            select(Node.name, Lease.renew_time)
            .join(Lease, Lease.name == Node.name)
            .where(
                Lease.namespace == NODE_LEASE_NAMESPACE,
                Node.lost_since.is_not(None),
                Lease.renew_time.is_not(None),
            )
        )
        if renewed is not None
    }
    if not lost:
        return
    nodes = dict(
        session.execute(
            select(events_t.c.pod_uid, events_t.c.node_name).where(
                events_t.c.kind == START, events_t.c.node_name.in_(list(lost))
            )
        ).all()
    )
    for uid, node in nodes.items():
        pod_usage = all_usage.get(uid)
        if pod_usage is None:
            continue
        until = _billed_until(pod_usage, now)
        last = whole_second(lost[node])
        if until is not None and until > max(last, pod_usage.started or last):
            result.problems.append(
                f"{pod_usage.pod.namespace}/{pod_usage.pod.name} ({uid}): billed until "
                f"{until.isoformat()}, past the last renewal of its lost node {node} "
                f"({last.isoformat()})"
            )


def _check_statements(
    session: Session, result: Audit, *, at: datetime, delay: timedelta, tenant_id: int | None
) -> None:
    """Every day due to be closed (over for `delay`) that has a commitment or usage has its
    closed statement: none is missing, none is still provisional."""
    last_day = (at - delay).date() - DAY
    tenants = session.execute(
        select(Tenant.id, Tenant.name).where(
            *([Tenant.id == tenant_id] if tenant_id is not None else [])
        )
    ).all()
    for tid, name in tenants:
        closed = set(
            session.scalars(
                select(statements_t.c.day).where(
                    statements_t.c.tenant_id == tid, statements_t.c.day <= last_day
                )
            )
        )
        for day, why in _billable_days(session, tid, last_day=last_day):
            if day not in closed:
                due = day_start(day) + DAY + delay
                result.problems.append(
                    f"tenant {name}: {day.isoformat()} has {why} but no closed statement "
                    f"(due at {due.isoformat()}; still Provisional)"
                )


def _name(row: Mapping[Any, Any]) -> str:
    return f"{row['namespace']}/{row['name']} ({row['uid']})"


# --- statements -----------------------------------------------------------------------------


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def compute_day(
    session: Session,
    *,
    tenant_id: int,
    day: date,
    now: datetime,
    book: PriceBook,
    minor_digits: int,
    warn_free: bool = False,
) -> DayStatement:
    """A day's statement from the ledger as it is now (provisional until the day is closed).
    `warn_free`: log a warning for usage rated at a price of 0 (or before any price)."""
    start = day_start(day)
    end = start + DAY
    pieces = [
        piece
        for segment in segments(session, tenant_id=tenant_id, start=start, end=end)
        for piece in rate(segment, book, start=start, end=end, now=now)
    ]
    if warn_free:
        free = sorted(
            {
                (piece.price or "no price", resource)
                for piece in pieces
                for resource, quantity in piece.quantities.items()
                if quantity and not piece.amounts.get(resource)
            }
        )
        for price, resource in free:
            log.warning(
                "tenant %s, %s: usage of %s rated at a price of 0 (%s)",
                tenant_id,
                day.isoformat(),
                resource,
                price,
            )
    commitment = from_minor(int(amount_on(day, commitment_terms(session, tenant_id))), minor_digits)
    prices = book.at(start)
    tiers = prices.tiers if prices else ()
    statement = day_lines(
        day, pieces, commitment=commitment, tiers=tiers, minor_digits=minor_digits
    )
    found = credits(session, tenant_id=tenant_id, start=start, end=end)
    if not found:
        return statement
    owed = statement.total_minor
    usage_total = sum((piece.amount for piece in pieces), Decimal(0))
    overage = settle(usage_total, commitment, tiers).overage if commitment > 0 else None
    lines = list(statement.lines)
    for credit in found:
        lo, hi = max(start, credit["start_at"]), min(end, credit["end_at"])
        inside = Decimal(0)
        for piece in pieces:  # the window's part of each, at the prices it was rated at
            a, b = max(lo, piece.start), min(hi, piece.end)
            if a < b:
                for part in rate(piece.segment, book, start=a, end=b, now=now):
                    inside += part.amount
        if overage is not None:
            inside = min(inside, overage)
        amount = min(to_minor(inside, minor_digits), max(owed, 0))
        owed -= amount
        lines.append(
            credit_line(
                credit=credit["id"],
                reason=credit["reason"],
                day=day,
                window=(_stamp(credit["start_at"]), _stamp(credit["end_at"])),
                amount_minor=amount,
            )
        )
    return DayStatement(day, tuple(lines))


def _stamp(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


# --- credits ----------------------------------------------------------------------------------


def record_credit(
    session: Session,
    *,
    tenant_id: int | None,
    start: datetime,
    end: datetime,
    reason: str,
    at: datetime,
) -> dict[str, Any]:
    """An operator credits [start, end) to one tenant (or every tenant): a new entry, never an
    edit. Statements show it as a line (`compute_day`); one of a day already closed goes on
    the next statement."""
    values = {
        "id": str(uuid.uuid4()),
        "tenant_id": tenant_id,
        "start_at": whole_second(start),
        "end_at": whole_second(end),
        "reason": reason,
        "recorded_at": at,
    }
    session.execute(credits_t.insert().values(**values))
    return values


def credits(
    session: Session,
    *,
    tenant_id: int,
    start: datetime,
    end: datetime,
    recorded_after: datetime | None = None,
) -> list[Mapping[str, Any]]:
    """The credits of a tenant (its own and every tenant's) that overlap [start, end), oldest
    first."""
    query = select(credits_t).where(
        or_(credits_t.c.tenant_id == tenant_id, credits_t.c.tenant_id.is_(None)),
        credits_t.c.start_at < end,
        credits_t.c.end_at > start,
    )
    if recorded_after is not None:
        query = query.where(credits_t.c.recorded_at > recorded_after)
    ordered = query.order_by(credits_t.c.recorded_at, credits_t.c.id)
    return [dict(r) for r in session.execute(ordered).mappings()]


def closed_statement(session: Session, tenant_id: int, day: date) -> Mapping[Any, Any] | None:
    return (
        session.execute(
            select(statements_t).where(
                statements_t.c.tenant_id == tenant_id, statements_t.c.day == day
            )
        )
        .mappings()
        .first()
    )


def close_day(
    session: Session,
    *,
    tenant_id: int,
    day: date,
    at: datetime,
    currency: str,
    minor_digits: int,
) -> tuple[Mapping[Any, Any], bool]:
    """Write the final statement of `day` (which must be over); returns (row, newly closed).

    Closing twice returns the statement already written: a closed statement never changes."""
    if day_start(day) + DAY > at:
        from app.errors import Conflict

        raise Conflict(f"{day.isoformat()} is not over yet: a day closes after midnight UTC")
    existing = closed_statement(session, tenant_id, day)
    if existing is not None:
        return existing, False
    tenant = session.scalar(select(Tenant.name).where(Tenant.id == tenant_id)) or str(tenant_id)
    book = price_book(session, currency=currency)
    statement = compute_day(
        session,
        tenant_id=tenant_id,
        day=day,
        now=at,
        book=book,
        minor_digits=minor_digits,
        warn_free=True,
    )
    lines = list(statement.lines)
    lines += _adjustments(
        session, tenant_id=tenant_id, before=day, at=at, book=book, minor_digits=minor_digits
    )
    values = {
        "uid": str(uuid.uuid4()),
        "tenant_id": tenant_id,
        "tenant": tenant,
        "day": day,
        "resource_version": next_resource_version(session),
        "closed_at": at,
        "currency": currency,
        "total_minor": sum(line.amount_minor for line in lines if line.owed),
        "lines": [line.to_json(minor_digits) for line in lines],
    }
    session.execute(statements_t.insert().values(**values))
    return values, True


def _adjustments(
    session: Session,
    *,
    tenant_id: int,
    before: date,
    at: datetime,
    book: PriceBook,
    minor_digits: int,
) -> list[Line]:
    """Closed days that usage arrived for after they were closed: what each comes to now,
    minus what was billed for it (its own lines, and adjustments already made for it)."""
    closed = list(
        session.execute(
            select(statements_t)
            .where(statements_t.c.tenant_id == tenant_id, statements_t.c.day < before)
            .order_by(statements_t.c.day)
        ).mappings()
    )
    out: list[Line] = []
    for row in closed:
        start = day_start(row["day"])
        late = session.scalar(
            select(func.count())
            .select_from(events_t)
            .where(
                and_(
                    events_t.c.tenant_id == tenant_id,
                    events_t.c.recorded_at > row["closed_at"],
                    events_t.c.at < start + DAY,
                )
            )
        )
        day = row["day"].isoformat()
        # what was billed for the day: its own lines, and what later statements added for it
        billed = sum(
            Line.from_json(line, minor_digits).amount_minor
            for line in row["lines"]
            if line["owed"] and line["kind"] != "adjustment" and line.get("day") in (None, day)
        )
        applied = {line["credit"] for line in row["lines"] if line["kind"] == CREDIT}
        for later in closed:
            if later["day"] <= row["day"]:
                continue
            for line in later["lines"]:
                if line["kind"] in ("adjustment", CREDIT) and line.get("day") == day:
                    billed += Line.from_json(line, minor_digits).amount_minor
                    if line["kind"] == CREDIT:
                        applied.add(line["credit"])
        pending = [
            c
            for c in credits(session, tenant_id=tenant_id, start=start, end=start + DAY)
            if c["recorded_at"] > row["closed_at"] and c["id"] not in applied
        ]
        if not late and not pending:
            continue
        now = compute_day(
            session,
            tenant_id=tenant_id,
            day=row["day"],
            now=at,
            book=book,
            minor_digits=minor_digits,
        )
        fresh = [line for line in now.lines if line.kind == CREDIT and line.credit not in applied]
        line = adjustment(row["day"], billed, now.total_minor - sum(c.amount_minor for c in fresh))
        if line is not None:
            out.append(line)
        out += fresh  # a credit of a closed day: on this statement, naming its day
    return out


def first_day(session: Session, tenant_id: int) -> date | None:
    """The first day a tenant has statements for: its first usage, or the first day of its
    first plan, whichever is earlier (None: neither yet). Every day from then on has one."""
    used = session.scalar(select(func.min(events_t.c.at)).where(events_t.c.tenant_id == tenant_id))
    planned = session.scalar(
        select(func.min(terms_t.c.effective_day)).where(
            terms_t.c.tenant_id == tenant_id, terms_t.c.amount_minor > 0
        )
    )
    days = [d for d in (used.date() if used is not None else None, planned) if d is not None]
    return min(days) if days else None


def _billable_days(session: Session, tenant_id: int, *, last_day: date) -> list[tuple[date, str]]:
    """Every day from the tenant's first through `last_day`, and what it has (for the audit)."""
    first = first_day(session, tenant_id)
    terms = commitment_terms(session, tenant_id)
    out = []
    day = first
    while day is not None and day <= last_day:
        amount = amount_on(day, terms)
        out.append((day, "a commitment" if amount > 0 else "statements since its first usage"))
        day += DAY
    return out


def close_due(
    session: Session,
    *,
    at: datetime,
    delay: timedelta,
    currency: str,
    minor_digits: int,
    only: int | None = None,
) -> int:
    """Close every tenant's days that ended at least `delay` ago, from its first day (of usage
    or of a plan, `first_day`) on: a day of a plan is closed, and charged, with no usage at all.
    `only`: one tenant's."""
    last_day = (at - delay).date() - DAY
    count = 0
    query = select(Tenant.id)
    if only is not None:
        query = query.where(Tenant.id == only)
    for tenant_id in session.execute(query).scalars().all():
        first = first_day(session, tenant_id)
        latest = session.scalar(
            select(func.max(statements_t.c.day)).where(statements_t.c.tenant_id == tenant_id)
        )
        if first is None:
            continue
        day = latest + DAY if latest is not None else first
        while day <= last_day:
            _, new = close_day(
                session,
                tenant_id=tenant_id,
                day=day,
                at=at,
                currency=currency,
                minor_digits=minor_digits,
            )
            count += new
            day += DAY
    return count


# --- hourly rollups ---------------------------------------------------------------------------
#
# A report over closed hours reads what the rollups hold for them instead of every event. They are
# derived (a tally of each tenant's hour, `billing.tally`), rebuilt from the events, never the
# truth: an event recorded after an hour was rolled that reaches back into it (a late stop, a
# reconciled close at a node's last heartbeat) makes that hour and every later one stale at once,
# for readers and for the next `roll_up`, which rebuilds them.

HOUR = timedelta(hours=1)
# A transaction that wrote an event may commit this long after the event's `recorded_at`; events
# recorded this close before a rollup was computed count as late, so none is missed.
LATE_MARGIN = timedelta(minutes=5)
# Hours are rolled once they ended this long ago: longer than LATE_MARGIN, so that the events of
# an hour written on time are not taken for late ones. A first roll reaches back at most
# ROLL_BACKLOG per pass.
ROLL_SETTLE = timedelta(minutes=10)
ROLL_BACKLOG = timedelta(days=7)


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def ceil_hour(at: datetime) -> datetime:
    floor = floor_hour(at)
    return floor if floor == at else floor + HOUR


def _stale_from(session: Session, tenant_id: int, state: Mapping[Any, Any]) -> datetime | None:
    """The hour from which the tenant's rollups no longer hold: that of the earliest late event."""
    late = session.scalar(
        select(func.min(events_t.c.at)).where(
            events_t.c.tenant_id == tenant_id,
            events_t.c.recorded_at > state["computed_at"] - LATE_MARGIN,
            events_t.c.at < state["rolled_until"],
        )
    )
    return floor_hour(late) if late is not None else None


def roll_up(session: Session, *, at: datetime, currency: str, tenant_id: int | None = None) -> int:
    """Roll every tenant's (or one tenant's) hours that ended `ROLL_SETTLE` ago, and rebuild
    stale ones; returns how many tenant-hours were (re)computed."""
    target = floor_hour(at - ROLL_SETTLE)
    book = price_book(session, currency=currency)
    states = {r["tenant_id"]: r for r in session.execute(select(rollups_t)).mappings()}
    scope = (
        events_t.c.tenant_id.is_not(None)
        if tenant_id is None
        else (events_t.c.tenant_id == tenant_id)
    )
    firsts = session.execute(
        select(events_t.c.tenant_id, func.min(events_t.c.at))
        .where(scope)
        .group_by(events_t.c.tenant_id)
    ).all()
    count = 0
    for tenant, first in firsts:
        state = states.get(tenant)
        if state is None:
            lo, until = floor_hour(first), None
        else:
            until = state["rolled_until"]
            stale = _stale_from(session, tenant, state)
            lo = min(until, stale) if stale is not None else until
        hi = target if until is not None and lo < until else min(target, lo + ROLL_BACKLOG)
        if lo >= hi:
            continue
        count += _roll(session, tenant, lo, hi, at=at, book=book)
        upsert(
            session,
            rollups_t,
            [{"tenant_id": tenant, "rolled_until": hi, "computed_at": at}],
            update=("rolled_until", "computed_at"),
        )
    return count


def _roll(
    session: Session, tenant_id: int, lo: datetime, hi: datetime, *, at: datetime, book: PriceBook
) -> int:
    entries = tally.add(
        {},
        segments(session, tenant_id=tenant_id, start=lo, end=hi),
        book,
        start=lo,
        end=hi,
        now=at,
        step=int(HOUR.total_seconds()),
        pods=False,
    )
    session.execute(
        hours_t.delete().where(
            hours_t.c.tenant_id == tenant_id, hours_t.c.hour >= lo, hours_t.c.hour < hi
        )
    )
    rows = [
        {
            "tenant_id": tenant_id,
            "hour": key.bucket,
            "namespace": key.namespace,
            "workload": key.workload or "",
            "compute_class": key.rate.compute_class,
            "qos": key.rate.qos,
            "gpu_model": key.rate.gpu_model or "",
            "price": key.rate.price or "",
            "gpu": key.rate.gpu,
            "cpu_milli_s": units[0],
            "memory_mib_s": units[1],
            "vram_mib_s": units[2],
            "core_pct_s": units[3],
        }
        for key, units in entries.items()
    ]
    # An upsert: two housekeeping passes rolling the same hours compute the same rows.
    upsert(
        session, hours_t, rows, update=("cpu_milli_s", "memory_mib_s", "vram_mib_s", "core_pct_s")
    )
    return int((hi - lo) / HOUR)


def rolled_hours(
    session: Session,
    *,
    tenant_id: int,
    start: datetime,
    end: datetime,
    namespace: str | None = None,
) -> tuple[tuple[datetime, datetime] | None, dict[TallyKey, Units]]:
    """The whole hours of [start, end) the tenant's rollups hold as they stand, and their tally
    (keyed without pods); (None, {}) when they hold none of it."""
    state = (
        session.execute(select(rollups_t).where(rollups_t.c.tenant_id == tenant_id))
        .mappings()
        .first()
    )
    if state is None:
        return None, {}
    valid = state["rolled_until"]
    stale = _stale_from(session, tenant_id, state)
    if stale is not None:
        valid = min(valid, stale)
    lo, hi = ceil_hour(start), min(valid, floor_hour(end))
    if lo >= hi:
        return None, {}
    query = select(hours_t).where(
        hours_t.c.tenant_id == tenant_id, hours_t.c.hour >= lo, hours_t.c.hour < hi
    )
    if namespace is not None:
        query = query.where(hours_t.c.namespace == namespace)
    entries: dict[TallyKey, Units] = {}
    for r in session.execute(query).mappings():
        rate_key = RateKey(
            r["compute_class"], r["qos"], r["gpu_model"] or None, r["price"] or None, r["gpu"]
        )
        entries[TallyKey(r["hour"], r["namespace"], None, rate_key, r["workload"] or None)] = [
            r["cpu_milli_s"],
            r["memory_mib_s"],
            r["vram_mib_s"],
            r["core_pct_s"],
        ]
    return (lo, hi), entries
