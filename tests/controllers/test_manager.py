"""The controller manager's parts: its work queue, its leader election through the real API
(two managers, one leader at a time; a stopped leader hands over at once), and what the
controller role may do."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.auth import service as auth
from app.controllers.base import Controller
from app.controllers.client import LEASES, PODS, Client, Resource
from app.controllers.manager import Election, Manager
from app.controllers.queue import WorkQueue
from tests.conftest import Api, ThreadedServer, unique

# --- the work queue ---------------------------------------------------------------------------


def test_queue_keeps_a_key_once_and_never_hands_it_to_two_workers() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        for _ in range(3):
            queue.add("ns/a")
        queue.add("ns/b")
        assert len(queue) == 2
        first = await queue.get()
        assert first == "ns/a"
        queue.add("ns/a")  # added while processed: not handed out again before done
        assert await queue.get() == "ns/b"
        assert not queue._changed  # "ns/a" waits for its worker to finish
        queue.done("ns/b")
        queue.done("ns/a")
        assert await queue.get() == "ns/a"

    asyncio.run(scenario())


def test_queue_takes_namespaces_in_turn() -> None:
    """A namespace with many keys waiting does not hold up another's: the keys of each come
    in order, the namespaces in turn."""

    async def scenario() -> None:
        queue = WorkQueue()
        for i in range(5):
            queue.add(f"big/o-{i}")
        queue.add("small/x")
        queue.add("small/y")
        queue.add("other/z")
        taken = [await queue.get() for _ in range(8)]
        assert taken == [
            "big/o-0",
            "small/x",
            "other/z",
            "big/o-1",
            "small/y",
            "big/o-2",
            "big/o-3",
            "big/o-4",
        ]
        for key in taken:
            queue.done(key)
        queue.add("small/again")  # a namespace back after its line emptied waits its turn
        queue.add("big/o-5")
        assert [await queue.get() for _ in range(2)] == ["small/again", "big/o-5"]

    asyncio.run(scenario())


def test_queue_delays_and_backs_off_per_key() -> None:
    async def scenario() -> None:
        queue = WorkQueue(base_delay=0.01, max_delay=0.04)
        delays = [queue.add_rate_limited("k") for _ in range(4)]
        assert delays == [0.01, 0.02, 0.04, 0.04]
        queue.forget("k")
        assert queue.add_rate_limited("k") == 0.01
        assert await asyncio.wait_for(queue.get(), 5) == "k"  # the delayed add came due
        queue.add_after("later", 0.05)
        assert len(queue) == 0
        assert await asyncio.wait_for(queue.get(), 5) == "later"

    asyncio.run(scenario())


def test_a_key_wakes_one_waiting_worker_not_all() -> None:
    """What an add costs the event loop does not grow with the workers waiting: each key
    wakes one of them (all woke before, and a controller has a hundred), whether it is added
    at once or comes due after a delay; every key is still taken, and close wakes them all."""

    def steps_per_key(workers: int) -> float:
        async def scenario() -> float:
            loop = asyncio.get_running_loop()
            queue = WorkQueue()
            taken: list[str] = []

            async def work() -> None:
                while (key := await queue.get()) is not None:
                    taken.append(key)
                    queue.done(key)

            tasks = [asyncio.create_task(work()) for _ in range(workers)]
            for _ in range(3):
                await asyncio.sleep(0)
            scheduled = 0
            call_soon = loop.call_soon

            def counting(*args: object, **kwargs: object) -> asyncio.Handle:
                nonlocal scheduled
                scheduled += 1
                return call_soon(*args, **kwargs)  # type: ignore[arg-type]

            loop.call_soon = counting  # type: ignore[method-assign]
            try:
                for i in range(20):
                    queue.add(f"ns/now-{i}")
                    await asyncio.sleep(0.001)
                for i in range(20):
                    queue.add_after(f"ns/later-{i}", 0.005)
                    await asyncio.sleep(0.01)
            finally:
                loop.call_soon = call_soon  # type: ignore[method-assign]
            assert sorted(taken) == sorted(
                [f"ns/now-{i}" for i in range(20)] + [f"ns/later-{i}" for i in range(20)]
            )
            queue.close()
            await asyncio.wait_for(asyncio.gather(*tasks), 5)  # every worker told to stop
            return scheduled / 40

        return asyncio.run(scenario())

    few, many = steps_per_key(4), steps_per_key(128)
    assert many < few + 3, (few, many)


def test_queue_is_bounded() -> None:
    queue = WorkQueue(limit=2)
    for key in ("a", "b", "c", "a"):
        queue.add(key)
    assert len(queue) == 2 and queue.dropped == 1


# --- leader election through the API ---------------------------------------------------------


class Recorder(Controller):
    """A controller that notes which manager reconciled what (each key again every 50 ms, so a
    leader reconciles all the time)."""

    name = "recorder"
    resources: tuple[Resource, ...] = (PODS,)
    workers = 1

    def __init__(self, who: str, log: list[tuple[str, float]]) -> None:
        super().__init__()
        self.who = who
        self.log = log

    async def reconcile(self, key: str) -> float | None:
        self.log.append((self.who, time.monotonic()))
        return 0.05


def controller_token(server: ThreadedServer) -> str:
    return server.services.db.write(lambda s: auth.create_token(s, role="controller")).value


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


def test_two_managers_never_lead_at_once(server: ThreadedServer, tenant: Api) -> None:
    token = controller_token(server)
    made = tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=POD)
    assert made.status_code == 201, made.text
    name = unique("lead-")
    election = Election(lease_seconds=3, renew_deadline=2.0, retry=0.3, name=name)

    async def scenario() -> None:
        log: list[tuple[str, float]] = []
        clients = [Client(server.url, token) for _ in range(2)]
        managers = [
            Manager(c, [Recorder(who, log)], identity=who, election=election)
            for c, who in zip(clients, ("one", "two"), strict=True)
        ]
        tasks = [asyncio.create_task(m.run()) for m in managers]
        overlaps = 0

        async def watch_leading(until: float) -> None:
            nonlocal overlaps
            while time.monotonic() < until:
                if all(m.leading.is_set() for m in managers):
                    overlaps += 1
                await asyncio.sleep(0.01)

        await asyncio.wait_for(
            asyncio.wait(
                [asyncio.create_task(m.leading.wait()) for m in managers],
                return_when=asyncio.FIRST_COMPLETED,
            ),
            20,
        )
        await watch_leading(time.monotonic() + 3)
        leader = next(m for m in managers if m.leading.is_set())
        other = next(m for m in managers if m is not leader)
        acted = {who for who, _ in log}
        assert acted == {leader.identity}, acted
        lease = await clients[0].get(LEASES, "kube-system", name)
        assert lease["spec"]["holderIdentity"] == leader.identity

        # the leader stops (SIGTERM): it gives the lease up and the other takes over at once,
        # without waiting for the lease to expire
        tasks[managers.index(leader)].cancel()
        await asyncio.gather(tasks[managers.index(leader)], return_exceptions=True)
        lease = await clients[0].get(LEASES, "kube-system", name)
        assert lease["spec"]["holderIdentity"] in ("", other.identity)
        await asyncio.wait_for(other.leading.wait(), 20)
        log.clear()
        await watch_leading(time.monotonic() + 1)
        assert {who for who, _ in log} == {other.identity}
        lease = await clients[0].get(LEASES, "kube-system", name)
        assert lease["spec"]["holderIdentity"] == other.identity
        assert lease["spec"]["leaseTransitions"] >= 1
        assert overlaps == 0
        tasks[managers.index(other)].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()

    asyncio.run(scenario())


def test_a_manager_told_to_stop_as_a_renewal_answers_stops() -> None:
    """The stop (a cancellation) and the lease's renewal land in one turn of the event loop:
    the manager stops all the same, instead of renewing on and running its controllers after
    its process thought it stopped (on Python 3.11 `asyncio.wait_for` drops such a cancel)."""

    async def scenario() -> None:
        client = Client("http://127.0.0.1:9", "unused")
        manager = Manager(
            client, [], election=Election(lease_seconds=3, renew_deadline=2, retry=0.01)
        )
        asked: asyncio.Queue[asyncio.Future[bool]] = asyncio.Queue()

        def renew() -> asyncio.Future[bool]:
            answer = asyncio.get_running_loop().create_future()
            asked.put_nowait(answer)
            return answer

        manager.elector.try_acquire_or_renew = renew  # type: ignore[method-assign]
        renewing = asyncio.create_task(manager._renew())
        try:
            answer = await asyncio.wait_for(asked.get(), 5)
            answer.set_result(True)  # the renewal answers ...
            renewing.cancel()  # ... as the stop comes
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(renewing, 5)
            assert asked.empty(), "the manager renewed its lease after it was stopped"
        finally:
            renewing.cancel()
            await client.close()

    asyncio.run(scenario())


def test_election_timing_must_leave_a_margin() -> None:
    with pytest.raises(ValueError):
        Election(lease_seconds=5, renew_deadline=5, retry=1)


# --- what the controller role may do ---------------------------------------------------------


def test_the_controller_role_has_least_privilege(server: ThreadedServer, tenant: Api) -> None:
    controller = Api(server.url, controller_token(server))
    ns = tenant.tenant
    pod = POD
    # pods and events in every tenant's namespace, listed across namespaces
    made = controller.post(f"/api/v1/namespaces/{ns}/pods", json=pod)
    assert made.status_code == 201, made.text
    assert controller.get("/api/v1/pods").status_code == 200
    assert controller.get(f"/api/v1/namespaces/{ns}/events").status_code == 200
    assert controller.delete(f"/api/v1/namespaces/{ns}/pods/p").status_code == 200
    # its lease in kube-system only
    assert controller.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases").is_success
    refused = controller.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert refused.status_code == 403
    # not a system namespace's pods, nor nodes, prices, tenants, tokens or tenants' ConfigMaps
    for verb, path in (
        ("post", "/api/v1/namespaces/kube-system/pods"),
        ("get", "/api/v1/nodes"),
        ("get", "/apis/billing.tessera.io/v1/prices"),
        ("get", "/apis/tessera.io/v1/tenants"),
        ("get", f"/api/v1/namespaces/{ns}/configmaps"),
        ("get", f"/api/v1/namespaces/{ns}/secrets"),
    ):
        answer = getattr(controller, verb)(path, **({"json": pod} if verb == "post" else {}))
        assert answer.status_code == 403, (path, answer.text)
    assert "system:tessera-controller-manager" in refused.json()["message"]
    # its token's role is known to the CLI's listing and the database
    assert PODS.path(ns, "p") == f"/api/v1/namespaces/{ns}/pods/p"


def test_the_controller_records_events_about_workloads(server: ThreadedServer, tenant: Api) -> None:
    """Events about the workload kinds, from the controller manager's token (as
    kube-controller-manager's recorder writes them); the same event again is counted on it."""
    controller = Api(server.url, controller_token(server))
    ns = tenant.tenant
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }
    made = tenant.post(f"/apis/batch/v1/namespaces/{ns}/jobs", json=job)
    assert made.status_code == 201, made.text

    def event(message: str, kind: str = "Job", name: str = "j") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}."},
            "involvedObject": {"apiVersion": "batch/v1", "kind": kind, "name": name},
            "reason": "SuccessfulCreate",
            "message": message,
            "type": "Normal",
            "source": {"component": "job-controller"},
        }

    url = f"/api/v1/namespaces/{ns}/events"
    first = controller.post(url, json=event("Created pod: j-abcde"))
    assert first.status_code == 201, first.text
    assert first.json()["involvedObject"]["uid"] == made.json()["metadata"]["uid"]
    assert first.json()["count"] == 1
    again = controller.post(url, json=event("Created pod: j-abcde"))
    assert again.json()["count"] == 2 and again.json()["series"]["count"] == 2
    assert again.json()["metadata"]["name"] == first.json()["metadata"]["name"]
    other = controller.post(url, json=event("Created pod: j-fghij"))
    assert other.json()["count"] == 1
    # not a workload kind, nor an object that is not there
    assert controller.post(url, json=event("x", kind="ConfigMap")).status_code == 422
    assert controller.post(url, json=event("x", name="gone")).status_code == 404
    # the tenant reads them, as kubectl describe asks for them, and writes none
    listed = tenant.get(
        url, params={"fieldSelector": "involvedObject.kind=Job,involvedObject.name=j"}
    ).json()["items"]
    assert sorted((e["message"], e["count"]) for e in listed) == [
        ("Created pod: j-abcde", 2),
        ("Created pod: j-fghij", 1),
    ]
    assert {e["source"]["component"] for e in listed} == {"job-controller"}
    assert tenant.post(url, json=event("forged")).status_code == 403
