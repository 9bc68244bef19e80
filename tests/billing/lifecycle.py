"""A model of pod lifecycles with a controllable clock, for property tests (never sleeps).

Each pod is bound, may be resized, have its containers crash and restart (capacity stays held:
billing does not change), and ends one of the ways capacity is released: deleted, finished,
evicted, its node lost (released at the node's last heartbeat, before the loss is noticed), its
GPU failed (at the fault time) -- or it is still running when the clock stops. The model knows
the truth (which seconds each pod held which spec); the transitions it emits are what the
control plane would report to the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from billing.usage import PodRef, Reason, Spec, Transition

T0 = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
SPECS = [
    Spec(2000, 4096, "general-purpose", "default"),
    Spec(4000, 8192, "performance", "default"),
    Spec(500, 1024, "general-purpose", "best-effort"),
    Spec(8000, 32768, "gpu", "default", "H200", 20 * 1024, 25),
    Spec(16000, 65536, "gpu", "best-effort", "H200", 2 * 144384, 200),
]
ENDINGS = [Reason.DELETE, Reason.FINISH, Reason.EVICT, Reason.NODE_LOST, Reason.GPU_FAULT, None]


class Clock:
    """Time that moves only when told to."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class PodStory:
    pod: PodRef
    transitions: list[Transition] = field(default_factory=list)
    held: list[tuple[datetime, datetime | None, Spec]] = field(default_factory=list)
    released: datetime | None = None

    def held_seconds(self, now: datetime) -> int:
        total = 0
        for start, end, _ in self.held:
            stop = end if end is not None else now
            total += int(
                (stop.replace(microsecond=0) - start.replace(microsecond=0)).total_seconds()
            )
        return total


@st.composite
def pod_story(draw: st.DrawFn, index: int, clock: Clock) -> PodStory:
    pod = PodRef(
        f"00000000-0000-4000-8000-{index:012d}", 1 + index % 2, f"ns{index % 3}", f"p{index}"
    )
    story = PodStory(pod)
    bound = clock.advance(draw(st.floats(0, 90, allow_nan=False)))
    spec = draw(st.sampled_from(SPECS))
    story.transitions.append(Transition(pod, Reason.BIND, bound, spec, node_name=f"n{index % 4}"))
    story.held.append((bound, None, spec))
    resizes = draw(st.integers(0, 4))
    for seq in range(1, resizes + 1):
        at = clock.advance(draw(st.floats(0, 4000, allow_nan=False)))
        if draw(st.booleans()):
            clock.advance(
                draw(st.floats(0, 30, allow_nan=False))
            )  # a container crash and restart: no change
        new = draw(st.sampled_from(SPECS))
        story.transitions.append(Transition(pod, Reason.RESIZE, at, new, seq=seq))
        start, _, old = story.held[-1]
        story.held[-1] = (start, at, old)
        story.held.append((at, None, new))
    ending = draw(st.sampled_from(ENDINGS))
    if ending is not None:
        lived = clock.advance(draw(st.floats(0, 20000, allow_nan=False)))
        released = lived
        if ending in (Reason.NODE_LOST, Reason.GPU_FAULT):
            # the node's last heartbeat / the fault came before the control plane learns of it,
            # but not before the last change it already recorded
            last = story.held[-1][0]
            released = max(
                last, lived - timedelta(seconds=draw(st.floats(0, 120, allow_nan=False)))
            )
        story.transitions.append(Transition(pod, ending, released))
        start, _, last_spec = story.held[-1]
        story.held[-1] = (start, released, last_spec)
        story.released = released
    return story


@st.composite
def stories(draw: st.DrawFn, max_pods: int = 8) -> tuple[list[PodStory], datetime]:
    clock = Clock()
    count = draw(st.integers(1, max_pods))
    out = [draw(pod_story(i, clock)) for i in range(count)]
    return out, clock.advance(draw(st.floats(0, 3600, allow_nan=False)))
