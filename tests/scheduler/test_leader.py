"""Leader election through a Lease, on both databases: one holder at a time, a standby takes an
expired lease (counting the transition), and a scheduler that lost its lease binds nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.errors import Conflict
from app.leases import service as leases
from app.leases.service import Claim
from scheduler import loop
from scheduler.loop import LoopConfig, SchedulingLoop
from tests.conftest import unique
from tests.factories import pod
from tests.scheduler.test_loop import gpu_node, in_pool


def claims(name: str, seconds: int = 4) -> tuple[Claim, Claim]:
    return (
        Claim("kube-system", name, "scheduler-a", seconds),
        Claim("kube-system", name, "scheduler-b", seconds),
    )


def test_one_holder_at_a_time_and_a_standby_takes_an_expired_lease(db) -> None:
    a, b = claims(unique("lease-"))
    t0 = datetime.now(UTC)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    assert db.write(lambda s: leases.acquire(s, claim=a, at=at(0)))
    assert not db.write(lambda s: leases.acquire(s, claim=b, at=at(1)))  # a holds it
    assert db.write(lambda s: leases.acquire(s, claim=a, at=at(3)))  # renewed
    assert not db.write(lambda s: leases.acquire(s, claim=b, at=at(6.9)))  # renewed at 3: till 7
    assert db.read(lambda s: leases.held(s, claim=a, at=at(6.9)))
    assert not db.read(lambda s: leases.held(s, claim=a, at=at(7)))  # expired: a must stop
    assert db.write(lambda s: leases.acquire(s, claim=b, at=at(7)))  # and b takes it
    assert not db.read(lambda s: leases.held(s, claim=a, at=at(7.1)))
    assert not db.write(lambda s: leases.acquire(s, claim=a, at=at(8)))  # a is a standby now
    lease = db.read(lambda s: leases.get(s, namespace="kube-system", name=a.name))
    assert lease["spec"]["holderIdentity"] == "scheduler-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["leaseDurationSeconds"] == 4
    assert lease["spec"]["acquireTime"] == lease["spec"]["renewTime"]  # taken at 7, not renewed


def test_a_scheduler_that_lost_its_lease_binds_nothing(server, admin, tenant) -> None:
    """Both loops plan the same pod; only the holder's bind goes through, the other's is a stale
    plan (the fence is checked in the bind's own transaction)."""
    db = server.services.db
    name = unique("sched-")
    a, b = claims(f"{name}-scheduler")
    gpu_node(db, name, gpus=1)  # a pool of its own: the database is shared with other tests
    created = tenant.post(
        f"/api/v1/namespaces/{tenant.tenant}/pods", json=in_pool(name, pod(unique("p-"), gpus=1))
    )
    assert created.status_code == 201, created.text
    loop_a = SchedulingLoop(db, LoopConfig(scheduler_name=name, leader=a))
    loop_b = SchedulingLoop(db, LoopConfig(scheduler_name=name, leader=b))
    try:
        assert loop_a.campaign() and not loop_b.campaign()
        # b's clock says a's lease expired long ago: b takes it; a has not noticed yet.
        later = datetime.now(UTC) + timedelta(seconds=60)
        assert db.write(lambda s: leases.acquire(s, claim=b, at=later))
        refused = loop_a.run_once()
        assert (refused.bound, refused.stale) == (0, 1), refused
        path = f"/api/v1/namespaces/{tenant.tenant}/pods/{created.json()['metadata']['name']}"
        assert "nodeName" not in tenant.get(path).json()["spec"]
        assert not loop_a.campaign()  # a learns it lost the lease
        done = loop_b.run_once()
        assert (done.bound, done.stale) == (1, 0)
        assert tenant.get(path).json()["spec"]["nodeName"]
    finally:
        loop_a.writer.close()
        loop_b.writer.close()


def test_candidates_judge_the_lease_by_the_database_clock(db, monkeypatch) -> None:
    """On PostgreSQL every candidate reads the server's clock, so a host whose clock is off
    changes nothing: a standby whose clock runs ten minutes ahead does not take a live lease,
    and a leader whose clock runs ten minutes behind stops when its lease expires. (SQLite's
    processes share one host, and its clock.)"""
    real_now = leases.now
    skew = {"by": timedelta(minutes=10)}
    for module in (leases, loop):  # the host's clock, as the scheduler's modules read it
        monkeypatch.setattr(module, "now", lambda: real_now() + skew["by"])
    if db.is_sqlite:
        assert db.read(leases.database_time) - real_now() >= timedelta(minutes=9)
        return
    assert abs(db.read(leases.database_time) - real_now()) < timedelta(seconds=5)

    a, b = claims(unique("lease-"), seconds=30)
    leader = SchedulingLoop(db, LoopConfig(scheduler_name="a", leader=a))
    standby = SchedulingLoop(db, LoopConfig(scheduler_name="b", leader=b))
    skew["by"] = timedelta(0)
    assert leader.campaign()
    skew["by"] = timedelta(minutes=10)  # the standby's host
    assert not standby.campaign()
    # by its own clock, the lease expired nine and a half minutes ago
    assert not db.read(lambda s: leases.held(s, claim=a, at=leases.now()))

    a, _ = claims(unique("lease-"), seconds=1)
    skew["by"] = timedelta(0)
    assert SchedulingLoop(db, LoopConfig(scheduler_name="a", leader=a)).campaign()
    time.sleep(1.1)
    skew["by"] = -timedelta(minutes=10)  # the leader's host
    assert not db.read(lambda s: leases.held(s, claim=a, at=leases.database_time(s)))
    # by its own clock, it would go on binding for ten minutes
    assert db.read(lambda s: leases.held(s, claim=a, at=leases.now()))
    # and the bind's fence judges by the database's clock too: the stale leader writes nothing
    fenced = loop._fenced(lambda s: "bound", a)
    with pytest.raises(Conflict, match="no longer holds the lease"):
        db.write(fenced)


LOCK_LEASE = text(
    "SELECT holder_identity FROM leases WHERE namespace = :ns AND name = :name FOR UPDATE"
)


def test_a_standby_ends_an_expired_leaders_writes_that_still_lock_the_lease(db) -> None:
    """A leader stopped in the middle of a write keeps its transaction, and the lease's row it
    locked (`held`), open. The server ends such a session after its idle-in-transaction
    time-out, but not one whose client stopped in the middle of a pipeline of statements (the
    session is not idle: it waits for the rest): here, a session with the time-out off. Once
    the lease has expired, the standby ends that transaction and takes the lease; a
    transaction begun after the expiry (another candidate's attempt) it waits for."""
    if db.is_sqlite:
        pytest.skip("SQLite: one writer at a time, and no transaction outlives its process")
    a, b = claims(unique("lease-"), seconds=1)
    key = {"ns": a.namespace, "name": a.name}
    assert db.write(lambda s: leases.acquire(s, claim=a, at=leases.database_time(s)))
    stuck = db.engine.connect()
    stuck.execute(text("SET idle_in_transaction_session_timeout = 0"))
    stuck.commit()
    # the leader's write, in a savepoint as a write of a batch runs: the row's locker is a
    # subtransaction's id
    stuck.execute(text("SAVEPOINT one_write"))
    assert stuck.execute(LOCK_LEASE, key).scalar_one() == "scheduler-a"
    time.sleep(1.2)  # ...and its process stops: the lease expires

    assert db.write(lambda s: leases.acquire(s, claim=b, at=leases.database_time(s)))
    with pytest.raises(DBAPIError):  # the stopped leader's transaction was ended
        stuck.execute(text("SELECT 1"))
        stuck.commit()
    stuck.invalidate()
    stuck.close()
    assert db.read(lambda s: leases.held(s, claim=b, at=leases.database_time(s)))

    time.sleep(1.2)  # b stops renewing: its lease expires; then a candidate's write begins
    later = db.engine.connect()
    assert later.execute(LOCK_LEASE, key).scalar_one() == "scheduler-b"
    assert not db.write(lambda s: leases.acquire(s, claim=a, at=leases.database_time(s)))
    assert later.execute(text("SELECT 1")).scalar_one() == 1  # not ended: begun after expiry
    later.commit()
    later.close()
    assert db.write(lambda s: leases.acquire(s, claim=a, at=leases.database_time(s)))
