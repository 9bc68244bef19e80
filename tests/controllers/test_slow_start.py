"""Many ReplicaSets and Jobs at once, through a real manager and the real API (both databases):
their pods are made breadth-first, each object's slow-start step after every other object's
step before it (app/controllers/base.py SlowStart, queue.py add_behind), and none is lost or
made twice. The work queue's two lines, on their own."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from app.controllers.apps import ReplicaSetController
from app.controllers.base import Controller
from app.controllers.job import JobController
from app.controllers.queue import WorkQueue
from tests.conftest import Api, ThreadedServer
from tests.controllers.test_gc_and_endpoints import eventually, manager_running

OBJECTS = 5  # of each kind
PODS_EACH = 7  # slow start: 1, 2 and 4 pods
INDEX = "batch.kubernetes.io/job-completion-index"


class OneReplicaSetWorker(ReplicaSetController):
    """One worker: the order of its creates is the order it takes the keys in."""

    workers: ClassVar[int] = 1


class OneJobWorker(JobController):
    workers: ClassVar[int] = 1


def one_worker_each() -> Sequence[Controller]:
    return [OneReplicaSetWorker(), OneJobWorker()]


def _template(name: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
    }


def replica_set(name: str) -> dict[str, Any]:
    template = _template(name)
    template["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": PODS_EACH,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


def job(name: str, *, indexed: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": PODS_EACH,
        "completions": PODS_EACH,
        "template": _template(name),
    }
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _step(made_before: int) -> int:
    """The slow-start step (0: one pod, 1: two, 2: four, ...) of an object's pod made after
    `made_before` of its others."""
    return (made_before + 1).bit_length() - 1


def test_a_burst_of_objects_gets_its_pods_breadth_first(
    server: ThreadedServer, tenant: Api
) -> None:
    ns = tenant.tenant
    pods_url = f"/api/v1/namespaces/{ns}/pods"
    since = tenant.get(pods_url).json()["metadata"]["resourceVersion"]
    # all the objects there before the manager starts: its first list queues them all at once
    for i in range(OBJECTS):
        made = tenant.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", json=replica_set(f"r{i}"))
        assert made.status_code == 201, made.text
        made = tenant.post(f"/apis/batch/v1/namespaces/{ns}/jobs", json=job(f"j{i}", indexed=i < 2))
        assert made.status_code == 201, made.text
    expected = 2 * OBJECTS * PODS_EACH
    with manager_running(server, one_worker_each):
        eventually(lambda: len(tenant.get(pods_url).json()["items"]) >= expected, timeout=60)
        with tenant.stream(
            "GET",
            pods_url,
            params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"},
        ) as watch:
            events = [json.loads(line) for line in watch.iter_lines() if line.strip()]
    created = [e["object"] for e in events if e["type"] == "ADDED"]
    assert len(created) == expected  # none made twice
    owners = Counter(p["metadata"]["ownerReferences"][0]["name"] for p in created)
    assert owners == {f"{k}{i}": PODS_EACH for k in "rj" for i in range(OBJECTS)}
    for i in range(2):  # an Indexed Job's pods: each index once
        indexes = [
            p["metadata"]["annotations"][INDEX]
            for p in created
            if p["metadata"]["ownerReferences"][0]["name"] == f"j{i}"
        ]
        assert sorted(indexes, key=int) == [str(x) for x in range(PODS_EACH)]
    # in the order the API made them, the pods of each kind go step by step: every object's
    # first pod before any object's second step, every second step before any third
    for kind in ("ReplicaSet", "Job"):
        seen: Counter[str] = Counter()
        steps = []
        for pod in created:
            owner = pod["metadata"]["ownerReferences"][0]
            if owner["kind"] == kind:
                steps.append(_step(seen[owner["name"]]))
                seen[owner["name"]] += 1
        assert steps == sorted(steps), f"{kind} pods by step, in the order made: {steps}"
        assert steps == [0] * OBJECTS + [1] * 2 * OBJECTS + [2] * 4 * OBJECTS


def test_keys_with_more_to_do_wait_behind_changed_keys() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        for key in ("ns/a", "ns/b"):
            queue.add(key)
        first = await queue.get()
        assert first == "ns/a"
        queue.add("ns/a")  # its own write's event, while processed
        queue.add_behind("ns/a")  # one step made, more to make
        queue.done("ns/a")
        queue.add("ns/c")  # created after: still before a's next step
        assert [await queue.get() for _ in range(2)] == ["ns/b", "ns/c"]
        queue.add_behind("ns/b")
        queue.done("ns/b")
        queue.add("ns/d")
        queue.add("ns/a")  # a change to a key waiting behind: it stays where it is, once
        assert len(queue) == 3
        assert [await queue.get() for _ in range(3)] == ["ns/d", "ns/a", "ns/b"]
        for key in ("ns/c", "ns/d", "ns/a", "ns/b"):
            queue.done(key)
        assert len(queue) == 0

    asyncio.run(scenario())
