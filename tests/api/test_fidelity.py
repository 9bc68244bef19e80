"""What clients' own end-to-end suites expect of any Kubernetes API server (real HTTP, SQLite
and PostgreSQL)."""

from __future__ import annotations

from tests.api.test_pod_updates import bound_pod
from tests.conftest import unique
from tests.factories import gpu_node, pod

NOT_READY = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}
UNREACHABLE = {**NOT_READY, "key": "node.kubernetes.io/unreachable"}


def test_discovery_answers_with_and_without_a_trailing_slash(tenant) -> None:
    for path in ("/api", "/apis", "/version", "/api/v1", "/apis/tessera.io/v1"):
        plain = tenant.get(path)
        slashed = tenant.get(path + "/", follow_redirects=False)
        assert slashed.status_code == 200, (path, slashed.status_code)
        assert slashed.json() == plain.json()
    listed = tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/", follow_redirects=False)
    assert listed.status_code == 200 and listed.json()["kind"] == "PodList"


def test_pods_get_the_default_tolerations_and_keep_them_through_updates(tenant, admin) -> None:
    ns = tenant.tenant
    url = f"/api/v1/namespaces/{ns}/pods"
    created = tenant.post(url, json=pod("tol-plain")).json()
    assert created["spec"]["tolerations"] == [NOT_READY, UNREACHABLE]
    own = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    custom = pod("tol-own")
    custom["spec"]["tolerations"] = [own, {**NOT_READY, "tolerationSeconds": 30}]
    stored = tenant.post(url, json=custom).json()
    # a toleration of the same key is the pod's own choice; only the missing default is added
    assert stored["spec"]["tolerations"] == [
        own,
        {**NOT_READY, "tolerationSeconds": 30},
        UNREACHABLE,
    ]
    # the manifest sent again as written (without the added toleration) is no change, also bound
    bound = bound_pod(tenant, admin, "tol-bound")
    again = pod("tol-bound", cpu="4", memory="16Gi", gpus=1)
    again["spec"]["tolerations"] = []
    replaced = tenant.put(f"{url}/tol-bound", json=again)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["metadata"]["resourceVersion"] == bound["metadata"]["resourceVersion"]
    assert replaced.json()["spec"]["tolerations"] == [NOT_READY, UNREACHABLE]


def test_nodes_carry_the_os_and_arch_labels(admin, tenant) -> None:
    name = unique("osarch-")
    assert admin.post("/api/v1/nodes", json=gpu_node(name, gpus=1)).status_code == 201
    node = tenant.get(f"/api/v1/nodes/{name}").json()
    assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
    assert node["metadata"]["labels"]["kubernetes.io/arch"] == "amd64"
    assert node["status"]["nodeInfo"]["architecture"] == "amd64"
    selected = tenant.get("/api/v1/nodes", params={"labelSelector": "kubernetes.io/os=linux"})
    assert name in {n["metadata"]["name"] for n in selected.json()["items"]}
    # an inventory may say otherwise
    arm = unique("arm-")
    spec = gpu_node(arm, gpus=1)
    spec["metadata"]["labels"]["kubernetes.io/arch"] = "arm64"
    assert admin.post("/api/v1/nodes", json=spec).status_code == 201
    node = tenant.get(f"/api/v1/nodes/{arm}").json()
    assert node["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
    assert node["status"]["nodeInfo"]["architecture"] == "arm64"


def test_delete_collection_deletes_what_the_selectors_match(tenant, admin, make_tenant) -> None:
    ns = tenant.tenant
    url = f"/api/v1/namespaces/{ns}/pods"
    for name, app in (("dc-a", "web"), ("dc-b", "web"), ("dc-c", "db")):
        assert tenant.post(url, json=pod(name, labels={"app": app})).status_code == 201
    bound_pod(tenant, admin, "dc-bound", app="web")
    resources = {r["name"]: r for r in tenant.get("/api/v1").json()["resources"]}
    assert "deletecollection" in resources["pods"]["verbs"]

    dry = tenant.delete(url, params={"labelSelector": "app=web", "dryRun": "All"})
    assert dry.status_code == 200 and len(dry.json()["items"]) == 3
    assert len(tenant.get(url).json()["items"]) == 4

    deleted = tenant.delete(url, params={"labelSelector": "app=web"})
    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert body["kind"] == "PodList"
    assert {p["metadata"]["name"] for p in body["items"]} == {"dc-a", "dc-b", "dc-bound"}
    left = {p["metadata"]["name"]: p for p in tenant.get(url).json()["items"]}
    # the bound pod is stopping (its grace period), the others are gone; the unmatched one stays
    assert set(left) == {"dc-c", "dc-bound"}
    assert "deletionTimestamp" in left["dc-bound"]["metadata"]

    by_field = tenant.delete(url, params={"fieldSelector": "metadata.name=dc-c"})
    assert [p["metadata"]["name"] for p in by_field.json()["items"]] == ["dc-c"]
    # another tenant's namespace: 403 and nothing deleted
    other = make_tenant()
    assert (
        other.post(f"/api/v1/namespaces/{other.tenant}/pods", json=pod("keep")).status_code == 201
    )
    assert tenant.delete(f"/api/v1/namespaces/{other.tenant}/pods").status_code == 403
    assert len(other.get(f"/api/v1/namespaces/{other.tenant}/pods").json()["items"]) == 1
