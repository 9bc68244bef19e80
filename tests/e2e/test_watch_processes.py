"""Several processes on one database: a watch served by one API process sees a change made
through another, or by the scheduler, woken through Redis (the database stays the source of
truth)."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.conftest import REDIS_URL, unavailable, unique
from tests.e2e.conftest import TESSERA, Process, start_server, stop_server
from tests.factories import gpu_node, pod

# Both processes look at the change log only once a minute on their own: within the test's
# deadline only a Redis notification can deliver the change.
SLOW_POLL = "60"


@pytest.fixture(scope="session")
def two_processes(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Process, Process]]:
    """Two API processes on one database, told of each other's writes through Redis alone;
    the tests share them (each in a tenant of its own)."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        unavailable("Redis", str(exc))
    env = {"TESSERA_REDIS_URL": REDIS_URL, "TESSERA_WATCH_POLL_SECONDS": SLOW_POLL}
    data_dir = tmp_path_factory.mktemp("two-processes")
    first = start_server(data_dir, database_url, **env)
    second = start_server(data_dir, database_url, **env)
    yield first, second
    stop_server(first)
    stop_server(second)


def test_a_watch_on_one_process_sees_a_write_through_another(two_processes) -> None:
    writer_process, watcher_process = two_processes
    tenant = unique("xp")
    writer_process.create_tenant(tenant)
    token = writer_process.tenant_token(tenant)
    verify = ssl.create_default_context(cafile=str(writer_process.ca))
    headers = {"Authorization": f"Bearer {token}"}
    url = f"/api/v1/namespaces/{tenant}/pods"
    watcher = httpx.Client(base_url=watcher_process.url, verify=verify, headers=headers, timeout=30)
    writer = httpx.Client(base_url=writer_process.url, verify=verify, headers=headers, timeout=30)
    start = watcher.get(url).json()["metadata"]["resourceVersion"]
    received: list[tuple[str, str, float]] = []
    connected = threading.Event()

    def watch() -> None:
        with watcher.stream(
            "GET", url, params={"watch": "true", "resourceVersion": start, "timeoutSeconds": 20}
        ) as response:
            connected.set()
            for line in response.iter_lines():
                event = json.loads(line)
                received.append(
                    (event["type"], event["object"]["metadata"]["name"], time.monotonic())
                )
                return

    thread = threading.Thread(target=watch)
    thread.start()
    assert connected.wait(10)
    time.sleep(0.3)  # the watch has read the log once and now waits for a notification
    sent = time.monotonic()
    assert writer.post(url, json=pod("cross")).status_code == 201
    thread.join(timeout=15)
    assert received and received[0][:2] == ("ADDED", "cross")
    delay = received[0][2] - sent
    assert delay < 10, (
        f"the watcher saw the change after {delay:.1f}s: it was not woken through Redis"
    )


def test_the_scheduler_and_the_watches_are_woken_across_processes(two_processes, tmp_path) -> None:
    """The scheduler is a process of its own. A pod created through one API process wakes it
    through Redis (it looks only once a minute on its own here), and its bind wakes a watch
    served by the other API process (which also looks once a minute): the bind is seen when it
    happens, not at the next poll."""
    api, watcher_process = two_processes
    tenant, scheduler_name = unique("xs"), unique("xs-sched-")
    api.create_tenant(tenant)
    with api.admin() as http:
        node = gpu_node(unique("xsn-"), gpus=2, zone=unique("xsz"))
        node["metadata"]["labels"]["tessera.io/test-pool"] = scheduler_name
        assert http.post("/api/v1/nodes", json=node).status_code == 201
    verify = ssl.create_default_context(cafile=str(api.ca))
    headers = {"Authorization": f"Bearer {api.tenant_token(tenant)}"}
    url = f"/api/v1/namespaces/{tenant}/pods"
    writer = httpx.Client(base_url=api.url, verify=verify, headers=headers, timeout=30)
    watcher = httpx.Client(base_url=watcher_process.url, verify=verify, headers=headers, timeout=30)

    def in_pool(name: str) -> dict:
        body = pod(name, gpus=1)
        body["spec"]["schedulerName"] = scheduler_name
        body["spec"]["nodeSelector"] = {"tessera.io/test-pool": scheduler_name}
        return body

    log_path = tmp_path / "scheduler.log"
    with log_path.open("w") as log:
        scheduler = subprocess.Popen(
            [TESSERA, "scheduler", "--scheduler-name", scheduler_name, "--interval", SLOW_POLL],
            # no lease to renew every second (each renewal is a commit that wakes it too)
            env={**api.env, "TESSERA_SCHEDULER_LEADER_ELECT": "false"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    bound: list[str] = []
    try:
        # A first pod, bound whenever the scheduler's first cycle runs: from then on it waits.
        assert writer.post(url, json=in_pool("first")).status_code == 201
        deadline = time.monotonic() + 60
        while not writer.get(f"{url}/first").json()["spec"].get("nodeName"):
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.1)
        time.sleep(1)  # the cycle its own bind woke has run: it waits on Redis (or a minute)
        start = watcher.get(url).json()["metadata"]["resourceVersion"]
        connected = threading.Event()

        def watch() -> None:
            params = {"watch": "true", "resourceVersion": start, "timeoutSeconds": 20}
            with watcher.stream("GET", url, params=params) as response:
                connected.set()
                for line in response.iter_lines():
                    event = json.loads(line)
                    if event["object"]["spec"].get("nodeName"):
                        bound.append(event["object"]["spec"]["nodeName"])
                        return

        thread = threading.Thread(target=watch)
        thread.start()
        assert connected.wait(10)
        time.sleep(0.3)  # the watch has read the log once and now waits for a notification
        assert writer.post(url, json=in_pool("second")).status_code == 201
        thread.join(timeout=15)
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=15)
    assert bound == [node["metadata"]["name"]], log_path.read_text()[-2000:]
