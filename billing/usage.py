"""Usage events and the segments they fold into. Pure: no database, no clock.

A pod's usage is a sequence of events: one `start` (its capacity was bound), any number of
`change` (its spec changed, e.g. an in-place resize) and one `stop` (its capacity was released:
deleted, finished, evicted, its node lost, its GPU failed). Each event carries the second it
took effect; folding a pod's events in time order gives its segments, each billed for the spec
it held from its start to its end. Events may arrive late, twice or out of order: the fold sorts
them and ignores repeats (same id), so the same set of events always gives the same segments.

Time: every instant is truncated to the whole second (`whole_second`), so a pod bound at
10:00:00.7 and released at 10:00:05.2 holds its capacity for 5 s (10:00:00 to 10:00:05), and
the seconds of consecutive segments add up exactly to the seconds between start and stop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

START, CHANGE, STOP = "start", "change", "stop"
KINDS = (START, CHANGE, STOP)
_KIND_ORDER = {START: 0, CHANGE: 1, STOP: 2}


class Reason(StrEnum):
    """Why billing started, changed or stopped: every lifecycle transition that moves capacity."""

    BIND = "bind"  # start: the scheduler bound the pod's capacity
    RESIZE = "resize"  # change: an in-place resize took effect
    DELETE = "delete"  # stop: deleted, and its node stopped it
    FINISH = "finish"  # stop: Succeeded or Failed
    EVICT = "evict"  # stop: evicted
    PREEMPT = "preempt"  # stop: a BestEffort pod preempted for a regular one
    NODE_LOST = "node-lost"  # stop: at its node's last heartbeat
    GPU_FAULT = "gpu-fault"  # stop: at the time its GPU failed
    RECONCILE = "reconcile"  # start or stop written by reconciliation after a restart


KIND_OF_REASON = {
    Reason.BIND: START,
    Reason.RESIZE: CHANGE,
    Reason.DELETE: STOP,
    Reason.FINISH: STOP,
    Reason.EVICT: STOP,
    Reason.PREEMPT: STOP,
    Reason.NODE_LOST: STOP,
    Reason.GPU_FAULT: STOP,
}


def whole_second(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("usage times must be timezone-aware (UTC)")
    return at.astimezone(UTC).replace(microsecond=0)


def event_id(pod_uid: str, kind: str, seq: int) -> str:
    """Deterministic: the same transition always has the same id, so a repeat is ignored."""
    return f"{pod_uid}/{kind}/{seq}"


@dataclass(frozen=True)
class Spec:
    """What a pod holds and is billed for: its sold spec (after rounding up) and GPU share.

    `gpu_vram_mib` / `gpu_core_pct` sum over its GPUs (a whole GPU is all of its VRAM and 100 %).
    """

    cpu_milli: int
    memory_mib: int
    compute_class: str
    qos: str
    gpu_model: str | None = None
    gpu_vram_mib: int = 0
    gpu_core_pct: int = 0


@dataclass(frozen=True)
class PodRef:
    uid: str
    tenant_id: int | None
    namespace: str
    name: str


@dataclass(frozen=True)
class Event:
    id: str
    pod: PodRef
    kind: str
    reason: str
    seq: int
    at: datetime
    spec: Spec | None  # None on a stop
    node_name: str | None = None
    recorded_at: datetime | None = None

    @property
    def order(self) -> tuple[datetime, int, int, str]:
        return (self.at, _KIND_ORDER[self.kind], self.seq, self.id)


@dataclass(frozen=True)
class Transition:
    """One billable lifecycle transition, as the ledger's entry point takes it.

    `at` is when it took effect (a lost node: its last heartbeat; a GPU fault: the fault time),
    not when it was written. `seq` tells repeated transitions of one kind apart (the n-th resize);
    a pod starts and stops once, so theirs is 0.
    """

    pod: PodRef
    reason: Reason
    at: datetime
    spec: Spec | None = None
    seq: int = 0
    node_name: str | None = None
    kind: str | None = None  # only for RECONCILE, which may start or stop

    def event(self, recorded_at: datetime | None = None) -> Event:
        kind = self.kind or KIND_OF_REASON.get(self.reason)
        if kind not in KINDS:
            raise ValueError(f"transition {self.reason} needs kind start or stop")
        if kind != STOP and self.spec is None:
            raise ValueError(f"a {kind} transition needs the spec the pod holds")
        if self.seq < 0:
            raise ValueError("seq must be >= 0")
        return Event(
            id=event_id(self.pod.uid, kind, self.seq),
            pod=self.pod,
            kind=kind,
            reason=str(self.reason),
            seq=self.seq,
            at=whole_second(self.at),
            spec=self.spec if kind != STOP else None,
            node_name=self.node_name,
            recorded_at=recorded_at,
        )


@dataclass(frozen=True)
class Segment:
    """A stretch of time in which a pod held one spec; `end` None while it still holds it."""

    pod: PodRef
    spec: Spec
    start: datetime
    end: datetime | None
    start_event: str
    end_event: str | None = None

    def seconds(self, now: datetime | None = None) -> int:
        end = self.end if self.end is not None else now
        if end is None:
            raise ValueError("an open segment's length needs `now`")
        return max(0, int((end - self.start).total_seconds()))


@dataclass
class PodUsage:
    """A pod's folded usage: its segments, and anything odd in its events (for the audit)."""

    pod: PodRef
    segments: list[Segment] = field(default_factory=list)
    started: datetime | None = None
    stopped: datetime | None = None
    stop_reason: str | None = None
    anomalies: list[str] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.started is not None and self.stopped is None

    def billed_seconds(self, now: datetime | None = None) -> int:
        return sum(s.seconds(now) for s in self.segments)


