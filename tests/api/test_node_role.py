"""A node's token acts for its node alone: its Node, GPUs and Lease, the pods bound to it (read,
status, removal once stopped); anything else, another node's above all, is 403 in words. Pod
status reported by the node moves the pod through the same transitions as before (billing
starts at the bind and ends when the node reports the pod ended)."""

from __future__ import annotations

from sqlalchemy import select

from app.db.models import UsageEvent
from tests.conftest import Api, unique
from tests.factories import gpu_node, pod

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}


def _bound_pod(admin: Api, ns: str, node: str, name: str | None = None) -> str:
    name = name or unique("np-")
    created = admin.post(f"/api/v1/namespaces/{ns}/pods", json=pod(name, cpu="4", gpus=1))
    assert created.status_code == 201, created.text
    share = f'[{{"gpu": "{node}-gpu0", "memoryMiB": 81920, "corePercent": 100}}]'
    body = {
        "metadata": {"name": name, "annotations": {"tessera.io/gpu-allocation": share}},
        "target": {"kind": "Node", "name": node},
    }
    response = admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=body)
    assert response.status_code == 201, response.text
    return name


def _two_nodes(admin: Api, make_node_agent) -> tuple[str, Api, str, Api]:
    mine, theirs = unique("nm-"), unique("nt-")
    for node in (mine, theirs):
        assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    return mine, make_node_agent(mine), theirs, make_node_agent(theirs)


