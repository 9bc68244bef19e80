"""Billing follows what the platform could deliver: a node that goes longer than its lease
without renewing (its agent died, or the control plane was down and saw no renewal) is not
billed for that silence, and its pods are billed again once it renews; a node that never comes
back ends its pods' billing at its last renewal, whether they still exist or not.

The node loop's pass (`check_leases`) on a real database of each backend, with the test's
clocks: a day-long outage passes in no time."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from app import agent
from app.db.engine import Database
from app.pods import service as pods
from billing import ledger
from billing.usage import PodUsage, whole_second
from tests.db.test_capacity import make_pods
from tests.db.test_node_leases import DURATION, Clocks, _node_with_lease, _pass, _pod, _renew


def _bound(db: Database, node: str) -> tuple[str, str]:
    namespace, names = make_pods(db, 1, cpu="1", memory="2Gi")
    db.write(lambda s: pods.bind(s, namespace=namespace, name=names[0], node_name=node, gpus=[]))
    return namespace, names[0]


def _usage(db: Database, namespace: str, name: str) -> PodUsage:
    def read(session: Any) -> PodUsage:
        uid = ledger.pod_uid(session, namespace, name)
        return ledger.usage(session, pod_uid=uid)[uid]

    return db.read(read)


def _renewing(db: Database, node: str, clocks: Clocks, watch: Any, until: float) -> datetime:
    """The node renews every 10 s until `until` (seconds in); returns its last renewal."""
    last = clocks.wall()
    while clocks.seconds + 10 <= until:
        clocks.seconds += 10
        last = clocks.wall()
        _renew(db, node, last)
        _pass(db, watch)
    return last


def test_a_silent_node_is_not_billed_for_its_silence_and_is_once_back(db: Database) -> None:
    clocks = Clocks()
    node = _node_with_lease(db, clocks.wall())
    namespace, name = _bound(db, node)
    watch = clocks.watch()
    _pass(db, watch)
    last = _renewing(db, node, clocks, watch, until=100)
    clocks.seconds += DURATION + 1  # its agent stopped: the lease expired, the node is NotReady
    _pass(db, watch)
    usage = _usage(db, namespace, name)
    assert usage.open and usage.pauses == [(whole_second(last), None)]
    assert _pod(db, namespace, name)["phase"] == "Pending"  # still its: the grace is 300 s
    clocks.seconds += 60  # its agent is back
    back = clocks.wall()
    _renew(db, node, back)
    _pass(db, watch)
    _renewing(db, node, clocks, watch, until=clocks.seconds + 100)
    usage = _usage(db, namespace, name)
    assert usage.pauses == [(whole_second(last), whole_second(back))]
    assert usage.started is not None
    lived = int((whole_second(clocks.wall()) - usage.started).total_seconds())
    silent = int((whole_second(back) - whole_second(last)).total_seconds())
    assert usage.billed_seconds(clocks.wall()) == lived - silent
    assert silent >= DURATION + 1


def test_a_control_plane_outage_is_billed_only_where_the_node_renewed(db: Database) -> None:
    clocks = Clocks()
    quiet = _node_with_lease(db, clocks.wall())  # its agent died with the control plane
    renewing = _node_with_lease(db, clocks.wall())  # its agent renewed (only the node loop died)
    pods_of = {node: _bound(db, node) for node in (quiet, renewing)}
    watch = clocks.watch()
    _pass(db, watch)
    last = clocks.wall()
    for _ in range(5):
        clocks.seconds += 10
        last = clocks.wall()
        for node in (quiet, renewing):
            _renew(db, node, last)
        _pass(db, watch)
    # The node loop is down for 200 s: `renewing` renews all along, `quiet` not at all.
    for _ in range(20):
        clocks.seconds += 10
        _renew(db, renewing, clocks.wall())
    restarted = clocks.watch()
    _pass(db, restarted)
    clocks.seconds += 1  # both agents renew as soon as they can
    back = clocks.wall()
    for node in (quiet, renewing):
        _renew(db, node, back)
    _pass(db, restarted)
    clocks.seconds += 30
    for node in (quiet, renewing):
        _renew(db, node, clocks.wall())
    _pass(db, restarted)

    usage = _usage(db, *pods_of[renewing])
    assert usage.pauses == []
    assert usage.started is not None
    lived = int((whole_second(clocks.wall()) - usage.started).total_seconds())
    assert usage.billed_seconds(clocks.wall()) == lived
    usage = _usage(db, *pods_of[quiet])
    assert usage.pauses == [(whole_second(last), whole_second(back))]
    assert usage.started is not None  # its own start: the two binds may straddle a second
    lived = int((whole_second(clocks.wall()) - usage.started).total_seconds())
    assert usage.billed_seconds(clocks.wall()) == lived - int((back - last).total_seconds())


def test_a_node_dead_through_a_day_long_outage_is_billed_to_its_last_renewal(
    db: Database,
) -> None:
    clocks = Clocks()
    node = _node_with_lease(db, clocks.wall())
    namespace, name = _bound(db, node)
    watch = clocks.watch()
    _pass(db, watch)
    last = _renewing(db, node, clocks, watch, until=207)  # 00:03:27, then its agent is gone
    clocks.seconds = 86400.0  # the control plane is back a day later; the node never is
    restarted = clocks.watch()
    _pass(db, restarted)  # a fresh duration for every node: the loop cannot tell yet
    clocks.seconds += DURATION + 1
    _pass(db, restarted)
    usage = _usage(db, namespace, name)
    assert usage.started is not None
    to_last = int((whole_second(last) - usage.started).total_seconds())
    # NotReady: billed to its last renewal already, though the pod fails only after the grace.
    assert usage.open and usage.billed_seconds(clocks.wall()) == to_last
    assert _pod(db, namespace, name)["phase"] == "Pending"
    clocks.seconds += 300
    _pass(db, restarted)
    pod = _pod(db, namespace, name)
    assert (pod["phase"], pod["status_reason"]) == ("Failed", "NodeLost")
    usage = _usage(db, namespace, name)
    assert not usage.open and usage.stopped == whole_second(last)
    assert usage.billed_seconds(clocks.wall()) == to_last


def test_a_restarted_node_loop_finds_a_silence_it_did_not_see(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole control plane was down; its agent came back and renewed before the restarted
    node loop's first pass: the loop before it kept the last renewal it saw, so the silence is
    found all the same."""
    clocks = Clocks()
    monkeypatch.setattr(agent, "now", clocks.wall)
    node = _node_with_lease(db, clocks.wall())
    namespace, name = _bound(db, node)
    watch = clocks.watch()
    _pass(db, watch)
    last = _renewing(db, node, clocks, watch, until=60)
    agent.heartbeat(db)  # the node loop's heartbeat: it keeps the renewal it saw
    clocks.seconds += 300  # everything is down for five minutes
    back = clocks.wall()
    _renew(db, node, back)  # the agent is first back
    clocks.seconds += 2
    restarted = clocks.watch()
    _pass(db, restarted)
    usage = _usage(db, namespace, name)
    assert usage.pauses == [(whole_second(last), whole_second(clocks.wall()))]
    assert usage.open and usage.billed_seconds(clocks.wall()) == int(
        (whole_second(last) - usage.started).total_seconds()
    )