def fold_pod(events: Iterable[Event]) -> PodUsage:
    """One pod's events (any order, repeats allowed) -> its segments."""
    unique: dict[str, Event] = {}
    for event in events:
        unique.setdefault(event.id, event)
    ordered = sorted(unique.values(), key=lambda e: e.order)
    if not ordered:
        raise ValueError("no events")
    usage = PodUsage(pod=ordered[0].pod)
    current: Segment | None = None
    for event in ordered:
        if usage.stopped is not None:
            usage.anomalies.append(f"{event.id}: {event.kind} after the pod stopped")
            continue
        if event.kind == START:
            if usage.started is not None:
                usage.anomalies.append(f"{event.id}: a second start")
                continue
            assert event.spec is not None
            usage.started = event.at
            current = Segment(usage.pod, event.spec, event.at, None, event.id)
        elif event.kind == CHANGE:
            if current is None:
                usage.anomalies.append(f"{event.id}: change before the pod started")
                continue
            assert event.spec is not None
            if event.spec == current.spec:
                continue
            _append_closed(usage, current, event)
            current = Segment(usage.pod, event.spec, event.at, None, event.id)
        else:
            if current is None:
                usage.anomalies.append(f"{event.id}: stop before the pod started")
                usage.stopped, usage.stop_reason = event.at, event.reason
                continue
            _append_closed(usage, current, event)
            current = None
            usage.stopped, usage.stop_reason = event.at, event.reason
    if current is not None:
        usage.segments.append(current)
    return usage


def _append_closed(usage: PodUsage, segment: Segment, event: Event) -> None:
    """Close `segment` at `event`; a segment of zero seconds is not kept."""
    if event.at > segment.start:
        usage.segments.append(_close(segment, event))


def _close(segment: Segment, event: Event) -> Segment:
    return Segment(
        segment.pod,
        segment.spec,
        segment.start,
        max(event.at, segment.start),
        segment.start_event,
        event.id,
    )


def fold(events: Iterable[Event]) -> dict[str, PodUsage]:
    """Many pods' events -> each pod's usage, keyed by pod uid."""
    by_pod: dict[str, list[Event]] = {}
    for event in events:
        by_pod.setdefault(event.pod.uid, []).append(event)
    return {uid: fold_pod(pod_events) for uid, pod_events in by_pod.items()}


def segments(events: Iterable[Event]) -> list[Segment]:
    return [s for usage in fold(events).values() for s in usage.segments]
