"""Tessera's long-running commands stop at once and cleanly on SIGTERM, as `docker stop` sends it
to a container's PID 1 (which has no default action for it: a process that does not handle it
is killed after the stop timeout): real processes, real signals."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.models import Lease
from tests.conftest import free_port, migrated_database

TESSERA = str(Path(sys.executable).with_name("tessera"))
STOP_SECONDS = 8.0  # docker stop waits 10 s before it kills: a stop well within it


class Processes:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs, self.started = env, logs, []

    def start(self, name: str, *argv: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [TESSERA, *argv],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process.name = name  # type: ignore[attr-defined]
        self.started.append(process)
        return process

    def log(self, process: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"{process.name}.log").read_text()  # type: ignore[attr-defined]

    def stop(self, process: subprocess.Popen[bytes]) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds it took to exit)."""
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"{process.name} ignored SIGTERM:\n{self.log(process)}")  # type: ignore[attr-defined]
        return code, time.monotonic() - began


@pytest.fixture(scope="module")
def own_database_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of this module's own, on the worker's backend: the node agents and schedulers
    started here act for every node and lease they find, which must not be other tests'."""
    backend = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    with migrated_database(backend, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module")
def db(own_database_url: str) -> Iterator[Database]:
    database = Database(own_database_url)
    bootstrap(database)
    yield database
    database.dispose()


@pytest.fixture
def processes(own_database_url: str, db: Database, tmp_path: Path) -> Iterator[Processes]:
    env = {
        **os.environ,
        "TESSERA_DATABASE_URL": own_database_url,
        "TESSERA_DATA_DIR": str(tmp_path),
    }
    env.pop("TESSERA_REDIS_URL", None)
    started = Processes(env, tmp_path)
    yield started
    for process in started.started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def holder(db: Database) -> str | None:
    return db.read(
        lambda s: s.scalar(
            select(Lease.holder_identity).where(
                Lease.namespace == "kube-system", Lease.name == "tessera-scheduler"
            )
        )
    )


def test_a_leading_scheduler_stops_on_sigterm_and_its_standby_takes_over_at_once(
    processes: Processes, db: Database
) -> None:
    alive = Path(processes.env["TESSERA_DATA_DIR"]) / "alive"
    first = processes.start(
        "scheduler-1",
        "scheduler",
        TESSERA_SCHEDULER_LEASE_SECONDS="30",
        TESSERA_ALIVE_FILE=str(alive),
    )
    leader = eventually(lambda: holder(db), 60, "no scheduler took the lease")
    # What the container's healthcheck reads: touched while the process runs.
    touched = eventually(lambda: alive.exists() and alive.stat().st_mtime, 10, "never touched")
    eventually(lambda: alive.stat().st_mtime > touched, 10, "touched once only")
    second = processes.start("scheduler-2", "scheduler", TESSERA_SCHEDULER_LEASE_SECONDS="30")
    eventually(lambda: "waiting for" in processes.log(second), 60, "the standby never campaigned")
    assert holder(db) == leader and f"_{first.pid}_" in leader

    code, took = processes.stop(first)
    assert code == 0, processes.log(first)
    assert took < STOP_SECONDS, processes.log(first)
    assert "Traceback" not in processes.log(first)
    # Released: the standby holds it within its next attempt (a second), not after the 30 s
    # the lease would otherwise have run.
    began = time.monotonic()
    taken = eventually(lambda: (h := holder(db)) and h != leader and h, 10, "no takeover")
    assert f"_{second.pid}_" in taken and time.monotonic() - began < 5

    code, took = processes.stop(second)
    assert (code, took < STOP_SECONDS) == (0, True), processes.log(second)
    assert holder(db) is None  # released again: a scheduler started now leads at once


def test_the_node_loop_and_the_api_stop_on_sigterm(processes: Processes) -> None:
    port = free_port()
    api = processes.start("api", "serve", "--insecure-http", "--port", str(port))
    loop = processes.start("agent", "agent")
    eventually(lambda: _answers(f"http://127.0.0.1:{port}/readyz"), 60, "the API did not start")
    eventually(lambda: "the node loop runs" in processes.log(loop), 60, "no node loop")
    for process in (loop, api):
        code, took = processes.stop(process)
        assert code == 0, processes.log(process)
        assert took < STOP_SECONDS, processes.log(process)
        assert "Traceback" not in processes.log(process)


def test_the_node_agents_stop_on_sigterm(processes: Processes, tmp_path: Path) -> None:
    """`tessera agent --virtual` (the compose stack's node agent), waiting for its API server or
    acting for its nodes, stops at once."""
    port = free_port()
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "nodeClasses: {c: {cpu: 8, memory: 32Gi}}\n"
        "regions: [{name: r, zones: [{name: z, racks: [{name: k, nodes: {c: 1}}]}]}]\n"
    )
    loaded = subprocess.run(
        [TESSERA, "inventory", "load", str(pool)],
        env=processes.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    processes.start("api", "serve", "--port", str(port))  # its TLS files, then it serves
    server = f"https://127.0.0.1:{port}"
    ca = tmp_path / "tls" / "ca.crt"
    eventually(lambda: ca.exists() and _answers(f"{server}/readyz", ca), 60, "no API")
    nowhere = f"https://127.0.0.1:{free_port()}"
    waiting = processes.start(
        "waiting", "agent", "--virtual", "--issue-tokens", TESSERA_AGENT_SERVER=nowhere
    )
    eventually(lambda: "waiting for the API server" in processes.log(waiting), 60, "no agent")
    code, took = processes.stop(waiting)
    assert (code, took < STOP_SECONDS) == (0, True), processes.log(waiting)

    acting = processes.start("acting", "agent", "--virtual", TESSERA_AGENT_SERVER=server)
    eventually(lambda: "acting for 1 node" in processes.log(acting), 60, "the agent did not start")
    time.sleep(1)  # its lease renewed, its pod watch open
    code, took = processes.stop(acting)
    assert code == 0, processes.log(acting)
    assert took < STOP_SECONDS, processes.log(acting)
    assert "Traceback" not in processes.log(acting)


def _answers(url: str, ca: Path | None = None) -> bool:
    try:
        verify = ssl.create_default_context(cafile=str(ca)) if ca else True
        return httpx.get(url, timeout=1, verify=verify).is_success
    except httpx.HTTPError:
        return False
