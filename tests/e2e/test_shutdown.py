"""Stopping `tessera serve`: clients that keep an idle connection open (every HTTP client's
pool does) do not hold the stop for the graceful timeout, which is for requests in flight; open
watches end cleanly at the stop (a Kubernetes API server ends them too) rather than being
cancelled at that timeout."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import orjson
import pytest

from tests.e2e.conftest import KUBECTL, Process, start_server, stop_server


@pytest.fixture
def server(fresh_database_url: str, tmp_path: Path) -> Process:
    """A `tessera serve` of its own, on a fresh database: each test stops it."""
    return start_server(tmp_path, fresh_database_url)


def served_log(tmp_path: Path) -> str:
    return "".join(path.read_text() for path in tmp_path.glob("serve-*.log"))


@pytest.mark.parametrize("fresh_database_url", ["sqlite"], indirect=True)
def test_idle_keep_alive_clients_do_not_hold_the_stop(server: Process, tmp_path: Path) -> None:
    clients = [server.admin() for _ in range(3)]
    try:
        for http in clients:  # each now holds a pooled TLS connection it does not read
            assert http.get("/api/v1/namespaces").status_code == 200
        stop_server(server)
        assert server.process.returncode is not None  # it stopped
    finally:
        for http in clients:
            http.close()
    log = served_log(tmp_path)
    assert "graceful shutdown exceeded" not in log, log[-2000:]


@pytest.mark.parametrize("fresh_database_url", ["sqlite"], indirect=True)
def test_open_watches_end_cleanly_when_the_server_stops(server: Process, tmp_path: Path) -> None:
    # kubectl's watch, and a raw one read line by line
    kubectl = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(server.kubeconfig(None)), "get", "namespaces", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    http = server.admin()
    seen: list[dict] = []
    ended: list[BaseException | None] = []
    opened = threading.Event()

    def watch() -> None:
        try:
            with http.stream("GET", "/api/v1/namespaces?watch=true&timeoutSeconds=600") as stream:
                for line in stream.iter_lines():
                    seen.append(orjson.loads(line))
                    opened.set()
            ended.append(None)  # the stream ended as a complete response
        except BaseException as exc:  # what the client saw: asserted below
            ended.append(exc)
        finally:
            opened.set()

    reader = threading.Thread(target=watch)
    reader.start()
    try:
        assert opened.wait(30) and seen and seen[0]["type"] == "ADDED"
        assert kubectl.stdout is not None
        assert kubectl.stdout.readline().split()[:1] == ["NAME"]  # its watch is open
        stop_server(server)
        reader.join(30)
        kubectl.wait(30)
    finally:
        http.close()
        if kubectl.poll() is None:
            kubectl.kill()
    assert ended == [None], ended  # the raw watch: the whole response, last chunk included
    assert kubectl.returncode is not None  # kubectl's watch ended with the server
    log = served_log(tmp_path)
    assert "graceful shutdown exceeded" not in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]
