"""The pure ledger fold: billed seconds equal held seconds for any lifecycle, whatever order or
how many times its events arrive."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from billing.usage import Reason, Transition, fold, fold_pod
from tests.billing.lifecycle import SPECS, T0, PodStory, stories


def _events(story_list: list[PodStory]):
    return [t.event() for s in story_list for t in s.transitions]


@settings(max_examples=300, deadline=None)
@given(stories())
def test_billed_seconds_equal_held_seconds_for_every_pod(data) -> None:
    story_list, now = data
    usage = fold(_events(story_list))
    assert set(usage) == {s.pod.uid for s in story_list}
    for story in story_list:
        pod = usage[story.pod.uid]
        assert pod.anomalies == []
        assert pod.billed_seconds(now) == story.held_seconds(now)
        assert pod.open == (story.released is None)
        # and each second is billed for the spec the pod held then
        billed = [(s.spec, s.seconds(now)) for s in pod.segments]
        held = [
            (
                spec,
                int(((b or now).replace(microsecond=0) - a.replace(microsecond=0)).total_seconds()),
            )
            for a, b, spec in story.held
        ]
        assert _runs(billed) == _runs(held)


def _runs(pieces):
    """Run-length form: adjacent stretches of one spec merged, empty ones dropped."""
    out: list[list] = []
    for spec, seconds in pieces:
        if seconds <= 0:
            continue
        if out and out[-1][0] == spec:
            out[-1][1] += seconds
        else:
            out.append([spec, seconds])
    return out


@settings(max_examples=200, deadline=None)
@given(stories(), st.randoms(use_true_random=False))
def test_replayed_twice_or_shuffled_gives_the_same_segments(data, rnd) -> None:
    story_list, now = data
    events = _events(story_list)
    once = fold(events)
    replayed = events + events
    rnd.shuffle(replayed)
    twice = fold(replayed)
    assert {u: p.segments for u, p in once.items()} == {u: p.segments for u, p in twice.items()}
    assert sum(p.billed_seconds(now) for p in twice.values()) == sum(
        s.held_seconds(now) for s in story_list
    )


def test_late_resize_lands_in_the_right_place() -> None:
    from billing.usage import PodRef

    pod = PodRef("u1", 1, "ns", "p")
    bind = Transition(pod, Reason.BIND, T0, SPECS[0]).event()
    stop = Transition(pod, Reason.DELETE, T0 + timedelta(seconds=100)).event()
    resize = Transition(pod, Reason.RESIZE, T0 + timedelta(seconds=40), SPECS[1], seq=1).event()
    usage = fold_pod([bind, stop, resize])  # the resize arrived after the stop
    assert [(s.spec, s.seconds()) for s in usage.segments] == [(SPECS[0], 40), (SPECS[1], 60)]


def test_a_second_stop_of_another_reason_is_the_same_event() -> None:
    """A pod's capacity is released once: a node loss reported after the delete is a repeat."""
    from billing.usage import PodRef

    pod = PodRef("u1", 1, "ns", "p")
    events = [
        Transition(pod, Reason.BIND, T0, SPECS[0]).event(),
        Transition(pod, Reason.DELETE, T0 + timedelta(seconds=10)).event(),
        Transition(pod, Reason.NODE_LOST, T0 + timedelta(seconds=5)).event(),
    ]
    assert events[1].id == events[2].id
    usage = fold_pod(events)
    assert usage.billed_seconds() == 10 and usage.stop_reason == "delete"


def test_fractions_of_a_second_are_truncated_consistently() -> None:
    from billing.usage import PodRef

    pod = PodRef("u1", 1, "ns", "p")
    usage = fold_pod(
        [
            Transition(pod, Reason.BIND, T0 + timedelta(seconds=0.7), SPECS[0]).event(),
            Transition(pod, Reason.RESIZE, T0 + timedelta(seconds=2.9), SPECS[1], seq=1).event(),
            Transition(pod, Reason.FINISH, T0 + timedelta(seconds=5.2)).event(),
        ]
    )
    assert [s.seconds() for s in usage.segments] == [2, 3]


def test_a_pods_usage_counts_for_the_workload_of_its_start() -> None:
    """The workload the start names holds for every segment, whatever later events carry (a
    pod orphaned after its bind, a pause written from the ledger's own rows without one), and
    in whatever order they arrive."""
    from billing.usage import PodRef

    owned = PodRef("u1", 1, "ns", "web-1", "Deployment/web")
    orphaned = PodRef("u1", 1, "ns", "web-1", None)
    events = [
        Transition(orphaned, Reason.DELETE, T0 + timedelta(seconds=90)).event(),
        Transition(orphaned, Reason.RESIZE, T0 + timedelta(seconds=30), SPECS[1], seq=1).event(),
        Transition(orphaned, Reason.NODE_SILENT, T0 + timedelta(seconds=50), seq=50).event(),
        Transition(orphaned, Reason.NODE_BACK, T0 + timedelta(seconds=60), seq=50).event(),
        Transition(owned, Reason.BIND, T0, SPECS[0]).event(),
    ]
    usage = fold_pod(events)
    assert usage.billed_seconds() == 80
    assert [s.pod.workload for s in usage.segments] == ["Deployment/web"] * 3