def test_a_deletion_ended_while_its_node_was_silent_is_billed_to_the_silence(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted with a grace of 5 s just as its node went silent: removed at its grace deadline,
    then the silence is noticed (the lease expires later): billed to the last renewal, the
    earlier of the two ends."""
    clocks = Clocks()
    node = _node_with_lease(db, clocks.wall())
    namespace, name = _bound(db, node)
    watch = clocks.watch()
    _pass(db, watch)
    last = _renewing(db, node, clocks, watch, until=100)
    monkeypatch.setattr(pods, "now", clocks.wall)
    db.write(lambda s: pods.delete(s, namespace=namespace, name=name, grace_seconds=5))
    clocks.seconds += 10
    uid = db.read(lambda s: ledger.pod_uid(s, namespace, name))
    assert db.write(lambda s: pods.finalize(s, uid=uid))  # at its deadline: 105 s
    assert _usage(db, namespace, name).stopped == whole_second(last) + timedelta(seconds=5)
    clocks.seconds += DURATION
    _pass(db, watch)  # the lease expired: the node was silent from 100 s
    usage = _usage(db, namespace, name)
    assert usage.started is not None and usage.pauses == [(whole_second(last), None)]
    assert usage.billed_seconds(clocks.wall()) == int(
        (whole_second(last) - usage.started).total_seconds()
    )
    problems = db.read(
        lambda s: ledger.audit(s, at=clocks.wall(), tenant_id=usage.pod.tenant_id).problems
    )
    assert problems == []
