"""A ReplicaSet's or Job's pods made in one slow-start step are told in one `SuccessfulCreate`
event naming them (`Created pods: a, b`; `Created pod: a` for a step of one, as Kubernetes), and
the pods deleted together in one `SuccessfulDelete`: through a real manager and the API (both
databases). The message is bounded at 1 KiB, the names past the bound counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.controllers.apps import ReplicaSetController
from app.controllers.base import MESSAGE_BYTES, Controller, names_message
from app.controllers.job import JobController
from tests.conftest import Api, ThreadedServer
from tests.controllers.test_gc_and_endpoints import eventually, manager_running
from tests.controllers.test_slow_start import PODS_EACH, job, replica_set
from tests.events import assert_each_named_once, named


def events_of(api: Api, ns: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    listed = api.get(
        f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": f"involvedObject.name={name}"}
    ).json()["items"]
    return [e for e in listed if e["involvedObject"].get("uid") == uid]


def test_one_name_is_told_as_kubernetes_tells_it_and_several_in_one_message() -> None:
    assert names_message("Created", "pod", ["web-x1"]) == "Created pod: web-x1"
    assert names_message("Created", "pod", ["a-x1", "a-x2", "a-x3"]) == (
        "Created pods: a-x1, a-x2, a-x3"
    )
    assert names_message("Deleted", "pod", ["a-x1", "a-x2"]) == "Deleted pods: a-x1, a-x2"
    assert names_message("Created", "job", ["g-w-0", "g-w-1"]) == "Created jobs: g-w-0, g-w-1"


def test_a_message_past_1_kib_lists_what_fits_and_counts_the_rest() -> None:
    names = [f"a-long-deployment-name-7d4b9c8f6-{i:05d}" for i in range(100)]
    message = names_message("Deleted", "pod", names)
    assert len(message.encode()) <= MESSAGE_BYTES == 1024
    listed, _, rest = message.removeprefix("Deleted pods: ").rpartition(" and ")
    shown = listed.split(", ")
    assert shown == names[: len(shown)] and len(shown) > 10
    assert rest == f"{len(names) - len(shown)} more"
    for count in range(1, 120):  # never over the bound, whatever the count
        many = [f"{'n' * 40}-{i}" for i in range(count)]
        assert len(names_message("Created", "pod", many).encode()) <= MESSAGE_BYTES


def step_controllers() -> Sequence[Controller]:
    return [ReplicaSetController(), JobController()]


def test_each_step_is_one_event_naming_its_pods(server: ThreadedServer, tenant: Api) -> None:
    ns = tenant.tenant
    rs = tenant.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", json=replica_set("steps"))
    assert rs.status_code == 201, rs.text
    jb = tenant.post(f"/apis/batch/v1/namespaces/{ns}/jobs", json=job("jsteps", indexed=False))
    assert jb.status_code == 201, jb.text

    def pods_of(owner: dict[str, Any]) -> list[str]:
        items = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
        return [
            p["metadata"]["name"]
            for p in items
            if p["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        ]

    def told(owner: dict[str, Any], reason: str, count: int) -> list[list[str]] | None:
        found = named(events_of(tenant, ns, owner), reason)
        return found if sum(map(len, found)) >= count else None

    with manager_running(server, step_controllers):
        for owner in (rs.json(), jb.json()):
            made = eventually(lambda owner=owner: len(p := pods_of(owner)) == PODS_EACH and p)
            created = eventually(lambda owner=owner: told(owner, "SuccessfulCreate", PODS_EACH))
            # 7 pods in the steps 1, 2 and 4: three events, each pod in one of them
            assert sorted(map(len, created)) == [1, 2, 4]
            assert_each_named_once(created, made)
            messages = [
                e["message"]
                for e in events_of(tenant, ns, owner)
                if e["reason"] == "SuccessfulCreate"
            ]
            assert sorted(m.partition(":")[0] for m in messages) == [
                "Created pod",  # a step of one, as Kubernetes says it
                "Created pods",
                "Created pods",
            ]
        # deletes made together: a scale down (ReplicaSet), a suspend (Job)
        scaled = tenant.patch(
            f"/apis/apps/v1/namespaces/{ns}/replicasets/steps",
            json={"spec": {"replicas": 2}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert scaled.status_code == 200, scaled.text
        suspended = tenant.patch(
            f"/apis/batch/v1/namespaces/{ns}/jobs/jsteps",
            json={"spec": {"suspend": True}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert suspended.status_code == 200, suspended.text
        for owner, gone in ((rs.json(), PODS_EACH - 2), (jb.json(), PODS_EACH)):
            deleted = eventually(lambda o=owner, g=gone: told(o, "SuccessfulDelete", g))
            assert [len(one) for one in deleted] == [gone]  # one event for them all
            made = {
                n for one in named(events_of(tenant, ns, owner), "SuccessfulCreate") for n in one
            }
            assert set(deleted[0]) <= made
