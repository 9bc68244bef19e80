"""scheduler-plugins coscheduling PodGroups (scheduling.x-k8s.io/v1alpha1) over real HTTP,
placed by the real scheduling loop: manifests written for that scheduler run unchanged."""

from __future__ import annotations

import json
import time
from typing import Any

from app.db.engine import Database
from app.pods import service as pods
from scheduler.loop import DEFAULT_SCHEDULER, LoopConfig, SchedulingLoop, placed_by
from tests.conftest import Api, unique
from tests.factories import gpu_node, pod

BASE = "/apis/scheduling.x-k8s.io/v1alpha1"
LABEL = "scheduling.x-k8s.io/pod-group"
MERGE = {"Content-Type": "application/merge-patch+json"}
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}


def group(name: str, min_member: int, **spec: Any) -> dict[str, Any]:
    """A PodGroup as scheduler-plugins' examples write it."""
    annotations = spec.pop("annotations", None)
    document: dict[str, Any] = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, **spec},
    }
    if annotations:
        document["metadata"]["annotations"] = annotations
    return document


class Pool:
    """Nodes of a zone of their own, and a scheduler that sees only this test's pods."""

    def __init__(self, admin: Api, db: Database) -> None:
        self.admin, self.zone = admin, unique("cs-")
        self.loop = SchedulingLoop(db, LoopConfig(scheduler_name=self.zone))
        self.db = db
        self.clock = 0.0

    def node(self, gpus: int = 8, rack: str = "r1") -> str:
        name = unique("csn-")
        manifest = gpu_node(name, gpus=gpus, zone=self.zone, rack=f"{self.zone}-{rack}")
        assert self.admin.post("/api/v1/nodes", json=manifest).status_code == 201
        return name

    def member(self, api: Api, name: str, gang: str | None, gpus: int = 1) -> None:
        body = pod(name, cpu="4", memory="16Gi", gpus=gpus, labels={LABEL: gang} if gang else None)
        body["spec"]["schedulerName"] = self.zone
        body["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": self.zone}
        created = api.post(f"/api/v1/namespaces/{api.tenant}/pods", json=body)
        assert created.status_code == 201, created.text

    def cycle(self) -> int:
        """One scheduling cycle, past every backoff; how many pods it bound."""
        self.clock += 1000.0
        return self.loop.run_once(now=time.monotonic() + self.clock).bound


def nodes_of(api: Api, names: list[str]) -> list[str | None]:
    ns = api.tenant
    return [
        api.get(f"/api/v1/namespaces/{ns}/pods/{n}").json()["spec"].get("nodeName") for n in names
    ]


