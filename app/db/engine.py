"""Engine, transactions and everything that differs between SQLite and PostgreSQL.

Every unit of work runs in one transaction through `Database.write()` / `Database.read()`:

    pod = db.write(lambda s: pods_service.create(s, ...))

`write` commits when the function returns and rolls back when it raises, so a failed request
leaves nothing half-written. Work queued with `on_commit()` runs only after a successful commit
(never for a transaction that rolled back).

SQLite (the embedded default): WAL journal, foreign keys on, `BEGIN IMMEDIATE` for writes so that
concurrent writers queue on the busy timeout instead of failing on a lock upgrade.
PostgreSQL: psycopg 3 with a connection pool; row locks plus CHECK constraints guard capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import orjson
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import Change, Counter, table
from app.errors import TesseraError

log = logging.getLogger("tessera.db")

changes_t = table(Change)

T = TypeVar("T")

RESOURCE_VERSION = "resource_version"


# Every wait on PostgreSQL is bounded, so that no stuck process holds the others: a session
# idle inside a transaction (a process paused by SIGSTOP, a long GC pause, a swapped-out or
# partitioned host) is ended by the server after IDLE_IN_TRANSACTION_MS, its locks released and
# its transaction rolled back (a paused scheduler's binds are never committed late); a statement
# waits for a lock at most LOCK_TIMEOUT_MS (the request then fails with 503 and Retry-After).
# A process that writes under a lease (the scheduler) ends its transactions sooner, within half
# its lease (`idle_within_lease`): the rows it holds locked, the lease's among them, are free
# again before the lease has run out, so that a standby takes over within the lease.
IDLE_IN_TRANSACTION_MS = 5_000
LOCK_TIMEOUT_MS = 10_000


def _bounded_waits(idle_in_transaction_ms: int) -> str:
    return (
        f"-c idle_in_transaction_session_timeout={idle_in_transaction_ms} "
        f"-c lock_timeout={LOCK_TIMEOUT_MS}"
    )


# The idle-in-transaction time-out does not end a session whose client stopped in the middle of
# a pipeline of statements (psycopg's executemany sends one): the server has run what it was
# sent and waits for the rest, and the session is not idle but active, waiting on its client
# (ClientRead), for as long as the process stays stopped, holding its row locks and the
# horizon of every reader (`current_resource_version`). Every API process ends such writers
# once their client has sent nothing for as long as the idle time-out (`end_stuck_writers`).
_STUCK_WRITERS = text(
    """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_xid IS NOT NULL AND state = 'active'
      AND wait_event_type = 'Client' AND wait_event = 'ClientRead'
      AND query_start < clock_timestamp() - make_interval(secs => :seconds)"""
)


def end_stuck_writers(session: Session, *, after_ms: int = IDLE_IN_TRANSACTION_MS) -> int:
    """End (PostgreSQL) the write transactions whose client has sent nothing for `after_ms`
    in the middle of a pipeline of statements (see `_STUCK_WRITERS`); how many."""
    if session.get_bind().dialect.name != "postgresql":
        return 0
    return len(session.execute(_STUCK_WRITERS, {"seconds": after_ms / 1000}).all())


async def end_stuck_writers_forever(db: Database, *, every: float = 1.0) -> None:
    """`end_stuck_writers` every `every` seconds (an API process's task, on PostgreSQL)."""
    while True:
        await asyncio.sleep(every)
        try:
            ended = await asyncio.to_thread(db.read, end_stuck_writers)
        except Exception:
            log.exception("could not look for stuck writers")
            continue
        if ended:
            log.warning(
                "ended %d write transaction(s) whose process stopped in the middle of a "
                "pipeline of statements (nothing sent for %.1f s)",
                ended,
                IDLE_IN_TRANSACTION_MS / 1000,
            )


def idle_within_lease(lease_seconds: float) -> int:
    """The idle-in-transaction time-out for a process writing under a lease of this length."""
    return max(500, min(IDLE_IN_TRANSACTION_MS, int(lease_seconds * 1000 / 2)))


class Database:
    def __init__(
        self,
        url: str,
        *,
        echo: bool = False,
        pool_size: int | None = None,
        idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS,
    ) -> None:
        # connections kept open per process (as many more when busy); TESSERA_DATABASE_POOL_SIZE
        # lowers it where many processes share one PostgreSQL (the test suite: max_connections)
        if pool_size is None:
            pool_size = max(1, min(100, int(os.environ.get("TESSERA_DATABASE_POOL_SIZE", "10"))))
        self.url = make_url(url)
        # Called with the highest resourceVersion of each committed transaction that changed
        # watchable objects, and the kinds it changed (wakes watchers; app/watch/notify.py).
        self.on_changes: Callable[[int, frozenset[str]], None] | None = None
        self.dialect = self.url.get_backend_name()
        if self.dialect == "sqlite":
            self.engine = _sqlite_engine(url, echo=echo)
        elif self.dialect == "postgresql":
            self.engine = create_engine(
                url,
                echo=echo,
                pool_size=pool_size,
                max_overflow=pool_size,
                connect_args={
                    "prepare_threshold": 5,
                    "options": _bounded_waits(idle_in_transaction_ms),
                },
                json_serializer=_json_dumps,
                json_deserializer=orjson.loads,
            )
            _ping_when_idle(self.engine)
        else:
            raise ValueError(
                f"unsupported database {self.dialect!r}: use sqlite:///path or "
                "postgresql+psycopg://user@host:port/db"
            )
        self._sessions = sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        self._local = threading.local()

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def session(self, *, write: bool) -> Iterator[Session]:
        """One transaction. Commits on success, rolls back on any exception."""
        session = self._sessions()
        callbacks: list[Callable[[], None]] = []
        session.info["on_commit"] = callbacks
        pending: list[dict[str, Any]] = []
        marks = [time.perf_counter()] if write and _TRACE is not None else None
        try:
            if write and self.is_sqlite:
                session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            # (PostgreSQL: no lock is shared by every writer; see `next_resource_version`)
            if marks is not None:
                marks.append(time.perf_counter())  # the write lock is held (SQLite)
            yield session
            if marks is not None:
                marks.append(time.perf_counter())
            pending = _finish(session)
            if marks is not None:
                marks.append(time.perf_counter())
            session.commit()
            if marks is not None:
                marks.append(time.perf_counter())
                _trace_write(marks, len(pending))
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()
        noted = [row["resource_version"] for row in pending] + session.info.get("noted", [])
        if noted and self.on_changes is not None:
            kinds = {row["kind"] for row in pending} | session.info.get("noted_kinds", set())
            self.on_changes(max(noted), frozenset(kinds))
        for callback in callbacks:
            callback()

    def write(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in a write transaction; a serialization failure or deadlock is retried
        (a few times, with a short random pause), so a caller never sees one."""
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                with self.session(write=True) as session:
                    return fn(session)
            except Exception as exc:
                if attempt == WRITE_ATTEMPTS or not is_retryable(exc):
                    raise
                time.sleep(random.uniform(0.001, 0.01 * attempt))
        raise AssertionError("unreachable")

    def read(self, fn: Callable[[Session], T]) -> T:
        with self.session(write=False) as session:
            return fn(session)

    def dry_run(self, fn: Callable[[Session], T]) -> T:
        """Run a write and roll it back: every check runs, nothing is kept (`dryRun=All`).

        Nothing reaches a file either: on SQLite the transaction's pages stay in memory (a
        cache large enough that none spills into the WAL)."""
        session = self._sessions()
        session.info["dry_run"] = True
        try:
            if self.is_sqlite:
                connection = session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
                # room for the largest object in memory, so no page spills into the WAL
                connection.exec_driver_sql("PRAGMA cache_size=-65536")
            result = fn(session)
            _finish(session)  # every deferred write runs, so its errors show (then rolled back)
            return result
        finally:
            session.rollback()
            if self.is_sqlite:
                with contextlib.suppress(Exception):
                    session.connection().exec_driver_sql("PRAGMA cache_size=-2000")
                session.rollback()
            session.close()

    def has_schema(self) -> bool:
        """Whether Tessera's migrations have run here (a connection that fails raises)."""
        with self.engine.connect() as connection:
            return bool(inspect(connection).has_table("alembic_version"))

    def dispose(self) -> None:
        self.engine.dispose()


# TESSERA_TRACE_WRITES=PREFIX: every write transaction of this process is appended to the file
# PREFIX.<pid>, one line each: the thread, when it asked for the write lock (PostgreSQL: the
# counter's row lock; SQLite: the database's), got it, had done its work, had flushed what it
# deferred, and had committed (`time.perf_counter()`, seconds), and the changes it logged.
# `tessera bench burst --trace-writes` reads them: where the time under the lock goes.
_TRACE = os.environ.get("TESSERA_TRACE_WRITES") or None
_trace_file: Any = None


def _trace_write(marks: list[float], changes: int) -> None:
    global _trace_file
    if _trace_file is None:
        _trace_file = open(f"{_TRACE}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115
    stamps = " ".join(f"{mark:.6f}" for mark in marks)
    _trace_file.write(f"{threading.current_thread().name} {stamps} {changes}\n")


class WriteQueue:
    """Group commit: concurrent writes share one transaction.

    Every write of an API process goes through one writer thread. It takes whatever requests
    are waiting (up to `max_batch`), runs them in one transaction and commits once. A request
    that fails is undone alone: it runs in a SAVEPOINT, or, when it was submitted `clean` (it
    raises only before it has written anything that matters: a skipped resourceVersion does
    not), without one. If anything unexpected goes wrong in a batch run without savepoints, the
    batch is rolled back and run again with a savepoint for every request. If the commit itself
    fails, every request of the batch gets the error and nothing of the batch is kept.

    A burst of creates costs one commit (one fsync) per batch instead of one per request. On
    SQLite, writes are serialised anyway (one writer), so one writer thread loses no
    concurrency; the writes that arrive while the writer waits for the database's lock join
    the batch once it has the lock (a busy lock makes larger batches, rather than a queue of
    batches that each wait for it). On PostgreSQL, writers share no lock: each process's writer
    commits side by side with the other processes' (API workers, scheduler, node loop).
    """

    def __init__(self, db: Database, *, max_batch: int = 256) -> None:
        self.db = db
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.batches = 0
        self.writes = 0

    def submit(self, fn: Callable[[Session], T], *, clean: bool = False) -> Future[T]:
        return self._put(fn, clean, None)

    async def run(self, fn: Callable[[Session], T], *, clean: bool = False) -> T:
        """`submit` and wait, from a coroutine. The writer wakes the event loop once per batch
        for all the writes of the loop it committed, not once per write (each wake-up is a
        system call, and a hand-over of the interpreter lock between the two threads)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        future = self._put(fn, clean, waiter)
        waiter.add_done_callback(lambda w: future.cancel() if w.cancelled() else None)
        return await waiter

    def _put(
        self, fn: Callable[[Session], T], clean: bool, waiter: asyncio.Future[T] | None
    ) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put(_Item(fn, future, clean, waiter))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="tessera-writer", daemon=True
                    )
                    self._thread.start()
        return future

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._execute(batch)
                    return
                batch.append(more)
            self._execute(batch)

    def _execute(self, batch: list[_Item]) -> None:
        try:
            self._commit(batch)
        finally:
            _wake_waiters(batch)

    def _late(self, batch: list[_Item], live: list[_Item]) -> None:
        """The writes that arrived while the batch waited for the lock join it (to `max_batch`):
        in `batch`, to be woken, and, unless cancelled meanwhile, in `live`, to be run."""
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:  # `close`: after this batch
                self._queue.put(None)
                return
            batch.append(item)
            if item.future.set_running_or_notify_cancel():
                live.append(item)

    def _commit(self, batch: list[_Item]) -> None:
        live = [item for item in batch if item.future.set_running_or_notify_cancel()]
        if not live:
            return
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            last = attempt == WRITE_ATTEMPTS
            join = partial(self._late, batch, live) if attempt == 1 else None
            try:
                outcomes = self._attempt(live, trust_clean=True, last=last, join=join)
            except _Retry:
                outcomes = self._attempt(live, trust_clean=False, last=last)
            except _Again:
                time.sleep(random.uniform(0.001, 0.01 * attempt))
                continue
            break
        if outcomes is None:
            return
        self.batches += 1
        self.writes += len(live)
        for future, result, error in outcomes:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _attempt(
        self,
        live: list[_Item],
        *,
        trust_clean: bool,
        last: bool = True,
        join: Callable[[], None] | None = None,
    ) -> list[_Outcome] | None:
        """One run of the batch (`join`, once the lock is held: let later writes join it).
        Raises `_Again` when PostgreSQL refused it with a serialization failure or deadlock and
        it may run again (not on the `last` attempt)."""
        outcomes: list[_Outcome] = []
        try:
            with self.db.session(write=True) as session:
                if join is not None:
                    join()
                if len(live) == 1:  # no savepoint needed: its failure is the transaction's
                    item = live[0]
                    try:
                        outcomes.append((item.future, item.fn(session), None))
                    except Exception as exc:
                        if not last and is_retryable(exc):
                            raise _Again() from exc
                        item.future.set_exception(exc)
                        raise _Abandon() from exc
                else:
                    spans: list[tuple[_Marks, _Marks]] = []
                    for item in live:
                        bare = item.clean and trust_clean
                        if not bare:  # it may read what the writes before it inserted
                            _fail_conflicting(session, outcomes=outcomes, spans=spans)
                        before = _Marks.of(session)
                        if bare:
                            outcomes.append(_without_savepoint(session, item))
                        else:
                            outcomes.append(_in_savepoint(session, item))
                        spans.append((before, _Marks.of(session)))
                        error = outcomes[-1][2]
                        if not last and error is not None and is_retryable(error):
                            raise _Again() from error
                    # The batch's new rows go in as it commits; if a key was taken, the writes
                    # whose rows found it fail alone (see `_finish`).
                    session.info["resolve_conflicts"] = partial(
                        _fail_conflicting, outcomes=outcomes, spans=spans
                    )
        except (_Abandon, _Retry, _Again) as signal:
            if isinstance(signal, (_Retry, _Again)):
                raise
            return None
        except Exception as exc:
            if not last and is_retryable(exc):
                raise _Again() from exc
            # every write of the batch gets the error, also those that never ran (the
            # transaction failed before them: a lock wait that timed out, a lost connection)
            for item in live:
                if not item.future.done():
                    item.future.set_exception(exc)
            return None
        return outcomes


@dataclass(frozen=True)
class _Item:
    fn: Callable[[Session], Any]
    future: Future[Any]
    clean: bool
    waiter: asyncio.Future[Any] | None = None  # `WriteQueue.run`'s, in its event loop


def _wake_waiters(batch: Sequence[_Item]) -> None:
    """Pass the outcomes of a batch's writes on to the coroutines awaiting them: one call into
    each event loop for all of its writes."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Item]] = {}
    for item in batch:
        if item.waiter is not None and item.future.done():
            by_loop.setdefault(item.waiter.get_loop(), []).append(item)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_pass_on, items)


def _pass_on(items: Sequence[_Item]) -> None:
    for item in items:
        waiter, future = item.waiter, item.future
        if waiter is None or waiter.done():
            continue
        if future.cancelled():
            waiter.cancel()
        elif future.exception() is not None:
            waiter.set_exception(future.exception())  # type: ignore[arg-type]
        else:
            waiter.set_result(future.result())


_Outcome = tuple[Future[Any], Any, BaseException | None]


class _Retry(Exception):
    """A request run without a savepoint failed unexpectedly: redo the batch with savepoints."""


class _Again(Exception):
    """PostgreSQL refused the batch (serialization failure, deadlock): run it again whole."""


class _Abandon(Exception):
    """The only write of a batch failed: roll back, its future already holds the error."""


@dataclass(frozen=True)
class _Marks:
    """How far a transaction's deferred work had got: what a write added lies between two."""

    changes: int
    callbacks: int
    deferred: int
    updates: int
    unique: int

    @classmethod
    def of(cls, session: Session) -> _Marks:
        info = session.info
        return cls(
            changes=len(info.setdefault("pending_changes", [])),
            callbacks=len(info.setdefault("on_commit", [])),
            deferred=len(info.setdefault("deferred_inserts", [])),
            updates=len(info.setdefault("deferred_updates", [])),
            unique=len(info.setdefault("unique_inserts", [])),
        )


def _fail_conflicting(
    session: Session, *, outcomes: list[_Outcome], spans: list[tuple[_Marks, _Marks]]
) -> None:
    """Insert the batch's unique rows (`insert_unique`); a write one of whose rows found its
    key taken fails with its conflict, and everything else it queued is dropped with it."""
    conflicts = flush_unique(session)
    if not conflicts:
        return
    failed: dict[int, BaseException] = {}
    for position, error in conflicts:
        owner = next(i for i, (a, b) in enumerate(spans) if a.unique <= position < b.unique)
        failed.setdefault(owner, error)
    info = session.info
    lists = {
        "changes": info["pending_changes"],
        "callbacks": info["on_commit"],
        "deferred": info["deferred_inserts"],
        "updates": info["deferred_updates"],
    }
    taken = {position for position, _ in conflicts}
    for owner in sorted(failed, reverse=True):  # later spans first: earlier ones stay valid
        before, after = spans[owner]
        for name, items in lists.items():
            del items[getattr(before, name) : getattr(after, name)]
        # its other unique rows went in: take them out again
        for position in range(before.unique, after.unique):
            if position not in taken:
                target, row, _ = info["unique_inserts"][position]
                key = next(iter(target.primary_key.columns))
                session.connection().execute(target.delete().where(key == row[key.name]))
        future, _, _ = outcomes[owner]
        outcomes[owner] = (future, None, failed[owner])


def _in_savepoint(session: Session, item: _Item) -> _Outcome:
    marks = _Marks.of(session)
    block = session.info.get("rv_block")
    connection = session.connection()
    connection.exec_driver_sql("SAVEPOINT tessera_write")
    try:
        result = item.fn(session)
        _raise_conflict(session)
        session.flush()
        connection.exec_driver_sql("RELEASE SAVEPOINT tessera_write")
        return item.future, result, None
    except Exception as exc:
        if connection.invalidated:  # the connection is gone (the server ended the session):
            raise  # the whole transaction failed, with this error, not a failed rollback's
        connection.exec_driver_sql("ROLLBACK TO SAVEPOINT tessera_write")
        # The rollback also undid any resourceVersion block this write reserved from the
        # counter: forget it, or the next write would hand out versions that the counter hands
        # out again. (A new block is reserved only when the one held before was used up.)
        if session.info.get("rv_block") is not block:
            session.info.pop("rv_block", None)
        # It also released the row locks taken inside it: what was read under them is read
        # again.
        session.info.pop("locked_reads", None)
        # ORM objects this write added are gone from the database: forget them.
        session.expunge_all()
        _forget_since(session, marks)
        return item.future, None, exc


def _forget_since(session: Session, marks: _Marks) -> None:
    """Drop what a failed write queued (changes, callbacks, deferred and unique inserts)."""
    info = session.info
    del info["pending_changes"][marks.changes :]
    del info["on_commit"][marks.callbacks :]
    del info["deferred_inserts"][marks.deferred :]
    del info["deferred_updates"][marks.updates :]
    del info["unique_inserts"][marks.unique :]
    info["unique_flushed"] = min(info.get("unique_flushed", 0), marks.unique)


def _without_savepoint(session: Session, item: _Item) -> _Outcome:
    """Run a clean request bare: a domain error means it wrote nothing; anything else retries."""
    marks = _Marks.of(session)
    try:
        return item.future, item.fn(session), None
    except TesseraError as exc:
        _forget_since(session, marks)
        return item.future, None, exc
    except Exception as exc:
        raise _Retry() from exc


def defer_insert(
    session: Session, target: Table, row: dict[str, Any], *, skip_duplicates: bool = False
) -> None:
    """Insert `row` into `target` just before this transaction commits, with every other row
    deferred to that table in one statement (`skip_duplicates`: a row whose key exists is
    skipped, not an error): for rows nothing reads back in the transaction that writes them
    (events), so that a batch of writes costs one round trip for them, not one each. A write
    undone by its savepoint takes its deferred rows with it."""
    session.info.setdefault("deferred_inserts", []).append((target, row, skip_duplicates))


def defer_update(
    session: Session, target: Table, key: str, columns: Sequence[str], rows: Sequence[Any]
) -> None:
    """`update_rows` just before this transaction commits, with its other deferred writes (one
    round trip for all of them): for rows it holds locked and does not read back."""
    if rows:
        update = _Write(target, [dict(row) for row in rows], key=key, columns=tuple(columns))
        session.info.setdefault("deferred_updates", []).append(update)


def insert_unique(
    session: Session,
    target: Table,
    row: dict[str, Any],
    *,
    conflict: Callable[[], BaseException],
) -> None:
    """Insert `row` into `target` before this transaction commits, with every other row so
    queued (one statement per table for a whole batch of writes); if a unique key of `target`
    already holds such a row, the write fails with `conflict()` and nothing it did is kept.

    For a write that only inserts (a create): it must not read its own row back, and raise
    only before it queues anything (`clean`). The row's key is `target`'s one primary-key
    column, which the caller makes unique (a fresh uid)."""
    session.info.setdefault("unique_inserts", []).append((target, row, conflict))


def flush_unique(session: Session) -> list[tuple[int, BaseException]]:
    """Insert the rows queued by `insert_unique` since the last flush; returns (position in
    the queue, conflict) of each row whose unique key was taken (by a row that existed, or by
    one queued before it)."""
    queued: list[tuple[Table, dict[str, Any], Callable[[], BaseException]]] = (
        session.info.get("unique_inserts") or []
    )
    done = session.info.get("unique_flushed", 0)
    if done >= len(queued):
        return []
    by_table: dict[Table, list[int]] = {}
    for position in range(done, len(queued)):
        by_table.setdefault(queued[position][0], []).append(position)
    session.info["unique_flushed"] = len(queued)
    dialect = session.get_bind().dialect.name
    connection = session.connection()
    conflicts = []
    for target, positions in by_table.items():
        # One statement, sent for every row at once (psycopg pipelines an executemany): the
        # same text each time, so it is parsed and prepared once, whatever the batch's size.
        insert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(target)
        rows = [queued[p][1] for p in positions]
        inserted = connection.execute(insert.on_conflict_do_nothing(), rows).rowcount
        if inserted == len(rows):
            continue
        # Some keys were taken (rare): find whose rows went in.
        key = next(iter(target.primary_key.columns))
        kept: set[Any] = set()
        for start in range(0, len(rows), UNIQUE_LOOKUP_KEYS):
            keys = [row[key.name] for row in rows[start : start + UNIQUE_LOOKUP_KEYS]]
            kept.update(connection.execute(select(key).where(key.in_(keys))).scalars())
        conflicts += [(p, queued[p][2]()) for p in positions if queued[p][1][key.name] not in kept]
    return sorted(conflicts, key=lambda c: c[0])


def _raise_conflict(session: Session) -> None:
    """Insert the queued unique rows; raise the first conflict (the transaction rolls back)."""
    conflicts = flush_unique(session)
    if conflicts:
        raise conflicts[0][1]


def _finish(session: Session) -> list[dict[str, Any]]:
    """Before commit: write what the transaction deferred (`defer_update`, `insert_unique`,
    `defer_insert`) and its change log; returns the changes logged.

    A key taken by a unique row is resolved by `session.info["resolve_conflicts"]` (the write
    queue fails the writes whose rows found it, alone) or else raised. On PostgreSQL the unique
    rows are first tried together with the rest, in one round trip inside a savepoint; only when
    a key was taken (rare) is it rolled back and the rows inserted one table after the other."""
    resolve = session.info.pop("resolve_conflicts", _raise_conflict)
    changes = session.info.get("pending_changes") or []
    if not _write_optimistically(session, [*_deferred(session), _Write(changes_t, changes)]):
        resolve(session)  # drops what the writes that failed had queued
        write_all(session, [*_deferred(session), _Write(changes_t, changes)])
    _clear_deferred(session)
    return list(changes)


def flush_deferred(session: Session) -> None:
    """Run the updates and inserts this transaction deferred (`defer_update`, `defer_insert`)
    now, for a caller that reads those rows back before it commits."""
    writes = _deferred(session)
    _clear_deferred(session)
    write_all(session, writes)


@dataclass(frozen=True, eq=False)
class _Write:
    """One statement of many rows: an INSERT into `target` (`skip`: a row whose key exists is
    skipped), or, with a `key`, an UPDATE of `columns` by it."""

    target: Table
    rows: list[dict[str, Any]]
    skip: bool = False
    key: str | None = None
    columns: tuple[str, ...] = ()


def _deferred(session: Session) -> list[_Write]:
    """What this transaction deferred and has not written yet: the `defer_update`s, then the
    rows `defer_insert` queued, one statement per table (and way of inserting)."""
    queued: list[tuple[Table, dict[str, Any], bool]] = session.info.get("deferred_inserts") or []
    by_table: dict[tuple[Table, bool], list[dict[str, Any]]] = {}
    for target, row, skip in queued:
        by_table.setdefault((target, skip), []).append(row)
    inserts = [_Write(target, rows, skip) for (target, skip), rows in by_table.items()]
    return [*session.info.get("deferred_updates", []), *inserts]


def _clear_deferred(session: Session) -> None:
    session.info.get("deferred_updates", []).clear()
    session.info.get("deferred_inserts", []).clear()


def _write_optimistically(session: Session, writes: Sequence[_Write]) -> bool:
    """On PostgreSQL, with unique rows queued: insert them with ON CONFLICT DO NOTHING, and with
    them (when they are few, in the same round trip) the other `writes`, inside a savepoint.
    True when every unique row went in (and the rest with them); False when a key was taken
    (rolled back to before: nothing of this went in) or when this does not apply."""
    info = session.info
    queued: list[tuple[Table, dict[str, Any], Any]] = info.get("unique_inserts") or []
    done = info.get("unique_flushed", 0)
    connection = session.connection()
    if connection.dialect.name != "postgresql" or done >= len(queued):
        return False
    unique: dict[Table, list[dict[str, Any]]] = {}
    for target, row, _ in queued[done:]:
        unique.setdefault(target, []).append(row)
    few = sum(len(w.rows) for w in writes) <= PIPELINE_ROWS
    raw = connection.connection.driver_connection
    assert raw is not None
    counted = []
    with raw.pipeline():
        raw.cursor().execute("SAVEPOINT tessera_finish")
        for target, rows in unique.items():
            cursor = raw.cursor()
            _send(connection, cursor, _Write(target, rows, skip=True))
            counted.append((cursor, len(rows)))
        if few:
            cursor = raw.cursor()
            for write in writes:
                _send(connection, cursor, write)
    if any(cursor.rowcount != expected for cursor, expected in counted):
        raw.cursor().execute("ROLLBACK TO SAVEPOINT tessera_finish")
        return False
    info["unique_flushed"] = len(queued)
    if not few:
        write_all(session, writes)
    return True


UNIQUE_LOOKUP_KEYS = 500  # keys per IN list when a conflict is looked for


def insert_many(session: Session, tables: Sequence[tuple[Table, Sequence[dict[str, Any]]]]) -> None:
    """INSERT new rows into several tables (each table's rows with the same columns): see
    `write_all`. A duplicate key fails the insert, as an INSERT would."""
    write_all(session, [_Write(target, list(rows)) for target, rows in tables])


PIPELINE_ROWS = 2048  # up to this many rows go in one pipelined round trip; more by COPY


def write_all(session: Session, writes: Sequence[_Write]) -> None:
    """Several statements of many rows each, as cheaply as the database allows. On PostgreSQL,
    up to PIPELINE_ROWS rows in all go in one round trip (one executemany per statement, in a
    pipeline); beyond that, plain inserts go by COPY (a round trip each, a quarter of the client
    CPU per row, no statement planned per row) and the rest in one pipeline. On SQLite, one
    executemany per statement. Values go through the columns' own types first, as in any
    statement."""
    writes = [write for write in writes if write.rows]
    if not writes:
        return
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        for write in writes:
            if write.key is not None:
                update_rows(session, write.target, write.key, write.columns, write.rows)
            elif write.skip:
                insert_ignoring_duplicates(session, write.target, write.rows)
            else:
                connection.execute(write.target.insert(), write.rows)
        return
    raw = connection.connection.driver_connection
    assert raw is not None
    many = sum(len(write.rows) for write in writes) > PIPELINE_ROWS
    copied = [w for w in writes if many and w.key is None and not w.skip]
    cursor = raw.cursor()
    with raw.pipeline():
        for write in writes:
            if write not in copied:  # `_Write` compares by identity
                _send(connection, cursor, write)
    for write in copied:
        quoted, values = _driver_rows(connection, write.target, write.rows)
        with cursor.copy(f"COPY {write.target.name} ({quoted}) FROM STDIN") as copy:
            for value in values:
                copy.write_row(value)


def _send(connection: Any, cursor: Any, write: _Write) -> None:
    """One executemany of `write`'s rows on a psycopg cursor (in the pipeline it is in)."""
    target = write.target
    if write.key is None:
        quoted, values = _driver_rows(connection, target, write.rows)
        marks = ", ".join(["%s"] * len(values[0]))
        conflict = " ON CONFLICT DO NOTHING" if write.skip else ""
        sql = f"INSERT INTO {target.name} ({quoted}) VALUES ({marks}){conflict}"
    else:
        names = (*write.columns, write.key)
        _, values = _driver_rows(connection, target, [{n: r[n] for n in names} for r in write.rows])
        quote = connection.dialect.identifier_preparer.quote
        assignments = ", ".join(f"{quote(c)} = %s" for c in write.columns)
        sql = f"UPDATE {target.name} SET {assignments} WHERE {quote(write.key)} = %s"
    cursor.executemany(sql, values)


def _driver_rows(
    connection: Any, target: Table, rows: Sequence[dict[str, Any]]
) -> tuple[str, list[list[Any]]]:
    """The quoted column list of `rows` and their values as the driver takes them (through the
    columns' bind processors: JSON serialised, timestamps checked)."""
    names = list(rows[0])
    processors = [target.c[name].type._cached_bind_processor(connection.dialect) for name in names]
    quoted = ", ".join(connection.dialect.identifier_preparer.quote(name) for name in names)
    values = [
        [
            value if process is None or value is None else process(value)
            for value, process in zip(map(row.__getitem__, names), processors, strict=True)
        ]
        for row in rows
    ]
    return quoted, values


def on_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` after this session's transaction commits (never after a rollback)."""
    session.info.setdefault("on_commit", []).append(callback)


RV_BLOCK = 64  # SQLite: versions a transaction reserves at first; each further block doubles
RV_BLOCK_MAX = 4096
# PostgreSQL: a transaction's versions are its transaction id shifted left by RV_SHIFT, plus
# the offset `tessera migrate` keeps (see `lift_versions`), plus a count within it.
RV_SHIFT = 20
RV_OFFSET = "rv_offset"
WRITE_ATTEMPTS = 5
_RESERVE = text("UPDATE counters SET value = value + :n WHERE name = :name RETURNING value")
_TRANSACTION_VERSIONS = text(
    f"SELECT (pg_current_xact_id()::text::bigint << {RV_SHIFT}) + value"
    f" FROM counters WHERE name = '{RV_OFFSET}'"
)
# The horizon: below the oldest transaction of this database still running. The snapshot's
# running transactions (`xip`) are the whole PostgreSQL cluster's; one is passed over only when
# the server's activity table shows it running in another database (other databases' work, and
# every other test's database in a test run, would otherwise hold this store's watches back).
# That table is read once per transaction and kept: a transaction it does not show (begun since)
# is held to, never passed over.
_HORIZON = text(
    f"""SELECT (coalesce(
      (SELECT min(x::text::bigint) FROM pg_snapshot_xip(s.snap) AS x
        WHERE x::text::bigint % 4294967296 NOT IN (
          SELECT a.backend_xid::text::bigint FROM pg_stat_get_activity(NULL) AS a
          WHERE a.backend_xid IS NOT NULL
            AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()))),
      pg_snapshot_xmax(s.snap)::text::bigint) << {RV_SHIFT}) + c.value - 1
    FROM (SELECT pg_current_snapshot() AS snap) AS s, counters AS c
    WHERE c.name = '{RV_OFFSET}'"""
)


def is_retryable(error: BaseException) -> bool:
    """A PostgreSQL serialization failure (40001) or deadlock (40P01): safe to run again (as
    SQLAlchemy wraps it, or as the driver raised it)."""
    orig = getattr(error, "orig", error)
    return getattr(orig, "sqlstate", None) in ("40001", "40P01")


def next_resource_version(session: Session) -> int:
    """The next store-wide resourceVersion for a write in this transaction.

    Versions must reach every watcher and list in increasing order, with nothing committed
    later below a version already seen. How each database keeps that:

    - **PostgreSQL** takes no lock shared by every writer. A transaction's versions are its
      transaction id (which PostgreSQL hands out in increasing order, without a lock held to
      commit) times 2**RV_SHIFT, plus a count. Transactions commit in any order; readers read
      only up to the *horizon* (`current_resource_version`): below the oldest transaction
      still running, every transaction has ended, so nothing can commit there any more.
    - **SQLite** has one writer at a time: versions come from the counter row in blocks, each
      twice the last (unused ones are skipped: resourceVersions are opaque and need not be
      contiguous), and the database's lock orders them by commit.
    """
    if session.get_bind().dialect.name == "postgresql":
        versions = session.info.get("rv_transaction")
        if versions is None:
            first = int(session.connection().execute(_TRANSACTION_VERSIONS).scalar_one())
            versions = session.info["rv_transaction"] = [first, first + (1 << RV_SHIFT) - 1]
        if versions[0] > versions[1]:
            raise RuntimeError(
                f"one transaction may write at most {1 << RV_SHIFT} versions: split the work"
            )
        value = versions[0]
        versions[0] += 1
        return int(value)
    block = session.info.get("rv_block")
    if not block or block[0] > block[1]:
        size = min(2 * block[2], RV_BLOCK_MAX) if block else RV_BLOCK
        block = _reserve_versions(session, size)
        session.info["rv_block"] = block
    value = block[0]
    block[0] += 1
    return int(value)


def _reserve_versions(session: Session, count: int) -> list[int]:
    """[first, last, count]: `count` versions taken from the counter (SQLite)."""
    connection = session.connection()
    last = int(connection.execute(_RESERVE, {"n": count, "name": RESOURCE_VERSION}).scalar_one())
    return [last - count + 1, last, count]


def lift_versions(connection: Connection) -> int:
    """PostgreSQL: make sure every version handed out from now on is above every version
    already in the store, and return the offset. Run by `tessera migrate`: a store restored
    into another PostgreSQL cluster, whose transaction ids start lower, keeps increasing."""
    highest = max(
        int(
            connection.execute(
                text(f"SELECT coalesce(max(resource_version), 0) FROM {name}")
            ).scalar_one()
        )
        for name in ("changes", "events")
    )
    counter = connection.execute(
        text(f"SELECT value FROM counters WHERE name IN ('{RESOURCE_VERSION}', 'compacted')")
    ).scalars()
    highest = max([highest, *map(int, counter)])
    lowest_next = int(connection.execute(_HORIZON).scalar_one()) + 1
    offset = int(
        connection.execute(
            text(f"SELECT value FROM counters WHERE name = '{RV_OFFSET}'")
        ).scalar_one()
    )
    if lowest_next <= highest:
        offset += highest - lowest_next + 1
        connection.execute(
            text("UPDATE counters SET value = :v WHERE name = :n"), {"v": offset, "n": RV_OFFSET}
        )
    return offset


def record_change(
    session: Session,
    row: dict[str, Any],
    *,
    before: dict[str, Any] | None = None,
    selectable: Sequence[str] = (),
) -> None:
    """Queue a change-log row; all queued rows are inserted in one statement before commit.

    For a MODIFIED row, `before` is the object as it was and `selectable` the field paths a
    watch may select on: when the labels or one of those fields changed, `before` is kept in
    the log, so that a watch whose selector matched only one side sees the object appear
    (ADDED) or go (DELETED), as Kubernetes watches do.
    """
    row["previous"] = None
    if before is not None and _selection_changed(before, row["object"], selectable):
        row["previous"] = before
    session.info.setdefault("pending_changes", []).append(row)
    written = session.info.setdefault("kinds_written", {})
    written[row["kind"]] = written.get(row["kind"], 0) + 1


def kind_writes(session: Session, kind: str) -> int:
    """How many changes of `kind` this transaction has logged so far (only ever grows, also
    when a savepoint is rolled back): a read cached in the transaction is still good while
    the count of the kind it read is the one it was taken at."""
    written: dict[str, int] = session.info.get("kinds_written") or {}
    return written.get(kind, 0)


def locked_reads(session: Session, name: str) -> dict[Any, Any]:
    """A cache, for this transaction, of rows it read and locked (`FOR UPDATE`): they cannot
    change under it until it ends, so a burst of creates in one transaction locks and reads
    them once. Emptied when a savepoint is rolled back: the locks taken inside it are gone."""
    caches: dict[str, dict[Any, Any]] = session.info.setdefault("locked_reads", {})
    return caches.setdefault(name, {})


def note_change(session: Session, resource_version: int, kind: str) -> None:
    """A watchable object of a kind that keeps its own log (events) changed in this transaction
    at `resource_version`: watchers are woken after the commit, as for `record_change`."""
    session.info.setdefault("noted", []).append(resource_version)
    session.info.setdefault("noted_kinds", set()).add(kind)


def _selection_changed(before: dict[str, Any], after: dict[str, Any], paths: Sequence[str]) -> bool:
    def value(obj: dict[str, Any], path: str) -> Any:
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    return any(value(before, p) != value(after, p) for p in ("metadata.labels", *paths))


def written_between(column: Any, since: int, upto: int) -> Any:
    """Rows whose resourceVersion `column` is after `since` and at most `upto` (the counter,
    read first: what commits later is written above it, for the next read). Bounded on both
    sides, as a range: PostgreSQL then takes the resourceVersion index even on a table it has
    not analysed yet, where "after `since`" alone looked like a third of the table and was
    scanned whole (the scheduler's every cycle, the node loop's every pass)."""
    return and_(column > since, column <= upto)


def current_resource_version(session: Session) -> int:
    """The store's version as a reader may use it: every change at or below it has committed
    (or never will), so a list or a watch that reads up to it misses nothing that commits later.

    On PostgreSQL, that is the horizon below the oldest write transaction of this database
    still running (see `next_resource_version`): changes above it that have committed wait for
    the next read. (Prepared transactions, which Tessera does not use, are not seen there.)"""
    if session.get_bind().dialect.name == "postgresql":
        return int(session.connection().execute(_HORIZON).scalar_one())
    value = session.get(Counter, RESOURCE_VERSION)
    return value.value if value is not None else 0


def insert_unless_exists(session: Session, target: Table, values: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; False when a unique key already held the row.

    No error is raised on a conflict, so the transaction stays usable without a savepoint.
    """
    dialect = session.get_bind().dialect.name
    insert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(target)
    key = next(iter(target.primary_key.columns))
    statement = insert.on_conflict_do_nothing().returning(key)
    return session.connection().execute(statement, values).first() is not None


def update_rows(
    session: Session, target: Table, key: str, columns: Sequence[str], rows: Sequence[Any]
) -> None:
    """UPDATE `target` SET `columns` WHERE `key` = ..., one row of values per mapping in `rows`,
    in one executemany (one statement, whatever the number of rows)."""
    if not rows:
        return
    statement = (
        target.update()
        .where(target.c[key] == bindparam(f"b_{key}"))
        .values({c: bindparam(f"b_{c}") for c in columns})
    )
    session.execute(statement, [{f"b_{c}": row[c] for c in (key, *columns)} for row in rows])


def is_check_violation(error: IntegrityError) -> bool:
    """True when the database refused a write because a CHECK constraint failed."""
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == "23514")
    return "CHECK constraint failed" in str(orig)


def is_unique_violation(error: IntegrityError) -> bool:
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == "23505")
    return "UNIQUE constraint failed" in str(orig)


def is_lock_timeout(error: BaseException) -> bool:
    """SQLite's busy time-out, or PostgreSQL's lock_timeout (55P03), as SQLAlchemy wraps it or
    as the driver raised it (the deferred writes go through the driver's cursor)."""
    orig = getattr(error, "orig", error)
    return getattr(orig, "sqlstate", None) == "55P03" or "database is locked" in str(orig)


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _owner_only(database: str | None) -> None:
    """The SQLite database, its WAL and shared memory file are the owner's alone (0600)."""
    if not database or database == ":memory:":
        return
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.chmod(database + suffix, 0o600)


IDLE_PING_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """A pooled connection that sat idle is checked with a ping before it is handed out (a
    database that restarted meanwhile closed it: the pool then opens a new one); one in steady
    use is not, which saves a round trip per transaction under load."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            dbapi_connection.execute("SELECT 1")
            dbapi_connection.rollback()  # leave it as idle as it was
        except Exception as exc:
            raise DisconnectionError(f"the database closed an idle connection: {exc}") from exc


def _sqlite_engine(url: str, *, echo: bool) -> Engine:
    database = make_url(url).database
    if database and database != ":memory:":
        # Created 0600, never wider for a moment. Only a file that does not exist yet is opened
        # here: closing any descriptor of a database file drops every POSIX lock this process
        # holds on it, so touching one that another engine of this process has open would let
        # two writers in at once and corrupt it.
        with contextlib.suppress(FileNotFoundError, FileExistsError):
            os.close(os.open(database, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    engine = create_engine(
        url,
        echo=echo,
        connect_args={"check_same_thread": False, "timeout": 30},
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
        pool_size=8,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy emit BEGIN itself (pysqlite's implicit transactions are off).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        # After a checkpoint the WAL file is cut back to this size instead of staying as
        # large as the largest transaction ever made it.
        cursor.execute("PRAGMA journal_size_limit=67108864")
        cursor.close()
        _owner_only(database)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def insert_ignoring_duplicates(
    session: Session, target: Table, rows: Sequence[dict[str, Any]]
) -> None:
    """INSERT many rows in one statement; rows whose primary key exists are skipped silently."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(target)
    session.connection().execute(insert.on_conflict_do_nothing(), list(rows))


def upsert(
    session: Session, target: Table, rows: Sequence[dict[str, Any]], *, update: Sequence[str]
) -> None:
    """INSERT many rows; where the primary key exists, overwrite the `update` columns."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(target)
    keys = [c.name for c in target.primary_key.columns]
    statement = insert.on_conflict_do_update(
        index_elements=keys, set_={c: getattr(insert.excluded, c) for c in update}
    )
    session.connection().execute(statement, list(rows))
