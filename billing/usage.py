"""Usage events and the segments they fold into. Pure: no database, no clock.

A pod's usage is a sequence of events: one `start` (its capacity was bound), any number of
`change` (its spec changed, e.g. an in-place resize), `pause` and `resume` (its node went silent
past its lease and came back: the silence is not billed) and one `stop` (its capacity was
released: deleted, finished, evicted, its node lost, its GPU failed). Each event carries the second it
took effect; folding a pod's events in time order gives its segments, each billed for the spec
it held from its start to its end. Events may arrive late, twice or out of order: the fold sorts
them and ignores repeats (same id), so the same set of events always gives the same segments.

Time: every instant is truncated to the whole second (`whole_second`), so a pod bound at
10:00:00.7 and released at 10:00:05.2 holds its capacity for 5 s (10:00:00 to 10:00:05), and
the seconds of consecutive segments add up exactly to the seconds between start and stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

START, CHANGE, STOP = "start", "change", "stop"
PAUSE, RESUME = "pause", "resume"
KINDS = (START, CHANGE, PAUSE, RESUME, STOP)
# At one second: a start, then a resume, a change, a pause, and a stop last.
_KIND_ORDER = {START: 0, RESUME: 1, CHANGE: 2, PAUSE: 3, STOP: 4}


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
    BUDGET = "budget"  # stop: at the second its tenant's spend limit was reached
    RECONCILE = "reconcile"  # start or stop written by reconciliation after a restart
    NODE_SILENT = "node-silent"  # pause: its node stopped renewing its lease (at the last renewal)
    NODE_BACK = "node-back"  # resume: its node renews again


KIND_OF_REASON = {
    Reason.BIND: START,
    Reason.RESIZE: CHANGE,
    Reason.DELETE: STOP,
    Reason.FINISH: STOP,
    Reason.EVICT: STOP,
    Reason.PREEMPT: STOP,
    Reason.NODE_LOST: STOP,
    Reason.GPU_FAULT: STOP,
    Reason.BUDGET: STOP,
    Reason.NODE_SILENT: PAUSE,
    Reason.NODE_BACK: RESUME,
}


def whole_second(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("usage times must be timezone-aware (UTC)")
    return at.astimezone(UTC).replace(microsecond=0)


def finished_at(statuses: Sequence[Mapping[str, Any]] | None) -> datetime | None:
    """When the pod's containers ended as its node observed them: the latest
    `state.terminated.finishedAt` once every container has one (None while any runs, or when the
    node reported no times)."""
    ends = []
    for status in statuses or []:
        state = status.get("state") if isinstance(status, Mapping) else None
        terminated = state.get("terminated") if isinstance(state, Mapping) else None
        text = terminated.get("finishedAt") if isinstance(terminated, Mapping) else None
        if not isinstance(text, str):
            return None
        try:
            ends.append(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC))
        except ValueError:
            return None
    return max(ends) if ends else None


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
    # The top of its chain of controllers, "Kind/name" (app/workloads.py); None: none owns it.
    # A pod's usage counts for the workload its start event names (what owned it when bound).
    workload: str | None = None


@dataclass(frozen=True)
class Event:
    id: str
    pod: PodRef
    kind: str
    reason: str
    seq: int
    at: datetime
    spec: Spec | None  # None on a stop, a pause and a resume (which bills the spec held)
    node_name: str | None = None
    recorded_at: datetime | None = None

    @property
    def order(self) -> tuple[datetime, int, int, str]:
        return (self.at, _KIND_ORDER[self.kind], self.seq, self.id)


@dataclass(frozen=True)
class Transition:
    """One billable lifecycle transition, as the ledger's entry point takes it.

    `at` is when it took effect (a lost node: its last heartbeat; a GPU fault: the fault time),
    not when it was written. `seq` tells repeated transitions of one kind apart (the n-th resize;
    a pause's second counted from the pod's start, and the resume of that pause the same); a pod
    starts and stops once, so theirs is 0.
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
        if kind not in (STOP, PAUSE, RESUME) and self.spec is None:
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
            spec=self.spec if kind not in (STOP, PAUSE, RESUME) else None,
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
    # Stretches its node was silent and it was not billed: (from, to); to None while it lasts.
    pauses: list[tuple[datetime, datetime | None]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.started is not None and self.stopped is None

    @property
    def paused(self) -> bool:
        return bool(self.pauses) and self.pauses[-1][1] is None

    def paused_seconds(self, now: datetime) -> int:
        """Seconds of its pauses up to its stop (or `now`, if earlier)."""
        end = min(self.stopped, now) if self.stopped is not None else now
        total = 0
        for start, stop in self.pauses:
            stop = end if stop is None else min(stop, end)
            total += max(0, int((stop - start).total_seconds()))
        return total

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
    held: Spec | None = None  # the spec it holds (kept through a pause)
    for event in ordered:
        if usage.stopped is not None:
            # A node silent, or back, after the pod ended there: nothing to bill either way.
            if event.kind not in (PAUSE, RESUME):
                usage.anomalies.append(f"{event.id}: {event.kind} after the pod stopped")
            continue
        if event.kind == START:
            if usage.started is not None:
                usage.anomalies.append(f"{event.id}: a second start")
                continue
            assert event.spec is not None
            usage.pod = event.pod  # its segments name the workload of its start
            usage.started, held = event.at, event.spec
            current = Segment(usage.pod, event.spec, event.at, None, event.id)
        elif event.kind == CHANGE:
            if held is None:
                usage.anomalies.append(f"{event.id}: change before the pod started")
                continue
            assert event.spec is not None
            if event.spec == held:
                continue
            held = event.spec
            if current is None:  # paused: the resume bills the new spec
                continue
            _append_closed(usage, current, event)
            current = Segment(usage.pod, event.spec, event.at, None, event.id)
        elif event.kind == PAUSE:
            if usage.started is None:
                usage.anomalies.append(f"{event.id}: pause before the pod started")
                continue
            if current is None:  # paused already
                continue
            _append_closed(usage, current, event)
            current = None
            usage.pauses.append((event.at, None))
        elif event.kind == RESUME:
            if current is not None or held is None:  # not paused: nothing to resume
                continue
            current = Segment(usage.pod, held, event.at, None, event.id)
            usage.pauses[-1] = (usage.pauses[-1][0], event.at)
        else:
            if usage.started is None:
                usage.anomalies.append(f"{event.id}: stop before the pod started")
                usage.stopped, usage.stop_reason = event.at, event.reason
                continue
            if current is not None:
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