def test_an_upstream_gang_lives_its_whole_life(tenant: Api, admin: Api, db: Database) -> None:
    pool = Pool(admin, db)
    pool.node(gpus=8)
    pool.node(gpus=8)
    ns = tenant.tenant
    base = f"{BASE}/namespaces/{ns}/podgroups"
    created = tenant.post(
        base, json=group("train", 3, scheduleTimeoutSeconds=60, minResources={"cpu": "12"})
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert body["spec"] == {
        "minMember": 3,
        "scheduleTimeoutSeconds": 60,
        "minResources": {"cpu": "12"},
    }
    assert body["status"] == {
        "phase": "Pending",
        "scheduled": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
    }
    # Below minMember nothing is placed, however many cycles run.
    names = ["w0", "w1", "w2"]
    for name in names[:2]:
        pool.member(tenant, name, "train", gpus=4)
    assert pool.cycle() == 0 and pool.cycle() == 0
    assert nodes_of(tenant, names[:2]) == [None, None]
    waiting = tenant.get(f"/api/v1/namespaces/{ns}/pods/w0").json()["status"]["conditions"]
    assert "2 of its 3 pods exist" in waiting[0]["message"]
    pool.member(tenant, "w2", "train", gpus=4)
    assert tenant.get(f"{base}/train").json()["status"]["phase"] == "Scheduling"
    assert pool.cycle() == 3  # all together, in one cycle
    assert None not in nodes_of(tenant, names)
    status = tenant.get(f"{base}/train").json()["status"]
    assert (status["phase"], status["scheduled"], status["running"]) == ("Scheduled", 3, 0)
    uids = {
        n: tenant.get(f"/api/v1/namespaces/{ns}/pods/{n}").json()["metadata"]["uid"] for n in names
    }
    for uid in uids.values():
        db.write(lambda s, uid=uid: pods.start(s, uid=uid))
    status = tenant.get(f"{base}/train").json()["status"]
    assert (status["phase"], status["running"]) == ("Running", 3)
    table = tenant.get(base, headers=TABLE).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:6] == [
        "Name",
        "Phase",
        "MinMember",
        "Running",
        "Succeeded",
        "Failed",
    ]
    assert table["rows"][0]["cells"][:6] == ["train", "Running", 3, 3, 0, 0]
    # The tessera.io PodGroup endpoints do not see it: a separate kind.
    assert tenant.get(f"/apis/tessera.io/v1/namespaces/{ns}/podgroups/train").status_code == 404
    assert tenant.get(f"/apis/tessera.io/v1/namespaces/{ns}/podgroups").json()["items"] == []
    for uid in uids.values():
        db.write(lambda s, uid=uid: pods.finish(s, uid=uid, succeeded=True))
    status = tenant.get(f"{base}/train").json()["status"]
    assert (status["phase"], status["succeeded"], status["running"]) == ("Finished", 3, 0)
    for name in names:
        assert tenant.delete(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 200
    for name in names:  # the node reports each stopped
        db.write(lambda s, name=name: pods.finalize(s, uid=uids[name]))
        assert tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 404
    deleted = tenant.delete(f"{base}/train")
    assert deleted.status_code == 200, deleted.text
    assert tenant.get(f"{base}/train").status_code == 404


def _gang_too_big(
    tenant: Api, admin: Api, db: Database, name: str, members: list[str]
) -> tuple[Pool, str]:
    """A pool of one 8-GPU node and a coscheduling group `name` with a 1 s timeout whose
    members want 8 GPUs each: it cannot be placed until room appears. (The pool, and the
    tenant's podgroups URL.)"""
    pool = Pool(admin, db)
    pool.node(gpus=8)
    base = f"{BASE}/namespaces/{tenant.tenant}/podgroups"
    created = tenant.post(base, json=group(name, len(members), scheduleTimeoutSeconds=1))
    assert created.status_code == 201
    for member in members:
        pool.member(tenant, member, name, gpus=8)
    return pool, base


def test_a_gang_that_times_out_is_marked_and_placed_once_room_appears(
    tenant: Api, admin: Api, db: Database
) -> None:
    """scheduler-plugins' timeout rejects the gang's try and the pods go back to the queue: a
    Kubeflow job that timed out while the pool was busy runs once it has room, unchanged."""
    pool, base = _gang_too_big(tenant, admin, db, "big", ["b0", "b1"])
    ns = tenant.tenant
    assert pool.cycle() == 0  # 16 GPUs wanted, 8 there: the clock starts
    assert nodes_of(tenant, ["b0", "b1"]) == [None, None]  # one would fit: none is placed
    status = tenant.get(f"{base}/big").json()["status"]
    assert status["phase"] == "Scheduling" and "scheduleStartTime" in status
    assert "conditions" not in status
    since = tenant.get(f"{base}/big").json()["metadata"]["resourceVersion"]
    time.sleep(1.1)  # the timeout is wall-clock time by its definition
    assert pool.cycle() == 0
    # watchers see the verdict: a MODIFIED with the condition, at a new resourceVersion
    watched = tenant.get(
        f"{base}?watch=true&resourceVersion={since}&timeoutSeconds=1&fieldSelector=metadata.name%3Dbig"
    )
    (event,) = [json.loads(line) for line in watched.text.splitlines() if line.strip()]
    assert event["type"] == "MODIFIED"
    assert event["object"]["status"]["conditions"][0]["reason"] == "ScheduleTimeout"
    assert event["object"]["metadata"]["resourceVersion"] != since
    timed_out = tenant.get(f"{base}/big").json()["status"]
    assert timed_out["phase"] == "Scheduling"  # not a dead end: it is tried again
    condition = timed_out["conditions"][0]
    assert (condition["type"], condition["status"]) == ("Scheduled", "False")
    assert condition["reason"] == "ScheduleTimeout"
    assert "not placed within scheduleTimeoutSeconds (1s)" in condition["message"]
    assert "GPU" in condition["message"] or "gpu" in condition["message"]  # the solver's why

    def told() -> dict[str, list[tuple[int, str]]]:
        """Each pod's FailedScheduling warnings: (count, message)."""
        events = tenant.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
        out: dict[str, list[tuple[int, str]]] = {}
        for e in events:
            if e["reason"] == "FailedScheduling":
                out.setdefault(e["involvedObject"]["name"], []).append((e["count"], e["message"]))
        return out

    # Each pod has ONE FailedScheduling warning, which counts the tries (Kubernetes' count of
    # repeats) and says the latest: the time-out.
    first = told()
    assert sorted(first) == ["b0", "b1"]
    for warnings in first.values():
        assert len(warnings) == 1 and warnings[0][0] == 2
        assert 'pod group "big" timed out' in warnings[0][1]
    # Tried again while the pool is still full: it stays marked; the same warning counts it.
    assert pool.cycle() == 0 and nodes_of(tenant, ["b0", "b1"]) == [None, None]
    assert tenant.get(f"{base}/big").json()["status"]["conditions"][0]["reason"] == (
        "ScheduleTimeout"
    )
    assert {name: [c for c, _ in w] for name, w in told().items()} == {"b0": [3], "b1": [3]}
    # Room appears: the next try places the whole gang, and the mark goes.
    pool.node(gpus=8)
    assert pool.cycle() == 2
    assert None not in nodes_of(tenant, ["b0", "b1"])
    placed = tenant.get(f"{base}/big").json()["status"]
    assert placed["phase"] == "Scheduled" and placed["scheduled"] == 2
    assert "conditions" not in placed and "scheduleStartTime" not in placed
    for name in ("b0", "b1"):
        tenant.delete(f"/api/v1/namespaces/{ns}/pods/{name}")


def test_changing_a_timed_out_group_starts_its_clock_anew(
    tenant: Api, admin: Api, db: Database
) -> None:
    pool, base = _gang_too_big(tenant, admin, db, "late", ["l0", "l1"])
    assert pool.cycle() == 0
    time.sleep(1.1)
    assert pool.cycle() == 0
    assert tenant.get(f"{base}/late").json()["status"]["conditions"][0]["reason"] == (
        "ScheduleTimeout"
    )
    changed = tenant.patch(
        f"{base}/late", json={"metadata": {"annotations": {"retry": "1"}}}, headers=MERGE
    )
    assert changed.status_code == 200
    status = changed.json()["status"]
    assert status["phase"] == "Scheduling"
    assert "conditions" not in status and "scheduleStartTime" not in status
    assert pool.cycle() == 0  # still no room: the clock starts again, no mark yet
    assert "conditions" not in tenant.get(f"{base}/late").json()["status"]


def test_topology_required_annotation_keeps_the_gang_in_one_rack(
    tenant: Api, admin: Api, db: Database
) -> None:
    pool = Pool(admin, db)
    a1, a2 = pool.node(gpus=8, rack="a"), pool.node(gpus=8, rack="a")
    pool.node(gpus=8, rack="b")
    ns = tenant.tenant
    pool.member(tenant, "filler", None, gpus=4)
    assert pool.cycle() == 1
    base = f"{BASE}/namespaces/{ns}/podgroups"
    bad = tenant.post(
        base, json=group("x", 2, annotations={"tessera.io/topology-required": "continent"})
    )
    assert bad.status_code == 422
    assert bad.json()["details"]["causes"][0]["field"] == (
        "metadata.annotations[tessera.io/topology-required]"
    )
    assert tenant.get(f"{base}/x").status_code == 404  # a refused request writes nothing
    required = {"tessera.io/topology-required": "rack"}
    assert tenant.post(base, json=group("ring", 3, annotations=required)).status_code == 201
    names = ["r0", "r1", "r2"]
    for name in names:
        pool.member(tenant, name, "ring", gpus=4)
    assert pool.cycle() == 3
    placed = nodes_of(tenant, names)
    racks = {
        admin.get(f"/api/v1/nodes/{n}").json()["metadata"]["labels"]["tessera.io/rack"]
        for n in placed
    }
    assert len(racks) == 1 and set(placed) <= {a1, a2}


def test_membership_rules_and_tenancy(make_tenant) -> None:
    owner, intruder = make_tenant("cso"), make_tenant("csi")
    ns = owner.tenant
    base = f"{BASE}/namespaces/{ns}/podgroups"
    assert owner.post(base, json=group("g", 1)).status_code == 201
    tessera = {"metadata": {"name": "t"}, "spec": {"minMember": 1}}
    assert (
        owner.post(f"/apis/tessera.io/v1/namespaces/{ns}/podgroups", json=tessera).status_code
        == 201
    )
    clash = owner.post(base, json=group("t", 1))
    assert (
        clash.status_code == 409 and "a pod names its gang by name alone" in clash.json()["message"]
    )
    both = owner.post(
        f"/api/v1/namespaces/{ns}/pods",
        json=pod("both", labels={LABEL: "g", "tessera.io/pod-group": "g"}),
    )
    assert both.status_code == 422 and "belongs to one gang" in both.json()["message"]
    wrong = owner.post(f"/api/v1/namespaces/{ns}/pods", json=pod("wrong", labels={LABEL: "t"}))
    assert wrong.status_code == 422
    assert "label the pod tessera.io/pod-group to join it" in wrong.json()["message"]
    assert owner.get(f"/api/v1/namespaces/{ns}/pods/both").status_code == 404
    bad = owner.post(base, json=group("q", 1, minResources={"cpu": "lots"}))
    assert bad.status_code == 422 and "spec.minResources[cpu]" in bad.text
    long = owner.post(base, json=group("q", 1, minResources={"x" * 300: "1"}))
    assert long.status_code == 422 and "1 to 253 characters" in long.text
    assert owner.get(f"{base}/q").status_code == 404
    big = owner.post(base, json=group("q", 1, scheduleTimeoutSeconds=10**9))
    assert big.status_code in (400, 422) and "scheduleTimeoutSeconds" in big.text
    put = owner.get(f"{base}/g").json()
    put["spec"]["minMember"] = 2
    replaced = owner.request("PUT", f"{base}/g", json=put)
    assert replaced.status_code == 200 and replaced.json()["spec"]["minMember"] == 2
    stale = owner.request("PUT", f"{base}/g", json=put)
    assert stale.status_code == 409
    for method in ("GET", "DELETE", "PATCH", "PUT"):
        response = intruder.request(method, f"{base}/g", json=put, headers=MERGE)
        assert response.status_code == 403, method
    assert intruder.post(base, json=group("x", 1)).status_code == 403
    assert intruder.get(f"{BASE}/podgroups").json()["items"] == []
    listed = owner.get(f"{BASE}/podgroups").json()
    assert [g["metadata"]["name"] for g in listed["items"]] == ["g"]
    assert (listed["apiVersion"], listed["kind"]) == (
        "scheduling.x-k8s.io/v1alpha1",
        "PodGroupList",
    )
    (one,) = owner.get(f"{BASE}/namespaces/{owner.tenant}/podgroups").json()["items"]
    assert (one["apiVersion"], one["kind"]) == ("scheduling.x-k8s.io/v1alpha1", "PodGroup")


def test_each_group_watches_only_its_own(tenant: Api) -> None:
    ns = tenant.tenant
    base = f"{BASE}/namespaces/{ns}/podgroups"
    rv = tenant.get(base).json()["metadata"]["resourceVersion"]
    tessera = {"metadata": {"name": "t"}, "spec": {"minMember": 1}}
    assert (
        tenant.post(f"/apis/tessera.io/v1/namespaces/{ns}/podgroups", json=tessera).status_code
        == 201
    )
    assert tenant.post(base, json=group("x", 1)).status_code == 201
    params = {
        "watch": "true",
        "resourceVersion": rv,
        "timeoutSeconds": "2",
        "allowWatchBookmarks": "true",
    }
    with tenant.http.stream("GET", base, params=params) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    seen = [
        (e["type"], e["object"]["apiVersion"], e["object"]["metadata"].get("name"))
        for e in lines
        if e["type"] != "BOOKMARK"
    ]
    assert seen == [("ADDED", "scheduling.x-k8s.io/v1alpha1", "x")]
    bookmarks = [e["object"] for e in lines if e["type"] == "BOOKMARK"]
    assert bookmarks and all(b["kind"] == "PodGroup" for b in bookmarks)
    assert all(b["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" for b in bookmarks)


def test_scheduler_plugins_scheduler_name_is_read_as_tessera_for_gang_members() -> None:
    member = {"spec": {"schedulerName": "scheduler-plugins-scheduler"}, "labels": {LABEL: "g"}}
    alone = {"spec": {"schedulerName": "scheduler-plugins-scheduler"}, "labels": {}}
    assert placed_by(member, DEFAULT_SCHEDULER) and placed_by(member, "scheduler-plugins-scheduler")
    assert not placed_by(alone, DEFAULT_SCHEDULER)
    assert not placed_by({"spec": {}, "labels": {LABEL: "g"}}, "scheduler-plugins-scheduler")
