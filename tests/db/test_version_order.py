"""Every watcher sees exactly what committed, in order: a model check of resourceVersions.

Writer processes (tests/db/version_writer.py) create, update, write the status of and delete
ConfigMaps of one namespace through the registry's store, side by side, each write in its own
transaction with a random pause inside it, so that transactions take their versions and commit
in other orders; two of them are SIGKILLed at random moments, perhaps inside a transaction.
Meanwhile clients use the real API over HTTP: watches from the start, from the version of a
paged list, and a watch that stops and resumes from the last event it got. Afterwards the
change log is what committed; every writer's acknowledged write must be in it, and every
watcher must have seen exactly the log's entries after where it started, in increasing
version order: nothing skipped (a transaction that committed below a version already sent),
nothing twice. A list and the watch from its version end at the store's final state.

The schedule is random; its seed is in every failure's message (TESSERA_TEST_SEED repeats it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select

from app.db.models import Change, table
from tests.conftest import Api

WRITERS = 4
KILLED = 2
SECONDS = 8.0
SENTINEL = "zz-sentinel"
ROOT = Path(__file__).resolve().parents[2]
changes_t = table(Change)

Event = tuple[int, str, str]  # resourceVersion, type, name


class Watcher(threading.Thread):
    """One watch client: from `start` (None: list first, paged, and watch from the list's
    version), resuming from its last event after `resume_after` events if given, until it
    sees the sentinel's ADDED."""

    def __init__(self, api: Api, namespace: str, start: int | None, resume_after: int = 0):
        super().__init__(daemon=True)
        self.api, self.namespace, self.start_at = api, namespace, start
        self.resume_after = resume_after
        self.events: list[Event] = []
        self.listed: dict[str, int] = {}
        self.state: dict[str, int] = {}
        self.error: BaseException | None = None
        self.resumes = 0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _list(self) -> int:
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        token, version = None, None
        while True:
            params: dict[str, Any] = {"limit": 3}
            if token:
                params["continue"] = token
            page = self.api.get(path, params=params)
            assert page.status_code == 200, page.text
            body = page.json()
            version = version or int(body["metadata"]["resourceVersion"])
            for item in body["items"]:
                self.listed[item["metadata"]["name"]] = int(item["metadata"]["resourceVersion"])
            token = body["metadata"].get("continue")
            if not token:
                break
        self.state = dict(self.listed)
        return version

    def _run(self) -> None:
        since = self.start_at if self.start_at is not None else self._list()
        self.start_at = since
        while True:
            done, since = self._watch(since)
            if done:
                return
            self.resumes += 1

    def _watch(self, since: int) -> tuple[bool, int]:
        url = f"/api/v1/namespaces/{self.namespace}/configmaps"
        params = {"watch": "true", "resourceVersion": str(since), "timeoutSeconds": "120"}
        with self.api.stream("GET", url, params=params, timeout=150) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if not line:
                    continue
                event = orjson.loads(line)
                assert event["type"] != "ERROR", event
                meta = event["object"]["metadata"]
                version, name = int(meta["resourceVersion"]), meta["name"]
                self.events.append((version, event["type"], name))
                if event["type"] == "DELETED":
                    self.state.pop(name, None)
                else:
                    self.state[name] = version
                since = version
                if name == SENTINEL:
                    return True, since
                if self.resume_after and len(self.events) % self.resume_after == 0:
                    return False, since  # the client goes, and comes back from here
        return False, since


