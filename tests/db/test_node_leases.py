"""A node lease expires by the control plane's clock, a lease duration after the node loop saw
it renewed, whatever the node's own clock says (its agent writes renewTime by it).

The node loop's pass (`check_leases`) runs against a real database of each backend; its clocks
are the test's, so minutes pass in no time. Nodes whose clocks run ten minutes behind or ahead
of the control plane's stand for the hosts of a real fleet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from app.agent import LeaseWatch, check_leases, heartbeat
from app.constants import NODE_LEASE_NAMESPACE
from app.db.engine import Database
from app.db.models import Lease, Node, Pod, UsageEvent, UsageHeartbeat
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.registry.kinds.leases import LeaseStrategy
from app.registry.store import Store
from app.settings import Settings
from tests.db.test_capacity import make_node, make_pods

DURATION = 40  # the lease's leaseDurationSeconds
SKEW = timedelta(minutes=10)


class Clocks:
    """The control plane's clocks, moved by the test: wall time and monotonic seconds."""

    def __init__(self) -> None:
        self.start = datetime.now(UTC)
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def wall(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)

    def watch(self) -> LeaseWatch:
        return LeaseWatch(monotonic=self.monotonic, wall=self.wall)


def _node_with_lease(db: Database, renew: datetime) -> str:
    name = make_node(db, gpus=0)
    lease = {
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": DURATION,
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    namespace = NamespaceInfo(NODE_LEASE_NAMESPACE, None, False)
    db.write(lambda s: Store(LeaseStrategy()).create(s, namespace=namespace, obj=lease))
    return name


def _renew(db: Database, name: str, at: datetime) -> None:
    """The node's agent renews its lease, writing `at` (its own clock) as renewTime."""
    db.write(
        lambda s: s.execute(
            update(Lease)
            .where(Lease.namespace == NODE_LEASE_NAMESPACE, Lease.name == name)
            .values(renew_time=at)
        )
    )


def _lost_since(db: Database, name: str) -> datetime | None:
    return db.read(lambda s: s.scalar(select(Node.lost_since).where(Node.name == name)))


def _pass(db: Database, watch: LeaseWatch, grace: float = 300.0) -> None:
    check_leases(db, settings=Settings(node_lost_grace_seconds=grace), watch=watch)


def test_a_node_whose_clock_runs_behind_stays_ready_while_it_renews(db: Database) -> None:
    clocks = Clocks()
    node_clock = clocks.wall() - SKEW
    node = _node_with_lease(db, node_clock)
    watch = clocks.watch()
    _pass(db, watch)
    assert _lost_since(db, node) is None  # its renewTime is ten minutes old by our clock
    for _ in range(10):  # renewing every 30 s for five minutes
        clocks.seconds += 30
        node_clock += timedelta(seconds=30)
        _renew(db, node, node_clock)
        _pass(db, watch)
        assert _lost_since(db, node) is None
    clocks.seconds += DURATION  # its agent stops: a whole duration without a renewal
    _pass(db, watch)
    assert _lost_since(db, node) is None
    clocks.seconds += 1
    _pass(db, watch)
    # lost since the last renewal was seen (300 s in) plus the duration
    assert _lost_since(db, node) == clocks.start + timedelta(seconds=300 + DURATION)
    _renew(db, node, node_clock + timedelta(seconds=71))
    _pass(db, watch)
    assert _lost_since(db, node) is None  # renewed: Ready again


def test_a_node_whose_clock_runs_ahead_is_lost_a_duration_after_it_stops(db: Database) -> None:
    clocks = Clocks()
    node = _node_with_lease(db, clocks.wall() + SKEW)
    namespace, names = make_pods(db, 1, cpu="1", memory="2Gi")
    db.write(lambda s: pods.bind(s, namespace=namespace, name=names[0], node_name=node, gpus=[]))
    watch = clocks.watch()
    _pass(db, watch, grace=60)
    clocks.seconds += DURATION + 1  # by its renewTime it would live ten minutes more
    _pass(db, watch, grace=60)
    assert _lost_since(db, node) == clocks.start + timedelta(seconds=DURATION)
    clocks.seconds += 59  # 100 s in: the grace ends
    _pass(db, watch, grace=60)
    assert _pod(db, namespace, names[0])["phase"] == "Pending"  # bound, not failed yet
    clocks.seconds += 1
    _pass(db, watch, grace=60)
    pod = _pod(db, namespace, names[0])
    assert (pod["phase"], pod["status_reason"]) == ("Failed", "NodeLost")
    # billed up to its last renewal as seen here, not to its renewTime ten minutes ahead
    stop = db.read(
        lambda s: s.scalar(
            select(UsageEvent.at).where(UsageEvent.pod_uid == pod["uid"], UsageEvent.kind == "stop")
        )
    )
    assert stop is not None
    assert _aware(stop) <= clocks.start + timedelta(seconds=1)


def test_a_heartbeat_from_a_node_clock_ahead_is_not_in_the_future(db: Database) -> None:
    node = _node_with_lease(db, datetime.now(UTC) + SKEW)
    heartbeat(db)
    beat = db.read(
        lambda s: s.scalar(select(UsageHeartbeat.at).where(UsageHeartbeat.node_name == node))
    )
    assert beat is not None and _aware(beat) <= datetime.now(UTC)


def test_a_restarted_loop_gives_live_nodes_a_duration_and_keeps_lost_ones_lost(
    db: Database,
) -> None:
    clocks = Clocks()
    live = _node_with_lease(db, clocks.wall() - SKEW)
    gone = _node_with_lease(db, clocks.wall())
    first = clocks.watch()
    _pass(db, first)
    clocks.seconds += DURATION + 1
    _renew(db, live, clocks.wall() - SKEW)
    _pass(db, first)
    assert _lost_since(db, live) is None and _lost_since(db, gone) is not None
    restarted = clocks.watch()  # the node loop restarts: it has seen nothing yet
    _pass(db, restarted)
    assert _lost_since(db, live) is None
    assert _lost_since(db, gone) is not None  # an old renewal found at start is no sign of life
    _renew(db, gone, clocks.wall())
    _pass(db, restarted)
    assert _lost_since(db, gone) is None


def _pod(db: Database, namespace: str, name: str) -> dict[str, Any]:
    row = db.read(
        lambda s: (
            s.execute(select(Pod.__table__).where(Pod.namespace == namespace, Pod.name == name))
            .mappings()
            .one()
        )
    )
    return dict(row)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)