def _refused(response, *words: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["kind"] == "Status" and body["reason"] == "Forbidden"
    for word in words:
        assert word in body["message"], body["message"]


def test_a_node_sees_only_its_own_pods_gpus_and_lease(admin, tenant, make_node_agent) -> None:
    ns = str(tenant.tenant)
    mine, agent, theirs, _ = _two_nodes(admin, make_node_agent)
    own = _bound_pod(admin, ns, mine)
    other = _bound_pod(admin, ns, theirs)
    unbound = unique("nu-")
    assert admin.post(f"/api/v1/namespaces/{ns}/pods", json=pod(unbound)).status_code == 201

    listed = agent.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={mine}"})
    assert listed.status_code == 200
    assert [p["metadata"]["name"] for p in listed.json()["items"]] == [own]
    _refused(agent.get("/api/v1/pods"), "fieldSelector=spec.nodeName=" + mine)
    _refused(agent.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={theirs}"}))
    _refused(agent.get(f"/api/v1/namespaces/{ns}/pods"))
    assert agent.get(f"/api/v1/namespaces/{ns}/pods/{own}").status_code == 200
    # Another node's pod, an unbound one and one that does not exist: the same 403.
    for name in (other, unbound, "no-such-pod"):
        _refused(agent.get(f"/api/v1/namespaces/{ns}/pods/{name}"), "bound to it")
        _refused(
            agent.patch(
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                json={"status": {"phase": "Running"}},
                headers=MERGE,
            )
        )
    _refused(agent.patch(f"/api/v1/namespaces/{ns}/pods/{own}", json={}, headers=MERGE))
    _refused(agent.post(f"/api/v1/namespaces/{ns}/pods", json=pod("x")))

    gpus = agent.get("/apis/tessera.io/v1/gpudevices").json()["items"]
    assert {g["metadata"]["name"] for g in gpus} == {f"{mine}-gpu0"}
    assert agent.get(f"/apis/tessera.io/v1/gpudevices/{mine}-gpu0").status_code == 200
    _refused(agent.get(f"/apis/tessera.io/v1/gpudevices/{theirs}-gpu0"), "GPU devices on it")

    assert agent.get(f"/api/v1/nodes/{mine}").status_code == 200
    # Its annotations are its own; its labels and cordon are the admin's, and stay as set.
    patched = agent.patch(
        f"/api/v1/nodes/{mine}", json={"metadata": {"annotations": {"x": "y"}}}, headers=MERGE
    )
    assert patched.status_code == 200, patched.text
    assert admin.patch(
        f"/api/v1/nodes/{mine}",
        json={"metadata": {"labels": {"pool": "a"}}, "spec": {"unschedulable": True}},
        headers=MERGE,
    ).is_success
    before = admin.get(f"/api/v1/nodes/{mine}").json()
    for change in (
        {"spec": {"unschedulable": False}},
        {"metadata": {"labels": {"pool": None}}},
        {"metadata": {"labels": {"gpu": "plenty"}}},
    ):
        _refused(agent.patch(f"/api/v1/nodes/{mine}", json=change, headers=MERGE), "the admin's")
    # ...but for the label naming the runtime that runs its pods, which is the agent's to say
    runtime = {"metadata": {"labels": {"tessera.io/runtime": "docker"}}}
    assert agent.patch(f"/api/v1/nodes/{mine}", json=runtime, headers=MERGE).status_code == 200
    before = admin.get(f"/api/v1/nodes/{mine}").json()
    replaced = {**before, "spec": {**before["spec"], "unschedulable": False}}
    _refused(agent.put(f"/api/v1/nodes/{mine}", json=replaced), "its cordon")
    after = admin.get(f"/api/v1/nodes/{mine}").json()
    assert after["spec"]["unschedulable"] is True and after["metadata"]["labels"]["pool"] == "a"
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    admin.patch(f"/api/v1/nodes/{mine}", json={"spec": {"unschedulable": False}}, headers=MERGE)
    _refused(agent.get(f"/api/v1/nodes/{theirs}"), f'only the Node "{mine}"')
    _refused(agent.get("/api/v1/nodes"))
    _refused(agent.delete(f"/api/v1/nodes/{mine}"))

    lease = {"metadata": {"name": mine}, "spec": {"holderIdentity": mine}}
    assert agent.post(LEASES, json=lease).status_code == 201
    assert agent.get(f"{LEASES}/{mine}").json()["spec"]["holderIdentity"] == mine
    _refused(agent.post(LEASES, json={"metadata": {"name": theirs}, "spec": {}}), "its own Lease")
    admin.post(LEASES, json={"metadata": {"name": theirs}, "spec": {}})
    _refused(agent.get(f"{LEASES}/{theirs}"), "its own Lease")
    _refused(agent.get(LEASES))
    _refused(agent.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{mine}"))

    # No tenant data beyond its pods: namespaces, events, pod groups, billing.
    for path in (
        f"/api/v1/namespaces/{ns}",
        "/api/v1/namespaces",
        f"/api/v1/namespaces/{ns}/events",
        "/apis/tessera.io/v1/podgroups",
        f"/apis/billing.tessera.io/v1/namespaces/{ns}/usage",
        "/apis/tessera.io/v1/tenants",
    ):
        _refused(agent.get(path), f'node "{mine}"')
    whoami = agent.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", json={}).json()
    assert whoami["status"]["userInfo"]["username"] == f"system:node:{mine}"


def test_reported_status_runs_and_ends_the_pod_and_its_billing(
    admin, tenant, make_node_agent, db
) -> None:
    ns = str(tenant.tenant)
    mine, agent, _, intruder = _two_nodes(admin, make_node_agent)
    name = _bound_pod(admin, ns, mine)
    path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
    running = {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-04T10:00:00Z"}},
                }
            ],
        }
    }
    _refused(intruder.patch(path, json=running, headers=MERGE))
    response = agent.patch(path, json=running, headers=MERGE)
    assert response.status_code == 200, response.text
    got = tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
    assert got["status"]["phase"] == "Running" and got["status"]["startTime"]
    assert got["status"]["containerStatuses"][0]["state"]["running"]
    assert got["status"]["containerStatuses"][0]["image"] == "registry.example/app:1.0"
    # What the node holds for the container shows as for every started pod (KEP-1287's fields).
    resources = got["spec"]["containers"][0]["resources"]
    requested = {**resources.get("limits", {}), **resources["requests"]}
    assert got["status"]["containerStatuses"][0]["allocatedResources"] == requested
    assert got["status"]["containerStatuses"][0]["resources"]["requests"] == requested

    # A restart: same phase, the count and the last state change.
    restarted = agent.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
    restarted["status"]["containerStatuses"][0].update(
        restartCount=1,
        lastState={"terminated": {"exitCode": 1, "reason": "Error"}},
    )
    assert agent.put(path, json=restarted).status_code == 200
    after = tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["status"]
    assert after["containerStatuses"][0]["restartCount"] == 1

    bad = {"status": {"phase": "Running", "containerStatuses": [{"name": "nope"}]}}
    invalid = agent.patch(path, json=bad, headers=MERGE)
    assert invalid.status_code == 422 and "name each container" in invalid.text
    huge = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "main", "restartCount": 2**40}
    ]}}  # fmt: skip
    assert agent.patch(path, json=huge, headers=MERGE).status_code == 422
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["status"]["phase"] == "Running"

    failed = {
        "status": {
            "phase": "Failed",
            "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline",
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": 1,
                    "state": {"terminated": {"exitCode": 137, "reason": "Error"}},
                }
            ],
        }
    }
    response = agent.patch(path, json=failed, headers=MERGE)
    assert response.status_code == 200, response.text
    status = tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["status"]
    assert status["phase"] == "Failed" and status["reason"] == "DeadlineExceeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    # Billing: started by the bind, stopped by the report (reason finish), once each.
    uid = tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["metadata"]["uid"]
    kinds = db.read(
        lambda s: [
            (e.kind, e.reason)
            for e in s.scalars(select(UsageEvent).where(UsageEvent.pod_uid == uid))
        ]
    )
    assert sorted(kinds) == sorted([("start", "bind"), ("stop", "finish")]), kinds
    # Backwards is refused in words and writes nothing.
    again = agent.patch(path, json=running, headers=MERGE)
    assert again.status_code == 409 and "only moves forward" in again.json()["message"]
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["status"]["phase"] == "Failed"
    # The node removes the ended pod, with grace 0 only.
    pods_path = f"/api/v1/namespaces/{ns}/pods/{name}"
    _refused(agent.delete(pods_path), "gracePeriodSeconds=0")
    assert agent.delete(pods_path, params={"gracePeriodSeconds": 0}).status_code == 200
    assert admin.get(pods_path).status_code == 404


