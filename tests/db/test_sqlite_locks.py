"""SQLite's locks are per process: closing any descriptor of a database file drops every POSIX
lock the process holds on it. Opening a second engine on a file this process already uses
(the CLI next to a running server, in one test process) must not do that, or another process
believes it is the last user, checkpoints and deletes the WAL under the first engine, and the
database is corrupted ("database disk image is malformed")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from app.db.engine import Database

READ_AND_CLOSE = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
    "c.execute('SELECT count(*) FROM t').fetchall(); c.close()"
)


def test_a_second_engine_keeps_the_first_ones_wal_alive(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    first = Database(f"sqlite:///{path}")
    first.write(lambda s: s.execute(text("CREATE TABLE t (x INTEGER)")))
    first.write(lambda s: s.execute(text("INSERT INTO t VALUES (1)")))
    held = first.engine.connect()
    held.execute(text("SELECT 1"))
    second = Database(f"sqlite:///{path}")  # e.g. `tessera usage` while the server runs
    assert second.read(lambda s: s.execute(text("SELECT count(*) FROM t")).scalar()) == 1
    # another process opens and closes the file: it must still see the first engine
    subprocess.run([sys.executable, "-c", READ_AND_CLOSE, str(path)], check=True)
    assert path.with_name("shared.db-wal").exists()
    first.write(lambda s: s.execute(text("INSERT INTO t VALUES (2)")))
    assert held.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    assert second.read(lambda s: s.execute(text("SELECT count(*) FROM t")).scalar()) == 2
    held.close()
    first.dispose()
    second.dispose()


def test_a_new_database_file_is_the_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Database(f"sqlite:///{path}").dispose()
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600
