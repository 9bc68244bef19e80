"""The controllers' pod creates, packed across callers into PodBatches (client.py
`PodCreates`): through the real API (both databases), many objects' slow-start steps at once
go in few requests, each caller gets its own pods' results, a refused pod refuses no other, and
no more pods than the bound are ever in flight. The client's events wait behind its pod creates,
a bounded time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from app.controllers import client as client_module
from app.controllers.client import ApiError, Client, PodCreates
from tests.conftest import Api, ThreadedServer
from tests.controllers.test_manager import controller_token


def _pod(name: str, cpu: str = "500m") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"owner": name.rsplit("-", 1)[0]}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


def test_many_objects_steps_go_in_few_batches_each_caller_its_own_results(
    server: ThreadedServer, tenant: Api
) -> None:
    ns = tenant.tenant
    steps = {f"o{i}": 1 + i % 3 for i in range(40)}  # 40 objects' steps of 1, 2 or 3 pods

    async def scenario() -> tuple[dict[str, list[Any]], int]:
        client = Client(server.url, controller_token(server))
        try:

            async def step(owner: str, size: int) -> tuple[str, list[Any]]:
                bodies = [_pod(f"{owner}-{k}") for k in range(size)]
                if owner == "o7":  # a template the API refuses: its pods alone
                    bodies[0]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
                return owner, await client.create_pods(ns, bodies)

            answered = await asyncio.gather(*(step(o, n) for o, n in steps.items()))
            return dict(answered), client._pods.requests
        finally:
            await client.close()

    results, requests = asyncio.run(scenario())
    # a request each before: 40; packed, a handful (64 pods fit in one, 80 are asked)
    assert requests < 10, requests
    for owner, size in steps.items():
        got = results[owner]
        assert len(got) == size
        for k, item in enumerate(got):
            if owner == "o7" and k == 0:
                assert isinstance(item, ApiError) and item.status == 422, item
            else:
                assert not isinstance(item, ApiError), item
                assert item["metadata"]["name"] == f"{owner}-{k}"
    listed = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    assert sorted(p["metadata"]["name"] for p in listed) == sorted(
        f"{o}-{k}" for o, n in steps.items() for k in range(n) if (o, k) != ("o7", 0)
    )


def test_the_smallest_steps_go_first_and_the_bound_holds() -> None:
    """The packing alone, against a stand-in for the API that records what it is sent."""
    sent: list[list[bytes]] = []
    most_at_once = 0

    async def scenario() -> None:
        nonlocal most_at_once
        in_flight = 0
        release = asyncio.Event()

        async def send(namespace: str, bodies: list[bytes]) -> list[Any]:
            nonlocal in_flight, most_at_once
            sent.append(bodies)
            in_flight += len(bodies)
            most_at_once = max(most_at_once, in_flight)
            await release.wait()
            in_flight -= len(bodies)
            return [{"n": b.decode()} for b in bodies]

        creates = PodCreates(send, most=8)

        async def settle() -> None:  # every task ready to run has run
            for _ in range(10):
                await asyncio.sleep(0)

        first = asyncio.create_task(creates.create("ns", [{"big": i} for i in range(6)]))
        await settle()
        later = [
            asyncio.create_task(creates.create("ns", [{"step": s, "i": i} for i in range(s)]))
            for s in (4, 1, 2, 1)
        ]
        await settle()
        # 6 in flight, room for 2: the two one-pod steps pass the larger ones waiting
        assert [len(b) for b in sent] == [6, 2]
        assert all(b'"step":1' in body for body in sent[1])
        release.set()
        results = await asyncio.gather(first, *later)
        assert [len(r) for r in results] == [6, 4, 1, 2, 1]
        assert all('"step":4' in item["n"] for item in results[1])
        assert most_at_once <= 8  # the bound, however the steps were packed
        # a step larger than the bound goes alone once nothing is in flight
        alone = await creates.create("ns", [{"huge": i} for i in range(20)])
        assert len(alone) == 20 and len(sent[-1]) == 20

    asyncio.run(scenario())
    assert max(len(b) for b in sent[:-1]) <= 8


def test_a_caller_cancelled_while_waiting_sends_nothing() -> None:
    sent: list[list[bytes]] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def send(namespace: str, bodies: list[bytes]) -> list[Any]:
            sent.append(bodies)
            await gate.wait()
            return [{} for _ in bodies]

        creates = PodCreates(send, most=1)
        busy = asyncio.create_task(creates.create("ns", [{"a": 1}]))
        for _ in range(5):
            await asyncio.sleep(0)
        waiting = asyncio.create_task(creates.create("ns", [{"b": 1}]))
        for _ in range(5):
            await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0)
        gate.set()
        assert len(await busy) == 1
        await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert sent == [[b'{"a":1}']]


def test_events_wait_behind_the_pod_creates_a_bounded_time(monkeypatch: Any) -> None:
    """An event (`Client.record_event`) is sent once no pod create waits or is in flight, or after
    EVENTS_BEHIND_PODS_SECONDS if the pods keep the client busy that long."""
    monkeypatch.setattr(client_module, "EVENTS_BEHIND_PODS_SECONDS", 1.0)
    told: list[tuple[str, float]] = []  # (message, seconds after it was recorded)

    async def scenario() -> None:
        client = Client("http://127.0.0.1:9", "token")
        gate = asyncio.Event()

        async def send(namespace: str, bodies: list[bytes]) -> list[Any]:
            await gate.wait()
            return [{} for _ in bodies]

        async def create(resource: Any, namespace: Any, body: Any, *, event: bool = False) -> Any:
            told.append((body["message"], time.monotonic() - at))
            return body

        client._pods = PodCreates(send, most=64)
        monkeypatch.setattr(client, "create", create)
        obj = {"metadata": {"name": "rs", "namespace": "ns", "uid": "u"}}

        async def record(message: str) -> None:
            await client.record_event(
                obj,
                kind="ReplicaSet",
                api_version="apps/v1",
                event_type="Normal",
                reason="SuccessfulCreate",
                message=message,
                component="replicaset-controller",
            )

        # nothing waits: at once
        at = time.monotonic()
        await record("idle")
        assert told == [("idle", told[0][1])] and told[0][1] < 0.5
        # a pod create in flight: the event waits for it
        pods = asyncio.create_task(client._pods.create("ns", [{"a": 1}]))
        at = time.monotonic()
        event = asyncio.create_task(record("behind"))
        await asyncio.sleep(0.1)
        assert len(told) == 1  # not sent yet
        gate.set()
        await pods
        await event
        assert told[1][0] == "behind" and 0.1 <= told[1][1] < 0.9  # not the bound
        # pods that keep the client busy hold it no longer than the bound
        gate.clear()
        pods = asyncio.create_task(client._pods.create("ns", [{"b": 1}]))
        await asyncio.sleep(0)  # handed in
        at = time.monotonic()
        await record("at most")
        assert told[2][0] == "at most" and 1.0 <= told[2][1] < 3.0
        assert not pods.done()
        gate.set()
        await pods
        await client.close()

    asyncio.run(scenario())