def test_a_node_cannot_remove_a_running_pod_and_unbound_reports_conflict(
    admin, tenant, make_node_agent
) -> None:
    ns = str(tenant.tenant)
    mine, agent, _, _ = _two_nodes(admin, make_node_agent)
    name = _bound_pod(admin, ns, mine)
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    assert (
        agent.patch(f"{path}/status", json={"status": {"phase": "Running"}}, headers=MERGE)
    ).status_code == 200
    _refused(agent.delete(path, params={"gracePeriodSeconds": 0}), "once it has ended")
    assert admin.get(path).json()["status"]["phase"] == "Running"
    # Once its owner deletes it, the node stops it and removes it at once.
    assert tenant.delete(path).status_code == 200
    assert agent.delete(path, params={"gracePeriodSeconds": 0}).status_code == 200
    assert admin.get(path).status_code == 404
    # The admin may report too; a pod not bound yet has nothing to report.
    loose = unique("nl-")
    assert admin.post(f"/api/v1/namespaces/{ns}/pods", json=pod(loose)).status_code == 201
    response = admin.patch(
        f"/api/v1/namespaces/{ns}/pods/{loose}/status",
        json={"status": {"phase": "Running"}},
        headers=MERGE,
    )
    assert response.status_code == 409 and "not bound" in response.json()["message"]


def test_the_admin_issues_node_tokens_over_the_api(admin, tenant) -> None:
    node = unique("nk-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    body = {"apiVersion": "tessera.io/v1", "kind": "NodeToken", "node": node}
    _refused(tenant.post("/apis/tessera.io/v1/nodetokens", json=body), "only the admin")
    made = admin.post("/apis/tessera.io/v1/nodetokens", json=body)
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    assert made.json()["keyId"] in token
    agent = Api(str(admin.http.base_url), token)
    assert agent.get(f"/api/v1/nodes/{node}").status_code == 200
    _refused(agent.post("/apis/tessera.io/v1/nodetokens", json=body))
    bad = admin.post("/apis/tessera.io/v1/nodetokens", json={**body, "node": "Not A Name"})
    assert bad.status_code == 422, bad.text
    unknown = admin.post("/apis/tessera.io/v1/nodetokens", json={**body, "extra": 1})
    assert unknown.status_code in (400, 422), unknown.text


def test_a_node_reports_its_own_gpus_faults_only(admin, tenant, make_node_agent) -> None:
    """A node agent reports a fault of its own GPU (the pod on it is told); another node's GPU,
    a GPU that does not exist and a repair are refused alike, writing nothing."""
    ns = str(tenant.tenant)
    mine, agent, theirs, _ = _two_nodes(admin, make_node_agent)
    own = _bound_pod(admin, ns, mine)
    report = {"apiVersion": "tessera.io/v1", "kind": "GPUFault", "spec": {"kind": "bus"}}
    gpus = "/apis/tessera.io/v1/gpudevices"
    for refused in (f"{theirs}-gpu0", f"{mine}-gpu9"):
        _refused(agent.post(f"{gpus}/{refused}/fault", json=report), "faults of the GPU devices")
    assert admin.get(f"{gpus}/{theirs}-gpu0").json()["status"]["health"] == "Healthy"
    can = agent.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json={
            "spec": {
                "resourceAttributes": {
                    "verb": "create",
                    "group": "tessera.io",
                    "resource": "gpudevices",
                    "subresource": "fault",
                    "name": f"{mine}-gpu0",
                }
            }
        },
    )
    assert can.status_code == 201 and can.json()["status"]["allowed"] is True, can.text
    reported = agent.post(f"{gpus}/{mine}-gpu0/fault", json=report)
    assert reported.status_code in (200, 201), reported.text
    assert reported.json()["status"]["health"] == "Unhealthy"
    told = admin.get(f"/api/v1/namespaces/{ns}/pods/{own}").json()
    assert any(c["type"] == "DisruptionTarget" for c in told["status"]["conditions"])
    _refused(agent.post(f"{gpus}/{mine}-gpu0/repair", json={}))
    assert admin.get(f"{gpus}/{mine}-gpu0").json()["status"]["health"] == "Unhealthy"


