"""Group commit: requests that share a transaction succeed or fail one by one."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.db.engine import Database, WriteQueue, next_resource_version
from app.db.models import Pod
from app.errors import Conflict
from tests.conftest import unique
from tests.factories import pod as pod_manifest


def insert_tenant(name: str, then: str = "ok") -> Any:
    """A write that inserts a tenant row, then succeeds or fails as told."""

    def work(session: Session) -> str:
        session.execute(
            text("INSERT INTO tenants (name, uid, created_at) VALUES (:n, :n, CURRENT_TIMESTAMP)"),
            {"n": name},
        )
        if then == "domain-error":
            raise Conflict(f"{name} refused")
        if then == "crash":
            raise RuntimeError(f"{name} crashed")
        return name

    return work


def held_back(queue: WriteQueue) -> threading.Event:
    """Occupy the writer so the next submissions queue up and share one batch. It is occupied
    once the holding write runs: until then (it waits for the lock) later writes join its batch."""
    release, running = threading.Event(), threading.Event()

    def hold(_session: Any) -> bool:
        running.set()
        return release.wait(10)

    queue.submit(hold)
    assert running.wait(10)
    return release


def existing(db: Database, names: list[str]) -> set[str]:
    rows = db.read(lambda s: s.execute(text("SELECT name FROM tenants")).scalars().all())
    return set(rows) & set(names)


def test_writes_that_arrive_while_a_batch_waits_for_the_lock_join_it(db: Database) -> None:
    """SQLite: while another transaction holds the write lock, the writer waits with the first
    write; those submitted meanwhile go in the same transaction once it has the lock (not in a
    batch of their own that would wait for it again). PostgreSQL: there is no lock every
    writer takes; the write commits while the other transaction is still open."""
    queue = WriteQueue(db)
    holding, release = threading.Event(), threading.Event()

    def hold(session: Session) -> None:
        next_resource_version(session)  # it has taken its versions, and stays open
        holding.set()
        release.wait(30)

    other = threading.Thread(target=db.write, args=(hold,))  # another process's write, say
    other.start()
    try:
        assert holding.wait(10)
        names = [unique("wq-late") for _ in range(3)]
        first = queue.submit(insert_tenant(names[0]))
        if not db.is_sqlite:
            assert first.result(20) == names[0], "a write waited for another's transaction"
            assert other.is_alive()
        time.sleep(0.3)  # SQLite: the writer has taken it and waits for the lock
        later = [queue.submit(insert_tenant(n)) for n in names[1:]]
        time.sleep(0.1)
    finally:
        release.set()
        other.join(10)
    assert [f.result(10) for f in [first, *later]] == names
    assert existing(db, names) == set(names)
    if db.is_sqlite:
        assert (queue.batches, queue.writes) == (1, 3)
    queue.close()


@pytest.mark.parametrize("clean", [False, True], ids=["savepoints", "clean"])
def test_one_failure_does_not_sink_the_batch(db: Database, clean: bool) -> None:
    queue = WriteQueue(db)
    names = [unique("wq") for _ in range(4)]
    release = held_back(queue)
    plans = ["ok", "domain-error", "ok", "crash"]
    futures: list[Future[Any]] = [
        queue.submit(insert_tenant(n, p), clean=clean) for n, p in zip(names, plans, strict=True)
    ]
    release.set()
    assert futures[0].result(10) == names[0] and futures[2].result(10) == names[2]
    with pytest.raises(Conflict):
        futures[1].result(10)
    with pytest.raises(RuntimeError):
        futures[3].result(10)
    # The failed requests left nothing; the others committed together.
    assert existing(db, names) == {names[0], names[2]}
    queue.close()


def test_an_unexpected_database_error_reruns_the_batch_with_savepoints(db: Database) -> None:
    queue = WriteQueue(db)
    taken = unique("wq")
    db.write(insert_tenant(taken))
    release = held_back(queue)
    fresh = unique("wq")
    # The duplicate is found only when the statement runs: with `clean` the batch is retried with
    # savepoints, so the good request still commits.
    futures = [
        queue.submit(insert_tenant(fresh), clean=True),
        queue.submit(insert_tenant(taken), clean=True),
    ]
    release.set()
    assert futures[0].result(10) == fresh
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        futures[1].result(10)
    assert existing(db, [fresh]) == {fresh}
    queue.close()


def test_a_write_undone_in_its_savepoint_gives_back_its_resource_versions(db: Database) -> None:
    """A failed write that reserved a block of resourceVersions loses it with its savepoint;
    the writes after it must not reuse those versions (the counter hands them out again)."""
    from app.db.engine import RV_BLOCK, next_resource_version

    queue = WriteQueue(db)
    release = held_back(queue)

    def take(count: int, then: str = "ok") -> Any:
        def work(session: Session) -> list[int]:
            versions = [next_resource_version(session) for _ in range(count)]
            if then == "crash":
                raise RuntimeError("failed after reserving versions")
            return versions

        return work

    futures = [
        queue.submit(take(RV_BLOCK)),  # uses up a whole block
        queue.submit(take(3, "crash")),  # reserves the next block, then is undone
        queue.submit(take(RV_BLOCK * 2)),
    ]
    release.set()
    first, third = futures[0].result(10), futures[2].result(10)
    with pytest.raises(RuntimeError):
        futures[1].result(10)
    assert len(set(first + third)) == len(first) + len(third), "a resourceVersion was reused"
    # and the next transaction continues above every version handed out
    later = db.write(take(1))
    assert later[0] > max(first + third)
    queue.close()


def test_creates_in_one_batch_fail_alone_when_their_name_is_taken(db: Database) -> None:
    """A batch of pod creates goes in as it commits (one statement for all their rows): a name
    that exists already, or that an earlier create of the same batch takes, fails that create
    with AlreadyExists, and nothing it queued (its event, its change) is written."""
    from sqlalchemy import select

    from app.db.models import Change, Event, table
    from app.errors import AlreadyExists
    from app.pods import service as pods
    from tests.scheduler.test_loop import create, new_tenant, prepared

    ns = new_tenant(db)
    taken = unique("taken-")
    create(db, ns, pod_manifest(taken))
    fresh, twice = unique("fresh-"), unique("twice-")
    queue = WriteQueue(db)
    release = held_back(queue)
    news = [prepared(db, ns, pod_manifest(n)) for n in (fresh, taken, twice, twice)]
    futures = [queue.submit(partial(pods.insert, new=new), clean=True) for new in news]
    release.set()
    assert futures[0].result(10)["metadata"]["name"] == fresh
    assert futures[2].result(10)["metadata"]["name"] == twice
    for failed in (futures[1], futures[3]):
        with pytest.raises(AlreadyExists):
            failed.result(10)
    queue.close()
    uids = [new.values["uid"] for new in news]
    kept = db.read(
        lambda s: {
            "pods": set(s.scalars(select(table(Pod).c.uid).where(table(Pod).c.uid.in_(uids)))),
            "events": set(
                s.scalars(
                    select(table(Event).c.involved_uid).where(table(Event).c.involved_uid.in_(uids))
                )
            ),
            "changes": {
                row["metadata"]["uid"]
                for row in s.scalars(
                    select(table(Change).c.object).where(
                        table(Change).c.kind == "Pod", table(Change).c.namespace == ns.name
                    )
                )
            },
        }
    )
    assert kept["pods"] == kept["events"] == {uids[0], uids[2]}
    assert kept["changes"] & set(uids) == {uids[0], uids[2]}


def test_coroutines_awaiting_writes_get_each_its_own_outcome(db: Database) -> None:
    """`WriteQueue.run`: the writer hands a batch's outcomes to the event loop in one call;
    each coroutine gets its own result or error, and one cancelled before its batch ran writes
    nothing."""
    import asyncio

    queue = WriteQueue(db)
    names = [unique("wq") for _ in range(6)]
    plans = ["ok", "domain-error", "ok", "ok", "domain-error", "ok"]

    async def main() -> tuple[list[Any], bool]:
        release = held_back(queue)
        tasks = [
            asyncio.create_task(queue.run(insert_tenant(n, p)))
            for n, p in zip(names, plans, strict=True)
        ]
        dropped = asyncio.create_task(queue.run(insert_tenant(unique("wq-dropped"))))
        await asyncio.sleep(0.05)  # all queued behind the held-back write
        dropped.cancel()
        # The cancellation reaches the queued write through a done-callback, at the loop's next
        # turn: let it run before the writer is released (else the writer may take it first).
        await asyncio.sleep(0.01)
        release.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await dropped
        except asyncio.CancelledError:
            return outcomes, True
        return outcomes, False

    outcomes, cancelled = asyncio.run(main())
    assert cancelled
    assert [o if isinstance(o, str) else type(o).__name__ for o in outcomes] == [
        names[0],
        "Conflict",
        names[2],
        names[3],
        "Conflict",
        names[5],
    ]
    assert existing(db, names) == {names[0], names[2], names[3], names[5]}
    rows = db.read(lambda s: s.execute(text("SELECT name FROM tenants")).scalars().all())
    assert not any(str(r).startswith("wq-dropped") for r in rows)
    queue.close()


def test_a_batch_whose_session_the_server_ended_fails_with_that_error(db: Database) -> None:
    """The server ends the batch's session in the middle of a write (an idle-in-transaction
    time-out while its process was stopped, an operator's pg_terminate_backend): every write of
    the batch fails with the server's error (not with the failed rollback of its savepoint),
    nothing of it is written, and the queue goes on."""
    if db.is_sqlite:
        pytest.skip("SQLite has no server to end a session")
    queue = WriteQueue(db)
    names = [unique("wq") for _ in range(3)]

    def ended(session: Session) -> None:
        session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    release = held_back(queue)
    futures = [
        queue.submit(insert_tenant(names[0])),
        queue.submit(ended),
        queue.submit(insert_tenant(names[1])),
    ]
    release.set()
    for future in futures:
        error = future.exception(10)
        assert error is not None and "terminat" in str(error), error
    assert existing(db, names) == set()
    assert queue.submit(insert_tenant(names[2])).result(10) == names[2]
    queue.close()
