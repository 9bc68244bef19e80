"""apps/v1 ReplicaSet and Deployment as the registry keeps them (no controller runs beside
these tests' server): defaults, validation, generation, the status and scale subresources,
discovery. Their controllers are tested end to end in tests/e2e/test_workloads.py."""

from __future__ import annotations

from typing import Any

from tests.api.test_registry import JSON_MERGE, workload

APPS = "/apis/apps/v1"


def url(tenant: Any, resource: str, name: str = "", sub: str = "") -> str:
    path = f"{APPS}/namespaces/{tenant.tenant}/{resource}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def test_a_deployment_gets_kubernetes_defaults_and_a_generation(tenant) -> None:
    made = tenant.post(url(tenant, "deployments"), json=workload("Deployment", "web", {}))
    assert made.status_code == 201, made.text
    obj = made.json()
    assert obj["metadata"]["generation"] == 1
    assert obj["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    assert obj["spec"]["revisionHistoryLimit"] == 10
    assert obj["spec"]["progressDeadlineSeconds"] == 600
    # a spec change counts; a metadata change does not; status is its subresource's alone
    changed = tenant.patch(
        url(tenant, "deployments", "web"), json={"spec": {"paused": True}}, headers=JSON_MERGE
    )
    assert changed.json()["metadata"]["generation"] == 2
    labelled = tenant.patch(
        url(tenant, "deployments", "web"),
        json={"metadata": {"labels": {"a": "b"}}, "status": {"replicas": 9}},
        headers=JSON_MERGE,
    )
    assert labelled.json()["metadata"]["generation"] == 2
    assert "replicas" not in (labelled.json().get("status") or {})


def test_workloads_are_validated(tenant) -> None:
    bad = workload("Deployment", "bad", {})
    bad["spec"]["template"]["metadata"]["labels"] = {"run": "other"}
    refused = tenant.post(url(tenant, "deployments"), json=bad)
    assert refused.status_code == 422
    assert "`selector` does not match template `labels`" in refused.json()["message"]

    still = workload("Deployment", "still", {})
    still["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"},
    }
    refused = tenant.post(url(tenant, "deployments"), json=still)
    assert refused.status_code == 422 and "may not be 0 when `maxSurge` is 0" in refused.text

    recreate = workload("Deployment", "recreate", {})
    recreate["spec"]["strategy"] = {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}
    refused = tenant.post(url(tenant, "deployments"), json=recreate)
    assert refused.status_code == 422 and "Recreate" in refused.text

    no_selector = workload("ReplicaSet", "loose", {})
    del no_selector["spec"]["selector"]
    assert tenant.post(url(tenant, "replicasets"), json=no_selector).status_code == 422

    assert (
        tenant.post(url(tenant, "replicasets"), json=workload("ReplicaSet", "rs", {})).status_code
        == 201
    )
    moved = tenant.patch(
        url(tenant, "replicasets", "rs"),
        json={
            "spec": {
                "selector": {"matchLabels": {"run": "x"}},
                "template": {"metadata": {"labels": {"run": "x"}}},
            }
        },
        headers=JSON_MERGE,
    )
    assert moved.status_code == 422 and "spec.selector" in moved.text


def test_the_scale_subresource(tenant) -> None:
    assert (
        tenant.post(url(tenant, "deployments"), json=workload("Deployment", "web", {})).status_code
        == 201
    )
    scale = tenant.get(url(tenant, "deployments", "web", "scale"))
    assert scale.status_code == 200
    body = scale.json()
    assert body["kind"] == "Scale" and body["apiVersion"] == "autoscaling/v1"
    assert body["spec"] == {"replicas": 1}
    assert body["status"] == {"replicas": 0, "selector": "run=web"}

    # kubectl scale: a merge patch of the Scale
    patched = tenant.patch(
        url(tenant, "deployments", "web", "scale"),
        json={"spec": {"replicas": 4}},
        headers=JSON_MERGE,
    )
    assert patched.status_code == 200 and patched.json()["spec"]["replicas"] == 4
    deployment = tenant.get(url(tenant, "deployments", "web")).json()
    assert deployment["spec"]["replicas"] == 4 and deployment["metadata"]["generation"] == 2

    # a dry run writes nothing
    dry = tenant.patch(
        url(tenant, "deployments", "web", "scale") + "?dryRun=All",
        json={"spec": {"replicas": 9}},
        headers=JSON_MERGE,
    )
    assert dry.status_code == 200 and dry.json()["spec"]["replicas"] == 9
    assert tenant.get(url(tenant, "deployments", "web")).json()["spec"]["replicas"] == 4

    # PUT: conditional on the resourceVersion it names
    current = tenant.get(url(tenant, "deployments", "web", "scale")).json()
    stale = {**current, "metadata": {**current["metadata"], "resourceVersion": "1"}}
    stale["spec"] = {"replicas": 2}
    assert tenant.put(url(tenant, "deployments", "web", "scale"), json=stale).status_code == 409
    current["spec"] = {"replicas": 2}
    put = tenant.put(url(tenant, "deployments", "web", "scale"), json=current)
    assert put.status_code == 200 and put.json()["spec"]["replicas"] == 2

    negative = tenant.patch(
        url(tenant, "deployments", "web", "scale"),
        json={"spec": {"replicas": -1}},
        headers=JSON_MERGE,
    )
    assert negative.status_code == 422 and "spec.replicas" in negative.text
    missing = tenant.get(url(tenant, "deployments", "ghost", "scale"))
    assert missing.status_code == 404


def test_the_status_subresource_and_tenancy(tenant, make_tenant, admin) -> None:
    assert (
        tenant.post(url(tenant, "replicasets"), json=workload("ReplicaSet", "rs", {})).status_code
        == 201
    )
    status = admin.patch(
        url(tenant, "replicasets", "rs", "status"),
        json={"status": {"replicas": 1, "readyReplicas": 1}},
        headers=JSON_MERGE,
    )
    assert status.status_code == 200 and status.json()["status"]["readyReplicas"] == 1
    # tenants scale their workloads but do not write their status (their controllers do)
    assert (
        tenant.patch(
            url(tenant, "replicasets", "rs", "status"),
            json={"status": {"replicas": 3}},
            headers=JSON_MERGE,
        ).status_code
        == 403
    )
    other = make_tenant()
    assert other.get(url(tenant, "replicasets", "rs")).status_code == 403
    assert other.get(url(tenant, "replicasets", "rs", "scale")).status_code == 403


def test_discovery_names_the_apps_group(tenant) -> None:
    groups = tenant.get("/apis").json()["groups"]
    assert "apps" in [g["name"] for g in groups]
    resources = {r["name"]: r for r in tenant.get(f"{APPS}").json()["resources"]}
    assert resources["deployments"]["shortNames"] == ["deploy"]
    assert resources["replicasets"]["shortNames"] == ["rs"]
    assert "all" in resources["deployments"]["categories"]
    assert "all" in resources["replicasets"]["categories"]
    scale = resources["deployments/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    assert set(scale["verbs"]) == {"get", "patch", "update"}
    assert "deployments/status" in resources