def test_a_node_writes_events_only_about_its_own_pods(admin, tenant, make_node_agent) -> None:
    ns = str(tenant.tenant)
    mine, agent, theirs, _ = _two_nodes(admin, make_node_agent)
    own = _bound_pod(admin, ns, mine)
    other = _bound_pod(admin, ns, theirs)

    def event(name: str, reason: str = "Pulled") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}."},
            "involvedObject": {"kind": "Pod", "name": name, "namespace": ns},
            "reason": reason,
            "message": 'Successfully pulled image "busybox" in 1.2s',
            "type": "Normal",
            "reportingComponent": "kubelet",
        }

    written = agent.post(f"/api/v1/namespaces/{ns}/events", json=event(own))
    assert written.status_code == 201, written.text
    assert (
        written.json()["involvedObject"]["uid"]
        == admin.get(f"/api/v1/namespaces/{ns}/pods/{own}").json()["metadata"]["uid"]
    )
    # Another node's pod, and one that does not exist: 403 alike.
    for name in (other, "no-such-pod"):
        _refused(agent.post(f"/api/v1/namespaces/{ns}/events", json=event(name)), "bound to it")
    # A tenant reads its pods' events and writes none.
    _refused(tenant.post(f"/api/v1/namespaces/{ns}/events", json=event(own, "Forged")), "read")
    listed = tenant.get(
        f"/api/v1/namespaces/{ns}/events",
        params={"fieldSelector": f"involvedObject.name={own}"},
    ).json()["items"]
    kubelet = [(e["reason"], e["message"]) for e in listed if e["source"]["component"] == "kubelet"]
    assert kubelet == [("Pulled", 'Successfully pulled image "busybox" in 1.2s')], listed


def test_a_node_reads_only_the_configmaps_and_secrets_of_its_own_pods(
    admin, tenant, make_node_agent
) -> None:
    ns = str(tenant.tenant)
    mine, agent, _theirs, their_agent = _two_nodes(admin, make_node_agent)
    base = f"/api/v1/namespaces/{ns}"
    for kind, body in (
        ("configmaps", {"data": {"mode": "fast"}}),
        ("secrets", {"stringData": {"token": "s3cret"}}),
    ):
        for name in ("used", "unused"):
            made = tenant.post(f"{base}/{kind}", json={"metadata": {"name": name}, **body})
            assert made.status_code == 201, made.text
    name = unique("np-")
    manifest = pod(name, cpu="4", gpus=1)
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "used", "key": "mode"}}}
    ]
    manifest["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": "used"}}]
    assert admin.post(f"{base}/pods", json=manifest).status_code == 201
    share = f'[{{"gpu": "{mine}-gpu0", "memoryMiB": 81920, "corePercent": 100}}]'
    bound = admin.post(
        f"{base}/pods/{name}/binding",
        json={
            "metadata": {"name": name, "annotations": {"tessera.io/gpu-allocation": share}},
            "target": {"kind": "Node", "name": mine},
        },
    )
    assert bound.status_code == 201, bound.text
    got = agent.get(f"{base}/configmaps/used")
    assert got.status_code == 200 and got.json()["data"] == {"mode": "fast"}
    secret = agent.get(f"{base}/secrets/used")
    assert secret.status_code == 200 and "token" in secret.json()["data"]
    # what no pod of the node uses, another node's reads, and lists: 403 alike
    _refused(agent.get(f"{base}/configmaps/unused"), "pods bound to it use")
    _refused(agent.get(f"{base}/secrets/unused"), "pods bound to it use")
    _refused(agent.get(f"{base}/secrets"))
    _refused(their_agent.get(f"{base}/secrets/used"), "pods bound to it use")
    _refused(their_agent.get(f"{base}/configmaps/used"))
    _refused(agent.put(f"{base}/secrets/used", json={"metadata": {"name": "used"}}))
