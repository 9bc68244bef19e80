"""The `tessera` command line as a newcomer meets it: what it imports, and what it says when it
is pointed at no database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from app.cli import cli

TESSERA = str(Path(sys.executable).parent / "tessera")


def test_help_lists_bench() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output


def test_everyday_commands_import_neither_the_benchmarks_nor_the_web_framework() -> None:
    """`tessera --help` and `tessera tenant create` load the CLI and the database layer only:
    the benchmarks (the solver, OR-Tools) cost seconds, and the production image ships none."""
    probe = (
        "import sys, app.cli, app.db.engine, app.auth.service; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'bench', 'ortools', 'fastapi', 'scheduler', 'matplotlib', 'numpy'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_bench_is_still_a_command() -> None:
    done = subprocess.run([TESSERA, "bench", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "burst" in done.stdout and "openb" in done.stdout


def _run(cwd: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return subprocess.run(
        [TESSERA, *args],
        cwd=cwd,
        env={**clean, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_pointed_at_no_database_says_so_and_creates_nothing(tmp_path: Path) -> None:
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    done = _run(elsewhere, home, "tenant", "create", "acme")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"there is no database in {elsewhere / '.tessera'}" in done.stderr
    assert "TESSERA_DATA_DIR" in done.stderr
    assert list(elsewhere.iterdir()) == []  # no stray .tessera/

    # A database without Tessera's schema (an empty SQLite file): named as such.
    (elsewhere / ".tessera").mkdir()
    (elsewhere / ".tessera" / "tessera.db").touch()
    done = _run(elsewhere, home, "tenant", "list")
    assert done.returncode == 1 and "holds no Tessera schema" in done.stderr

    # A server running here (its record in the user's list of running servers): the message
    # names its data directory, with which the command then works.
    data = tmp_path / "served" / ".tessera"
    migrated = _run(tmp_path, home, "migrate", TESSERA_DATA_DIR=str(data))
    assert migrated.returncode == 0, migrated.stderr
    servers = home / ".local" / "state" / "tessera" / "servers"
    servers.mkdir(parents=True)
    record = {"url": "https://127.0.0.1:9443", "pid": os.getpid(), "dataDir": str(data)}
    (servers / f"{os.getpid()}.json").write_text(json.dumps(record))
    done = _run(elsewhere, home, "tenant", "list")
    assert done.returncode == 1
    assert f"https://127.0.0.1:9443  TESSERA_DATA_DIR={data}" in done.stderr
    created = _run(elsewhere, home, "tenant", "create", "acme", TESSERA_DATA_DIR=str(data))
    assert created.returncode == 0, created.stderr
    # The record of a process that is gone is dropped, not shown.
    (servers / "gone.json").write_text(json.dumps({**record, "pid": 4_194_303}))
    assert "9443" in _run(elsewhere, home, "tenant", "list").stderr
    assert not (servers / "gone.json").exists()
