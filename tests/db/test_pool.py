"""Pooled PostgreSQL connections: a connection the server closed while it sat idle is replaced
before it is used, without a ping on every transaction."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from app.db import engine as engine_module
from app.db.engine import Database
from tests.conftest import drop_postgres_database, fresh_postgres_database


def test_an_idle_connection_the_server_closed_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "IDLE_PING_SECONDS", 0.2)
    database_url, name = fresh_postgres_database()
    db = Database(database_url, pool_size=1)
    try:
        pid = db.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one())
        admin = make_url(database_url).set(drivername="postgresql")
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.3)  # idle longer than IDLE_PING_SECONDS: pinged, found closed, replaced
        again = db.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one())
        assert again != pid
        # in steady use it is not pinged: the same connection, one statement per transaction
        statements: list[str] = []
        event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        assert db.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one()) == again
        assert statements == ["SELECT pg_backend_pid()"]
    finally:
        db.dispose()
        drop_postgres_database(name)