def test_every_watcher_sees_exactly_what_committed_in_order(server, tenant, tmp_path) -> None:
    seed = int(os.environ.get("TESSERA_TEST_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    why = f"(seed {seed}: TESSERA_TEST_SEED={seed} repeats this schedule)"
    namespace = tenant.tenant
    url = server.services.db.url.render_as_string(hide_password=False)
    empty = tenant.get(f"/api/v1/namespaces/{namespace}/configmaps")
    begin = int(empty.json()["metadata"]["resourceVersion"])

    watchers = [Watcher(tenant, namespace, begin)]
    watchers[0].start()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = [tmp_path / f"writer-{i}.jsonl" for i in range(WRITERS)]
    module = [sys.executable, "-m", "tests.db.version_writer", url, namespace]
    writers = [
        subprocess.Popen(
            [*module, str(rng.randrange(1 << 30)), str(SECONDS), str(log)],
            cwd=ROOT,
            env=env,
        )
        for log in logs
    ]
    # while they write: clients join at random moments, two writers are killed
    plan = sorted(
        [(rng.uniform(0.5, SECONDS - 1), "list") for _ in range(2)]
        + [(rng.uniform(0.5, SECONDS - 1), "resume")]
        + [(rng.uniform(0.5, SECONDS - 0.5), "kill") for _ in range(KILLED)]
    )
    started = time.monotonic()
    victims = rng.sample(writers, KILLED)
    for at, what in plan:
        time.sleep(max(0.0, at - (time.monotonic() - started)))
        if what == "kill":
            victims.pop().send_signal(signal.SIGKILL)
        elif what == "list":
            watchers.append(Watcher(tenant, namespace, None))
            watchers[-1].start()
        else:
            version = watchers[0].events[-1][0] if watchers[0].events else begin
            watchers.append(Watcher(tenant, namespace, version, resume_after=rng.randint(3, 15)))
            watchers[-1].start()
    for writer in writers:
        writer.wait(timeout=SECONDS + 60)
    made = tenant.post(
        f"/api/v1/namespaces/{namespace}/configmaps", json={"metadata": {"name": SENTINEL}}
    )
    assert made.status_code == 201, made.text
    for watcher in watchers:
        watcher.join(timeout=60)
        assert not watcher.is_alive(), f"a watcher never saw the last change {why}"
        assert watcher.error is None, f"{watcher.error!r} {why}"

    logged: list[Event] = server.services.db.read(
        lambda s: [
            (int(r.resource_version), r.type, r.name)
            for r in s.execute(
                select(changes_t.c.resource_version, changes_t.c.type, changes_t.c.name)
                .where(changes_t.c.kind == "ConfigMap", changes_t.c.namespace == namespace)
                .order_by(changes_t.c.resource_version)
            )
        ]
    )
    assert logged[-1][2] == SENTINEL

    # every write a writer was told had committed is in the log, as it was told
    types = {"create": "ADDED", "update": "MODIFIED", "status": "MODIFIED", "delete": "DELETED"}
    by_version = {version: (kind, name) for version, kind, name in logged}
    acknowledged = [json.loads(line) for log in logs if log.exists() for line in log.open()]
    assert len(acknowledged) > 50, f"too few writes to tell anything {why}"
    for verb, name, version in acknowledged:
        assert by_version.get(version) == (types[verb], name), (
            f"acknowledged {verb} of {name} at {version} is not in the log {why}"
        )

    # the log replays into the store's final state
    final: dict[str, int] = {}
    for version, kind, name in logged:
        assert (kind == "ADDED") == (name not in final), f"{kind} of {name} at {version} {why}"
        if kind == "DELETED":
            del final[name]
        else:
            final[name] = version
    listed = tenant.get(f"/api/v1/namespaces/{namespace}/configmaps").json()["items"]
    assert {o["metadata"]["name"]: int(o["metadata"]["resourceVersion"]) for o in listed} == final

    for watcher in watchers:
        start = watcher.start_at
        assert start is not None
        expected = [event for event in logged if event[0] > start]
        seen = watcher.events
        versions = [version for version, _, _ in seen]
        assert versions == sorted(set(versions)), f"out of order or twice {why}"
        missing = sorted(set(expected) - set(seen))
        assert not missing, f"a watch from {start} skipped {missing[:5]} {why}"
        assert seen == expected, f"a watch from {start} saw what never committed {why}"
        if watcher.listed or (start != begin and not watcher.resume_after):
            # a list and the watch from its version end where the store ends
            assert watcher.state == final, f"list at {start} + watch != final state {why}"
    assert sum(w.resumes for w in watchers) >= 1


def test_a_write_that_would_log_below_a_later_change_runs_again(db) -> None:
    """PostgreSQL: a transaction that took its versions early, and changes an object after a
    transaction that began later has changed it and committed, is refused (40001) by the
    database; `Database.write` runs it again in a new transaction, whose versions are above."""
    import pytest
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.orm import Session

    from app.db.engine import is_retryable, next_resource_version
    from tests.conftest import unique
    from tests.db.test_registry_store import STORE

    if db.is_sqlite:
        pytest.skip("one writer at a time: versions are taken in commit order")
    name = unique("order-")

    def set_to(n: int) -> Any:
        return lambda s: STORE.patch(
            s, namespace="", name=name, change=lambda o: {**o, "spec": {"n": n}}
        )

    db.write(lambda s: STORE.create(s, namespace=None, obj={"metadata": {"name": name}}))
    early = Session(bind=db.engine)
    try:
        next_resource_version(early)  # its transaction id is taken, below the next one's
        later = db.write(set_to(1))
        with pytest.raises(DBAPIError) as refused:
            set_to(2)(early)
            early.flush()
        assert is_retryable(refused.value)
    finally:
        early.rollback()
        early.close()

    runs: list[int] = []

    def late_write(session: Any) -> Any:
        runs.append(1)
        next_resource_version(session)
        if len(runs) == 1:  # meanwhile another transaction, begun later, changes it
            db.write(set_to(3))
        return set_to(4)(session)

    final = db.write(late_write)
    assert len(runs) == 2
    assert int(final["metadata"]["resourceVersion"]) > int(later["metadata"]["resourceVersion"])
    assert db.read(lambda s: STORE.get(s, namespace="", name=name))["spec"] == {"n": 4}
