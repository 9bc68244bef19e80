"""In-place resize (`pods/resize`, KEP-1287's conventions) over real HTTP, on SQLite and on
PostgreSQL: a pod's whole life through resizes that fit, wait (Deferred) and never can
(Infeasible), with the node's free capacity checked after every step against the specs its pods
hold; what a resize may not change; the usage ledger's rate change at the second it took effect;
concurrent resizes and binds on one node; random resize sequences (hypothesis)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import agent
from app.db.models import Node
from app.kube.meta import now
from app.pods import service as pods
from billing import ledger
from billing.specs import ComputeSpec
from tests.api.test_pod_updates import bound_pod
from tests.conftest import unique
from tests.factories import cpu_node, pod

SMP = "application/strategic-merge-patch+json"


def resources(cpu: str, memory: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def resize_patch(cpu: str, memory: str, container: str = "main") -> dict[str, Any]:
    """What `kubectl patch pod X --subresource resize --patch ...` sends."""
    return {"spec": {"containers": [{"name": container, "resources": resources(cpu, memory)}]}}


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj["status"].get("conditions", []) if c["type"] == kind), None)


class Cluster:
    """One fresh node and the tenant's pods on it, with the capacity invariant."""

    def __init__(self, server, tenant, admin, *, cpu: str = "8", memory: str = "32Gi") -> None:
        self.server, self.tenant, self.admin = server, tenant, admin
        self.ns = tenant.tenant
        self.node = unique("rz-")
        created = admin.post("/api/v1/nodes", json=cpu_node(self.node, cpu=cpu, memory=memory))
        assert created.status_code == 201, created.text

    def url(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.ns}/pods/{name}"

    def create(self, name: str, cpu: str, memory: str) -> dict:
        manifest = pod(name)
        manifest["spec"]["containers"][0]["resources"] = resources(cpu, memory)
        answer = self.tenant.post(f"/api/v1/namespaces/{self.ns}/pods", json=manifest)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def bind(self, name: str) -> int:
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": self.node}}
        return self.admin.post(f"{self.url(name)}/binding", json=binding).status_code

    def run(self, name: str, cpu: str, memory: str) -> dict:
        self.create(name, cpu, memory)
        assert self.bind(name) == 201
        agent.run_once(self.server.services.db, keep_changes=100_000)  # the node starts it
        running = self.get(name)
        assert running["status"]["phase"] == "Running"
        return running

    def get(self, name: str) -> dict:
        answer = self.tenant.get(self.url(name))
        assert answer.status_code == 200, answer.text
        return answer.json()

    def resize(self, name: str, cpu: str, memory: str, **kwargs: Any) -> Any:
        return self.tenant.patch(
            f"{self.url(name)}/resize",
            content=_json(resize_patch(cpu, memory, **kwargs)),
            headers={"Content-Type": SMP},
        )

    def free(self) -> tuple[int, int]:
        row = self.server.services.db.read(lambda s: s.get(Node, self.node))
        return row.cpu_free_milli, row.memory_free_mib

    def allocatable(self) -> tuple[int, int]:
        row = self.server.services.db.read(lambda s: s.get(Node, self.node))
        return row.cpu_allocatable_milli, row.memory_allocatable_mib

    def held(self) -> tuple[int, int]:
        """What the pods on the node hold, by the sold spec each shows (`tessera.io/pod-use-spec`)."""
        items = self.admin.get(
            "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.node}"}
        ).json()["items"]
        specs = [
            ComputeSpec.parse(p["metadata"]["annotations"]["tessera.io/pod-use-spec"])
            for p in items
            if p["status"]["phase"] not in ("Succeeded", "Failed")
        ]
        return sum(s.cpu_milli for s in specs), sum(s.memory_mib for s in specs)

    def check(self) -> tuple[int, int]:
        """Free capacity is allocatable minus what the node's pods hold, never below zero."""
        (cpu, memory), (held_cpu, held_memory) = self.allocatable(), self.held()
        free = self.free()
        assert free == (cpu - held_cpu, memory - held_memory)
        assert free[0] >= 0 and free[1] >= 0
        return free

    def events(self, name: str) -> list[dict]:
        return self.tenant.get(
            f"/api/v1/namespaces/{self.ns}/events",
            params={"fieldSelector": f"involvedObject.name={name}"},
        ).json()["items"]


