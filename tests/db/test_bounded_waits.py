"""No stuck process holds the others (PostgreSQL): a writer paused inside its transaction is ended
by the server and its locks released, and a statement waits for a lock only so long, the
request then answered 503 with Retry-After, nothing written. (SQLite: one process's writers, its
own busy time-out; see tests/db/test_sqlite_locks.py.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.db.engine import IDLE_IN_TRANSACTION_MS, RESOURCE_VERSION, next_resource_version
from tests.conftest import unique
from tests.factories import pod

LOCK_COUNTER = text("UPDATE counters SET value = value + 1 WHERE name = :name")


def _postgres_only(db: Any) -> None:
    if db.is_sqlite:
        pytest.skip("SQLite serializes writers by its own busy time-out")


def test_a_writer_paused_inside_its_transaction_is_ended_and_blocks_no_one(db) -> None:
    _postgres_only(db)
    paused = db.engine.connect()
    transaction = paused.begin()
    paused.execute(LOCK_COUNTER, {"name": RESOURCE_VERSION})  # every writer's first lock
    # ...and then the process stops (SIGSTOP, a GC pause): the session sits idle in its
    # transaction. Another writer goes on once the server has ended it.
    got: list[int] = []
    writer = threading.Thread(target=lambda: got.append(db.write(next_resource_version)))
    writer.start()
    writer.join(timeout=IDLE_IN_TRANSACTION_MS / 1000 + 20)
    assert not writer.is_alive(), "a writer waited on a paused transaction without bound"
    assert got and got[0] > 0
    # the paused writer, resumed, finds its transaction gone: nothing of it is committed late
    with pytest.raises(DBAPIError):
        paused.execute(text("SELECT 1"))
        transaction.commit()
    paused.invalidate()
    paused.close()


def test_a_request_waiting_too_long_for_a_lock_is_503_and_writes_nothing(
    server, tenant, db
) -> None:
    _postgres_only(db)
    busy = server.services.db.engine.connect()
    transaction = busy.begin()
    busy.execute(LOCK_COUNTER, {"name": RESOURCE_VERSION})

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
