"""The garbage collector and the endpoint controller, run by a real manager against the test
server over HTTP (both databases): a Service gets its EndpointSlice, owned by it; deleting the
Service with each propagation policy does to the slice what Kubernetes does."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from app.controllers import controllers
from app.controllers.base import Controller
from app.controllers.client import Client
from app.controllers.endpoints import desired_slice
from app.controllers.manager import Election, Manager
from tests.conftest import Api, ThreadedServer, unique
from tests.controllers.test_manager import controller_token

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
SERVICES = "/api/v1/namespaces/{ns}/services"


def service(name: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "selector": selector or {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": "web"}],
        },
    }


def pod(name: str, labels: dict[str, str], ip: str | None, *, ready: bool = True) -> dict:
    status: dict[str, Any] = {"phase": "Running"}
    if ip:
        status["podIP"] = ip
    status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels},
        "spec": {
            "hostname": name,
            "subdomain": "svc",
            "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}],
        },
        "status": status,
    }


def test_the_desired_slice_lists_selected_pods_with_addresses() -> None:
    svc = service("svc", {"app": "a"})
    svc["metadata"].update(namespace="ns", uid="u1")
    slice_ = desired_slice(
        svc,
        [
            pod("a-0", {"app": "a"}, "10.0.0.2"),
            pod("a-1", {"app": "a"}, "10.0.0.3", ready=False),
            pod("a-2", {"app": "a"}, None),  # no address yet: not listed
            pod("b-0", {"app": "b"}, "10.0.0.4"),
        ],
    )
    assert slice_ is not None
    assert [e["addresses"] for e in slice_["endpoints"]] == [["10.0.0.2"], ["10.0.0.3"]]
    assert [e["conditions"]["ready"] for e in slice_["endpoints"]] == [True, False]
    assert slice_["endpoints"][0]["hostname"] == "a-0"  # its subdomain is the Service
    assert slice_["ports"] == [{"port": 8080, "protocol": "TCP", "name": "http"}]
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert desired_slice({**svc, "spec": {"ports": []}}, []) is None  # no selector: not ours


def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        time.sleep(0.1)


@contextlib.contextmanager
def manager_running(
    server: ThreadedServer, made: Callable[[], Sequence[Controller]] = controllers
) -> Iterator[None]:
    """Every controller of `tessera controllers` (or those `made` makes), on a loop of its own
    thread, until the block ends (then stopped as SIGTERM stops it: cancelled)."""
    token = controller_token(server)
    election = Election(lease_seconds=3, renew_deadline=2.0, retry=0.3, name=unique("gc-"))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    tasks: list[asyncio.Task[None]] = []

    async def main() -> None:
        client = Client(server.url, token)
        try:
            await Manager(client, made(), election=election, resync_seconds=5).run()
        finally:
            await client.close()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tasks.append(loop.create_task(main()))
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(tasks[0])
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(tasks[0].cancel)
        thread.join(timeout=20)
        # one left running would go on acting on the session's server in later tests
        assert not thread.is_alive(), "the controller manager did not stop when cancelled"


def test_a_services_slice_follows_its_deletion_policy(server: ThreadedServer, tenant: Api) -> None:
    ns = tenant.tenant
    slices = SLICES.format(ns=ns)
    services = SERVICES.format(ns=ns)

    def slice_of(name: str) -> dict | None:
        answer = tenant.get(f"{slices}/{name}")
        return answer.json() if answer.status_code == 200 else None

    with manager_running(server):
        for name, policy in (("bg", "Background"), ("fg", "Foreground"), ("or", "Orphan")):
            made = tenant.post(services, json=service(name))
            assert made.status_code == 201, made.text
            uid = made.json()["metadata"]["uid"]
            got = eventually(lambda name=name: slice_of(name))
            assert got["metadata"]["labels"]["kubernetes.io/service-name"] == name
            assert got["metadata"]["ownerReferences"][0]["uid"] == uid
            gone = tenant.delete(f"{services}/{name}", params={"propagationPolicy": policy})
            assert gone.status_code == 200, gone.text
            if policy != "Background":  # marked, waiting for the collector
                assert gone.json()["metadata"]["deletionTimestamp"]
            eventually(lambda name=name: tenant.get(f"{services}/{name}").status_code == 404)
            if policy == "Orphan":
                kept = eventually(
                    lambda name=name: (
                        (s := slice_of(name)) and not s["metadata"].get("ownerReferences") and s
                    )
                )
                assert kept["metadata"]["name"] == name  # it stays, on its own
            else:
                eventually(lambda name=name: slice_of(name) is None)
    # tenants read slices; only the controller writes them
    refused = tenant.post(slices, json={"metadata": {"name": "x"}, "addressType": "IPv4"})
    assert refused.status_code == 403
