"""The Eviction subresource (`POST .../pods/{name}/eviction`, policy/v1), through a pod's life:
a pending pod is removed at once; a running one stops gracefully with the `DisruptionTarget`
condition; a refused or dry-run eviction changes nothing. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from app.pods import service as pods
from tests.api.test_pod_updates import bound_pod
from tests.factories import pod


def eviction(name: str, **delete_options: object) -> dict:
    body: dict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj["status"].get("conditions", []) if c["type"] == kind), None)


def test_a_pending_pod_is_evicted_at_once(tenant) -> None:
    ns = tenant.tenant
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("ev-pending")).status_code == 201
    url = f"/api/v1/namespaces/{ns}/pods/ev-pending"
    answer = tenant.post(f"{url}/eviction", json=eviction("ev-pending"))
    assert answer.status_code == 201, answer.text
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert tenant.get(url).status_code == 404


def test_a_running_pod_stops_gracefully_when_evicted(server, tenant, admin, make_tenant) -> None:
    ns = tenant.tenant
    bound = bound_pod(tenant, admin, "ev-run")
    server.services.db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))
    url = f"/api/v1/namespaces/{ns}/pods/ev-run"
    running = tenant.get(url).json()
    assert running["status"]["phase"] == "Running"

    # Refusals first: each leaves the pod exactly as it was.
    other = make_tenant("evx")
    assert other.post(f"{url}/eviction", json=eviction("ev-run")).status_code == 403
    missing = tenant.post(f"{url}x/eviction", json=eviction("ev-runx"))
    assert missing.status_code == 404
    mismatch = tenant.post(f"{url}/eviction", json=eviction("another"))
    assert mismatch.status_code == 400 and "must match" in mismatch.json()["message"]
    stale = tenant.post(f"{url}/eviction", json=eviction("ev-run", preconditions={"uid": "u"}))
    assert stale.status_code == 409
    dry = tenant.post(f"{url}/eviction", params={"dryRun": "All"}, json=eviction("ev-run"))
    assert dry.status_code == 201
    unchanged = tenant.get(url).json()
    assert unchanged["metadata"]["resourceVersion"] == running["metadata"]["resourceVersion"]
    assert condition(unchanged, "DisruptionTarget") is None

    # The eviction: graceful, with the condition and the event, as the kubelet would show it.
    evicted = tenant.post(f"{url}/eviction", json=eviction("ev-run", gracePeriodSeconds=20))
    assert evicted.status_code == 201, evicted.text
    stopping = tenant.get(url).json()
    assert stopping["metadata"]["deletionTimestamp"]
    assert stopping["metadata"]["deletionGracePeriodSeconds"] == 20
    target = condition(stopping, "DisruptionTarget")
    assert target is not None and target["status"] == "True"
    assert target["reason"] == "EvictionByEvictionAPI"
    assert condition(stopping, "Ready")["status"] == "False"  # type: ignore[index]
    events = tenant.get(
        f"/api/v1/namespaces/{ns}/events",
        params={"fieldSelector": "involvedObject.name=ev-run"},
    ).json()["items"]
    assert any("evicted through the Eviction API" in e["message"] for e in events)
    # A second eviction of a terminating pod is answered alike and changes nothing.
    again = tenant.post(f"{url}/eviction", json=eviction("ev-run"))
    assert again.status_code == 201
    assert (
        tenant.get(url).json()["metadata"]["deletionTimestamp"]
        == stopping["metadata"]["deletionTimestamp"]
    )
    # The end of its life: gone, and its GPU free again.
    assert tenant.delete(url, params={"gracePeriodSeconds": 0}).status_code == 200
    assert tenant.get(url).status_code == 404
    gpu = admin.get(f"/apis/tessera.io/v1/gpudevices/{bound['spec']['nodeName']}-gpu0").json()
    assert gpu["status"]["free"]["corePercent"] == 100


def test_discovery_offers_eviction_in_the_policy_group(tenant) -> None:
    core = tenant.get("/api/v1").json()["resources"]
    entry = next(r for r in core if r["name"] == "pods/eviction")
    assert (entry["kind"], entry["group"], entry["version"]) == ("Eviction", "policy", "v1")
    assert entry["verbs"] == ["create"]
    groups = {g["name"] for g in tenant.get("/apis").json()["groups"]}
    assert "policy" in groups
    # kubectl's discovery refuses a group-version without resources: budgets, always none.
    budgets = tenant.get("/apis/policy/v1").json()["resources"]
    assert [(r["name"], r["verbs"]) for r in budgets] == [("poddisruptionbudgets", ["get", "list"])]
    ns = tenant.tenant
    listed = tenant.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets")
    assert listed.status_code == 200 and listed.json()["items"] == []
    assert listed.json()["kind"] == "PodDisruptionBudgetList"
    assert tenant.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/x").status_code == 404
