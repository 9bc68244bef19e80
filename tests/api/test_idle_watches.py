"""Idle watches cost the store nothing: a watch reads the change log when it is told of a
change of its kind (by a commit in its process, through Redis, or by the process's one
follower of the log), not on every wake to check its token. A change no notification tells
of still reaches every watch, through the follower."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import httpx
import pytest

from app.watch import log
from tests.conftest import ThreadedServer
from tests.factories import pod

WATCHES = 8


def test_idle_watches_do_not_read_the_log_yet_see_every_change(
    server: ThreadedServer, make_tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = make_tenant("idle")
    path = f"/api/v1/namespaces/{api.tenant}/pods"
    reads: Counter[str] = Counter()
    read_after = log.read_after

    def counted(session, **query):  # type: ignore[no-untyped-def]
        if query.get("namespace") == api.tenant:
            reads["log"] += 1
        return read_after(session, **query)

    monkeypatch.setattr(log, "read_after", counted)
    start = api.get(path).json()["metadata"]["resourceVersion"]
    seen: list[list[str]] = [[] for _ in range(WATCHES)]
    opened = threading.Barrier(WATCHES + 1)

    def watch(i: int) -> None:
        with (
            httpx.Client(base_url=server.url, headers=api.http.headers, timeout=30) as client,
            client.stream(
                "GET",
                path,
                params={"watch": "true", "resourceVersion": start, "timeoutSeconds": "25"},
            ) as response,
        ):
            assert response.status_code == 200
            opened.wait()
            for line in response.iter_lines():
                seen[i].append(json.loads(line)["object"]["metadata"]["name"])
                if len(seen[i]) == 2:
                    return

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(WATCHES)]
    for thread in threads:
        thread.start()
    opened.wait(timeout=20)
    # Each checks its token every second (the test server caches none): four wakes each.
    time.sleep(4)
    idle_reads = reads["log"]
    assert idle_reads <= 2 * WATCHES, f"{idle_reads} reads of the log by {WATCHES} idle watches"

    assert api.post(path, json=pod("told")).status_code == 201
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(s == ["told"] for s in seen):
        time.sleep(0.05)
    assert all(s == ["told"] for s in seen), seen

    # A commit no notification tells of (as another process's with no Redis): the follower
    # of the log finds it within `watch_poll_seconds`, and every watch sees it.
    publish, server.services.db.on_changes = server.services.db.on_changes, None
    try:
        assert api.post(path, json=pod("untold")).status_code == 201
    finally:
        server.services.db.on_changes = publish
    for thread in threads:
        thread.join(timeout=15)
    assert all(s == ["told", "untold"] for s in seen), seen
