"""No stuck process holds the others (PostgreSQL): a writer paused inside its transaction is ended
by the server and its locks released, and a statement waits for a lock only so long, the
request then answered 503 with Retry-After, nothing written. (SQLite: one process's writers, its
own busy time-out; see tests/db/test_sqlite_locks.py.)"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db.engine import (
    IDLE_IN_TRANSACTION_MS,
    RESOURCE_VERSION,
    current_resource_version,
    next_resource_version,
)
from tests.conftest import unique
from tests.factories import pod

# A row some writers need (any row: a pod's, a node's); no lock is shared by every writer.
LOCK_ROW = text("UPDATE counters SET value = value + 1 WHERE name = :name")
STATE = text("SELECT state FROM pg_stat_activity WHERE pid = :pid")


def _postgres_only(db: Any) -> None:
    if db.is_sqlite:
        pytest.skip("SQLite serializes writers by its own busy time-out")


def test_a_writer_paused_inside_its_transaction_is_ended_and_its_locks_released(db) -> None:
    _postgres_only(db)
    paused = db.engine.connect()
    transaction = paused.begin()
    paused.execute(LOCK_ROW, {"name": RESOURCE_VERSION})
    # ...and then the process stops (SIGSTOP, a GC pause): the session sits idle in its
    # transaction. A writer that needs the same row goes on once the server has ended it.
    got: list[Any] = []
    writer = threading.Thread(
        target=lambda: got.append(
            db.write(lambda s: s.execute(LOCK_ROW, {"name": RESOURCE_VERSION}))
        )
    )
    writer.start()
    writer.join(timeout=IDLE_IN_TRANSACTION_MS / 1000 + 20)
    assert not writer.is_alive(), "a writer waited on a paused transaction without bound"
    assert got
    # the paused writer, resumed, finds its transaction gone: nothing of it is committed late
    with pytest.raises(DBAPIError):
        paused.execute(text("SELECT 1"))
        transaction.commit()
    paused.invalidate()
    paused.close()


def test_a_writer_paused_after_taking_versions_holds_back_no_other_writer(db) -> None:
    """The resourceVersions a transaction takes lock nothing: other writers take theirs and
    commit while it sits paused. Readers see its versions' range as still open (the horizon
    stays below it) until it ends, and then every write above it at once."""
    _postgres_only(db)
    paused = Session(bind=db.engine)
    held = next_resource_version(paused)  # and the process stops, inside its transaction
    pid = paused.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    try:
        later = [db.write(next_resource_version) for _ in range(3)]
        # they committed while the paused one is still open: none waited for it
        assert db.read(lambda s: s.execute(STATE, {"pid": pid}).scalar_one()) == (
            "idle in transaction"
        )
        assert held < min(later)
        assert db.read(current_resource_version) < held, "read past a version still open"
    finally:
        paused.rollback()
        paused.close()
    # (other writers of this store may be running: their transactions end within moments)
    deadline = time.monotonic() + 10
    while db.read(current_resource_version) < max(later) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert db.read(current_resource_version) >= max(later)


def test_a_request_waiting_too_long_for_a_lock_is_503_and_writes_nothing(
    server, tenant, db
) -> None:
    _postgres_only(db)
    busy = server.services.db.engine.connect()
    transaction = busy.begin()
    busy.execute(text("LOCK TABLE pods IN SHARE MODE"))  # no pod can be added meanwhile

    def hold() -> None:  # busy, not idle: a long statement while the lock is held
        try:
            busy.execute(text("SELECT pg_sleep(13)"))
        finally:
            transaction.rollback()
            busy.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        name = unique("lk-")
        response = tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=pod(name))
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "1"
        assert "store is busy" in response.json()["message"]
    finally:
        holder.join()
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/{name}").status_code == 404


def _stopped_mid_pipeline(db: Any, name: str) -> Any:
    """A writer whose process stopped in the middle of a pipeline of statements (as psycopg's
    executemany sends them): the server ran what it was sent, a row locked, and waits for the
    rest, with no Sync to end the pipeline. Its idle-in-transaction time-out is short."""
    import psycopg

    conninfo = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    stuck = psycopg.connect(conninfo, options="-c idle_in_transaction_session_timeout=300")
    pg = stuck.pgconn
    pg.enter_pipeline_mode()
    pg.send_query_params(b"BEGIN", None)
    pg.send_query_params(b"UPDATE counters SET value = value + 1 WHERE name = $1", [name.encode()])
    pg.flush()
    return stuck


def _state(db: Any, pid: int) -> tuple[str, str] | None:
    row = db.read(
        lambda s: s.execute(
            text("SELECT state, wait_event FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).first()
    )
    return None if row is None else (row[0], row[1])


def test_a_writer_stopped_in_the_middle_of_a_pipeline_is_ended(server, db) -> None:
    """The idle-in-transaction time-out does not end a session waiting for the rest of a
    pipeline (it is active, not idle): every API process ends such writers once their client
    has sent nothing for the idle time-out, and the row they locked is free again."""
    _postgres_only(db)
    name = unique("pipe-")
    db.write(lambda s: s.execute(text("INSERT INTO counters VALUES (:n, 0)"), {"n": name}))
    stuck = _stopped_mid_pipeline(db, name)
    pid = stuck.pgconn.backend_pid
    try:
        time.sleep(1.0)  # three times its idle time-out: still there, and still writing
        assert _state(db, pid) == ("active", "ClientRead")
        deadline = time.monotonic() + IDLE_IN_TRANSACTION_MS / 1000 + 10
        while _state(db, pid) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _state(db, pid) is None, "a writer stopped mid-pipeline was never ended"
        # its lock is gone (it would hold this write up to the lock time-out) and its write too
        db.write(lambda s: s.execute(LOCK_ROW, {"name": name}))
        value = db.read(
            lambda s: s.execute(
                text("SELECT value FROM counters WHERE name = :n"), {"n": name}
            ).scalar_one()
        )
        assert value == 1
    finally:
        stuck.close()