def _json(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_pod_through_resizes_that_fit_wait_and_never_can(server, tenant, admin) -> None:
    c = Cluster(server, tenant, admin)
    assert c.check() == (8000, 32768)
    running = c.run("app", "1", "2Gi")
    uid = running["metadata"]["uid"]
    assert c.check() == (7000, 30720)
    c.run("filler", "4", "8Gi")
    assert c.check() == (3000, 22528)

    # Up, and it fits: at once, in the spec, the status, the annotation and the node.
    grown = c.resize("app", "2", "4Gi")
    assert grown.status_code == 200, grown.text
    obj = grown.json()
    assert obj["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"
    assert obj["metadata"]["generation"] == running["metadata"]["generation"] + 1
    status = obj["status"]["containerStatuses"][0]
    assert status["allocatedResources"] == {"cpu": "2", "memory": "4Gi"}
    assert status["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert condition(obj, "PodResizePending") is None
    assert c.check() == (2000, 20480)
    resized = [e for e in c.events("app") if e["reason"] == "Resized"]
    assert len(resized) == 1 and "from 1-2Gi to 2-4Gi" in resized[0]["message"]
    assert resized[0]["type"] == "Normal"

    # Up, and the node has no room now: Deferred; the pod keeps what it holds.
    waiting = c.resize("app", "5", "8Gi")
    assert waiting.status_code == 200, waiting.text
    obj = waiting.json()
    pending = condition(obj, "PodResizePending")
    assert pending is not None and pending["reason"] == "Deferred"
    assert "needs 3 vCPU / 4Gi more" in pending["message"], pending["message"]
    assert obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "5"
    assert obj["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "2"
    assert obj["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"
    assert c.check() == (2000, 20480)
    agent.run_once(server.services.db, keep_changes=100_000)  # still no room: still waiting
    assert condition(c.get("app"), "PodResizePending")["reason"] == "Deferred"  # type: ignore[index]
    assert c.check() == (2000, 20480)

    # The other pod goes: the agent's next pass gives the resize the room.
    assert tenant.delete(c.url("filler"), params={"gracePeriodSeconds": 0}).status_code == 200
    assert c.check() == (6000, 28672)
    agent.run_once(server.services.db, keep_changes=100_000)
    obj = c.get("app")
    assert condition(obj, "PodResizePending") is None
    assert obj["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "5-8Gi"
    assert obj["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "5"
    assert c.check() == (3000, 24576)

    # More than the node can ever give: Infeasible, a Warning, nothing moves.
    too_big = c.resize("app", "12", "16Gi")
    assert too_big.status_code == 200, too_big.text
    pending = condition(too_big.json(), "PodResizePending")
    assert pending is not None and pending["reason"] == "Infeasible"
    assert "at most 8 vCPU / 32Gi" in pending["message"], pending["message"]
    warnings = [e for e in c.events("app") if e["reason"] == "ResizeInfeasible"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert c.check() == (3000, 24576)
    agent.run_once(server.services.db, keep_changes=100_000)  # never retried
    assert c.get("app")["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "5-8Gi"

    # A shrink replaces the pending resize and always fits; 1.5 vCPU is sold as 1.5-2Gi.
    shrunk = c.resize("app", "1500m", "1Gi")
    assert shrunk.status_code == 200, shrunk.text
    obj = shrunk.json()
    assert condition(obj, "PodResizePending") is None
    assert obj["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "1.5-2Gi"
    assert c.check() == (6500, 30720)

    # Labelling the resized pod changes neither what it holds nor what it is sold.
    labelled = tenant.patch(
        c.url("app"),
        json={"metadata": {"labels": {"tier": "web"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert labelled.status_code == 200, labelled.text
    assert labelled.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "1.5-2Gi"
    assert c.check() == (6500, 30720)

    # The ledger: one segment per spec, each boundary at the second the resize took effect.
    took_effect = sorted(
        _at(e["firstTimestamp"]) for e in c.events("app") if e["reason"] == "Resized"
    )
    billed = server.services.db.read(lambda s: ledger.events(s, pod_uid=uid))
    assert [(e.kind, e.spec.cpu_milli if e.spec else 0) for e in billed] == [
        ("start", 1000),
        ("change", 2000),
        ("change", 5000),
        ("change", 1500),
    ]
    changes = [e for e in billed if e.kind == "change"]
    assert [e.at for e in changes] == took_effect
    assert [e.id for e in changes] == [f"{uid}/change/{n}" for n in (1, 2, 3)]
    # A replay of a resize (same pod, same seq) is not counted twice.
    row = server.services.db.read(lambda s: pods.repository.get_by_uid(s, uid))
    replay = ledger.resized
    server.services.db.write(
        lambda s: ledger.record(s, [replay(s, {**row, "cpu_milli": 9000}, at=now())])
    )
    again = server.services.db.read(lambda s: ledger.events(s, pod_uid=uid))
    assert [e.id for e in again] == [e.id for e in billed]
    audit = server.services.db.read(
        lambda s: ledger.audit(s, at=now(), tenant_id=_tenant_id(s, tenant))
    )
    assert audit.ok, audit.problems

    # It finishes: it holds nothing, and cannot be resized any more.
    assert server.services.db.write(lambda s: pods.finish(s, uid=uid))
    assert c.check() == (8000, 32768)
    ended = c.resize("app", "2", "4Gi")
    assert ended.status_code == 409 and "has ended (Succeeded)" in ended.json()["message"]
    assert tenant.delete(c.url("app"), params={"gracePeriodSeconds": 0}).status_code == 200
    assert tenant.get(c.url("app")).status_code == 404
    assert c.check() == (8000, 32768)
    audit = server.services.db.read(
        lambda s: ledger.audit(s, at=now(), tenant_id=_tenant_id(s, tenant))
    )
    assert audit.ok, audit.problems


def _tenant_id(session, tenant) -> int:
    from sqlalchemy import select

    from app.db.models import Tenant

    return session.scalar(select(Tenant.id).where(Tenant.name == tenant.tenant))


def test_a_pending_pod_resize_changes_what_the_scheduler_places(server, tenant, admin) -> None:
    c = Cluster(server, tenant, admin)
    c.create("later", "1", "2Gi")
    answer = c.resize("later", "3", "6Gi")
    assert answer.status_code == 200, answer.text
    assert answer.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "3-6Gi"
    assert c.check() == (8000, 32768)  # it holds nothing yet
    assert c.bind("later") == 201
    assert c.check() == (5000, 26624)  # bound at the new size
    # A resize no sold spec covers is refused at once for a pod not placed, as at creation.
    c.create("waits", "1", "2Gi")
    rv = c.get("waits")["metadata"]["resourceVersion"]
    refused = c.resize("waits", "200", "8Gi")
    assert refused.status_code == 422, refused.text
    assert "the largest spec sold has 64 vCPU" in refused.json()["message"]
    assert c.get("waits")["metadata"]["resourceVersion"] == rv
    # A bound pod's resize that no sold spec covers is Infeasible: it keeps running as it is.
    infeasible = c.resize("later", "4", "40Gi")  # 40 GiB needs 5 vCPU: sold as 5-40Gi
    assert infeasible.status_code == 200
    pending = condition(infeasible.json(), "PodResizePending")
    assert pending is not None and pending["reason"] == "Infeasible"
    assert (
        "5 vCPU / 40Gi (sold spec 5-40Gi), rounded up from the 4 vCPU / 40Gi asked"
        in (pending["message"])
    )
    beyond = c.resize("later", "64", "1000Gi")  # more than 8 GiB per vCPU of the largest spec
    pending = condition(beyond.json(), "PodResizePending")
    assert pending is not None and pending["reason"] == "Infeasible"
    assert "no sold spec has that much memory" in pending["message"], pending["message"]
    c.check()
    # It can still be labelled while that resize is pending: it is admitted as what it holds.
    labelled = tenant.patch(
        c.url("later"),
        json={"metadata": {"labels": {"tier": "db"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert labelled.status_code == 200, labelled.text
    assert labelled.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "3-6Gi"
    c.check()


def test_what_a_resize_may_not_change_is_refused_writing_nothing(server, tenant, admin) -> None:
    ns = tenant.tenant
    gpu_pod = bound_pod(tenant, admin, "gp")
    url = f"/api/v1/namespaces/{ns}/pods/gp"
    rv = gpu_pod["metadata"]["resourceVersion"]
    free_before = _node_free(server, gpu_pod["spec"]["nodeName"])

    def refused(body: Any, content_type: str = SMP) -> str:
        answer = tenant.patch(
            f"{url}/resize", content=_json(body), headers={"Content-Type": content_type}
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["kind"] == "Status" and answer.json()["reason"] == "Invalid"
        assert tenant.get(url).json()["metadata"]["resourceVersion"] == rv
        return answer.json()["message"]

    gpu = {
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
    }
    message = refused(gpu)
    assert "GPU resources" in message and "cannot be resized in place" in message
    assert "Delete the pod and create it again" in message
    image = {"spec": {"containers": [{"name": "main", "image": "registry.example/app:2.0"}]}}
    assert "changes only the cpu and memory of containers" in refused(image)
    assert "spec.containers[0].image" in refused(image)
    disk = {
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}
            ]
        }
    }
    assert "changes only the cpu and memory" in refused(disk)
    # A container the pod has not (its one container is "main"): named, with the ones it has.
    stranger = {"spec": {"containers": [{"name": "server", "resources": resources("4", "8Gi")}]}}
    message = refused(stranger)
    assert 'Not found: "server"' in message and "its containers are main" in message
    labels = {"metadata": {"labels": {"x": "y"}}}
    assert "metadata.labels" in refused(labels, "application/merge-patch+json")
    bad = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "lots"}}}]}}
    refused(bad)
    over_limit = {
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "6"}}}
            ]
        }
    }
    assert "must be less than or equal to cpu limit" in refused(over_limit)
    assert _node_free(server, gpu_pod["spec"]["nodeName"]) == free_before
    # The pod itself (not its resize subresource) says where a cpu change goes.
    direct = tenant.patch(
        url, content=_json(resize_patch("8", "32Gi")), headers={"Content-Type": SMP}
    )
    assert direct.status_code == 422 and "--subresource resize" in direct.json()["message"]

    # The GPU pod's CPU and memory can be resized; its GPU share stays in the ledger's spec.
    grown = tenant.patch(
        f"{url}/resize", content=_json(resize_patch("8", "32Gi")), headers={"Content-Type": SMP}
    )
    assert grown.status_code == 200, grown.text
    assert grown.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "8-32Gi"
    segments = server.services.db.read(
        lambda s: ledger.segments(s, pod_uid=gpu_pod["metadata"]["uid"])
    )
    assert [(s.spec.cpu_milli, s.spec.gpu_core_pct) for s in segments][-1] == (8000, 100)

    # Another tenant's pod: 403, whatever the body; a pod that does not exist: 404.
    # (tests/api/test_reviews.py checks pods/resize in the BOLA matrix too.)
    assert (
        tenant.patch(
            f"{url}x/resize", content=_json(resize_patch("1", "2Gi")), headers={"Content-Type": SMP}
        ).status_code
        == 404
    )


def _node_free(server, node: str) -> tuple[int, int]:
    row = server.services.db.read(lambda s: s.get(Node, node))
    return row.cpu_free_milli, row.memory_free_mib


def test_put_and_get_of_the_subresource_and_dry_run(server, tenant, admin) -> None:
    c = Cluster(server, tenant, admin)
    c.run("p", "1", "2Gi")
    read = tenant.get(f"{c.url('p')}/resize")
    assert read.status_code == 200 and read.json()["kind"] == "Pod"
    body = read.json()
    body["spec"]["containers"][0]["resources"] = resources("2", "4Gi")
    dry = tenant.put(f"{c.url('p')}/resize", params={"dryRun": "All"}, json=body)
    assert (
        dry.status_code == 200
        and dry.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"
    )
    assert c.check() == (7000, 30720)  # a dry run moves nothing
    put = tenant.put(f"{c.url('p')}/resize", json=body)
    assert put.status_code == 200, put.text
    assert c.check() == (6000, 28672)
    stale = tenant.put(f"{c.url('p')}/resize", json=body)  # the resourceVersion read before
    assert stale.status_code == 409


def test_concurrent_resizes_and_binds_never_over_allocate_a_node(server, tenant, admin) -> None:
    c = Cluster(server, tenant, admin, cpu="8", memory="32Gi")
    for i in range(4):
        c.run(f"r{i}", "1", "2Gi")
    for i in range(4):
        c.create(f"b{i}", "1", "2Gi")
    barrier = threading.Barrier(8)
    answers: list[int] = []

    def resize(i: int) -> None:
        barrier.wait()
        answers.append(c.resize(f"r{i}", "3", "6Gi").status_code)

    def bind(i: int) -> None:
        barrier.wait()
        answers.append(c.bind(f"b{i}"))

    threads = [threading.Thread(target=resize, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=bind, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(code in (200, 201, 409) for code in answers), answers
    cpu, _ = c.check()
    deferred = [n for n in (f"r{i}" for i in range(4)) if condition(c.get(n), "PodResizePending")]
    assert deferred  # 4 x 3 vCPU can never all fit 8 vCPU with the binds
    held_cpu, _ = c.held()
    assert held_cpu <= 8000 and cpu == 8000 - held_cpu
    agent.run_once(server.services.db, keep_changes=100_000)
    c.check()


def test_concurrent_transactions_resizing_and_binding_never_over_allocate(
    server, tenant, admin
) -> None:
    """The same race without the API's write queue: each resize and bind in its own transaction,
    at once (on PostgreSQL, truly concurrent writers meeting at the node's row lock)."""
    c = Cluster(server, tenant, admin, cpu="8", memory="32Gi")
    for i in range(4):
        c.run(f"q{i}", "1", "2Gi")
    for i in range(4):
        c.create(f"w{i}", "1", "2Gi")
    db = server.services.db
    context = server.services.admission
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def resize(i: int) -> None:
        barrier.wait()
        try:
            db.write(
                lambda s: pods.resize(
                    s,
                    namespace=c.ns,
                    name=f"q{i}",
                    body=resize_patch("3", "6Gi"),
                    patch_type=SMP,
                    context=context(s),
                )
            )
        except Exception as exc:
            errors.append(exc)

    def bind(i: int) -> None:
        barrier.wait()
        try:
            db.write(
                lambda s: pods.bind(s, namespace=c.ns, name=f"w{i}", node_name=c.node, gpus=[])
            )
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=resize, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=bind, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(type(e).__name__ == "Conflict" for e in errors), errors
    free_cpu, _ = c.check()
    assert free_cpu < 4000  # some took the room (which ones depends on the race)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["500m", "1", "2", "3500m", "5", "9"]),
            st.integers(1, 8),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_random_resize_sequences_keep_free_capacity_exact(server, tenant, admin, steps) -> None:
    c = Cluster(server, tenant, admin, cpu="8", memory="24Gi")
    names = [c.run(unique("h"), "1", "2Gi")["metadata"]["name"] for _ in range(3)]
    c.check()
    for which, cpu, per_cpu in steps:
        memory_gib = max(
            1, int(float(cpu.rstrip("m")) / (1000 if cpu.endswith("m") else 1) * per_cpu)
        )
        answer = c.resize(names[which], cpu, f"{memory_gib}Gi")
        assert answer.status_code == 200, answer.text
        c.check()
        agent.run_once(server.services.db, keep_changes=100_000)
        c.check()
