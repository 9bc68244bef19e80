"""Stopping `tessera serve`: clients that keep an idle connection open (every HTTP client's
pool does) do not hold the stop for the graceful timeout, which is for requests in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db.migrate import upgrade
from tests.e2e.conftest import start_server, stop_server


@pytest.mark.parametrize("empty_database_url", ["sqlite"], indirect=True)
def test_idle_keep_alive_clients_do_not_hold_the_stop(
    empty_database_url: str, tmp_path: Path
) -> None:
    upgrade(empty_database_url)
    server = start_server(tmp_path, empty_database_url)
    clients = [server.admin() for _ in range(3)]
    try:
        for http in clients:  # each now holds a pooled TLS connection it does not read
            assert http.get("/api/v1/namespaces").status_code == 200
        stop_server(server)
        assert server.process.returncode is not None  # it stopped
    finally:
        for http in clients:
            http.close()
    log = "".join(path.read_text() for path in tmp_path.glob("serve-*.log"))
    assert "graceful shutdown exceeded" not in log, log[-2000:]
