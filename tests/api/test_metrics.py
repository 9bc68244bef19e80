"""/metrics: Prometheus text for the admin (requests, scheduling, preemption, the pool), 403
for everyone else; over real HTTP on both databases."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.db.engine import Database
from app.metrics import request_attributes
from scheduler.loop import LoopConfig, SchedulingLoop
from tests.conftest import Api, unique
from tests.factories import gpu_node, pod


def scrape(admin: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = admin.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_requests_are_counted_by_verb_resource_and_code(admin: Api, tenant: Api) -> None:
    ns = tenant.tenant
    create = {"verb": "create", "group": "", "resource": "pods", "subresource": ""}
    before = scrape(admin)
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod(unique("m-"))).status_code == 201
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/absent").status_code == 404
    after = scrape(admin)
    total = "apiserver_request_total"
    assert (
        value(after, total, **create, code="201") == value(before, total, **create, code="201") + 1
    )
    get = {"verb": "get", "group": "", "resource": "pods", "subresource": ""}
    assert value(after, total, **get, code="404") == value(before, total, **get, code="404") + 1
    count = "apiserver_request_duration_seconds_count"
    assert value(after, count, **create) == value(before, count, **create) + 1


def test_only_the_admin_reads_metrics(tenant: Api) -> None:
    response = tenant.get("/metrics")
    assert response.status_code == 403
    status = response.json()
    assert status["kind"] == "Status" and "only the admin may get /metrics" in status["message"]
    assert "apiserver_request_total" not in response.text


def test_scheduling_and_the_pool_are_measured(admin: Api, tenant: Api, db: Database) -> None:
    pool = unique("metrics-")
    node = unique("mn-")
    manifest = gpu_node(node, gpus=2, zone=pool)
    assert admin.post("/api/v1/nodes", json=manifest).status_code == 201
    ns = tenant.tenant
    body = pod(
        unique("g-"), cpu="4", memory="16Gi", gpus=1, labels={"tessera.io/gpu-model": "H100"}
    )
    body["spec"]["schedulerName"] = pool
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=body).status_code == 201
    before = scrape(admin)
    assert SchedulingLoop(db, LoopConfig(scheduler_name=pool)).run_once().bound == 1
    after = scrape(admin)
    scheduled = "scheduler_schedule_attempts_total"
    assert (
        value(after, scheduled, result="scheduled")
        == value(before, scheduled, result="scheduled") + 1
    )
    waited = "scheduler_pod_scheduling_duration_seconds_count"
    assert value(after, waited) == value(before, waited) + 1
    solved = "scheduler_scheduling_algorithm_duration_seconds_count"
    assert value(after, solved) == value(before, solved) + 1
    # One of the node's two GPUs is held: half of its zone's GPU cores and memory.
    ratio = "tessera_pool_allocated_ratio"
    labels = {"zone": pool, "gpu_model": "H100"}
    assert value(after, ratio, resource="gpu_core", **labels) == 0.5
    assert value(after, ratio, resource="gpu_memory", **labels) == 0.5
    assert 0 < value(after, ratio, resource="cpu", **labels) < 1
    assert ("tessera_pool_fragment_ratio", tuple(sorted(labels.items()))) in after


def test_request_attributes_follow_kubernetes_verbs() -> None:
    ns_pod = "/api/v1/namespaces/{namespace}/pods/{name}"
    assert request_attributes("GET", ns_pod, b"") == ("get", "", "pods", "")
    assert request_attributes("GET", "/api/v1/namespaces/{namespace}/pods", b"") == (
        "list",
        "",
        "pods",
        "",
    )
    assert request_attributes("GET", "/api/v1/pods", b"watch=true") == ("watch", "", "pods", "")
    assert request_attributes("PUT", ns_pod + "/status", b"") == ("update", "", "pods", "status")
    assert request_attributes("DELETE", "/api/v1/namespaces/{namespace}/pods", b"") == (
        "deletecollection",
        "",
        "pods",
        "",
    )
    assert request_attributes("GET", "/api/v1/namespaces/{name}", b"") == (
        "get",
        "",
        "namespaces",
        "",
    )
    assert request_attributes(
        "POST", "/apis/tessera.io/v1/namespaces/{namespace}/podgroups", b""
    ) == ("create", "tessera.io", "podgroups", "")
    assert request_attributes("GET", "/version", b"") == ("get", "", "/version", "")
    assert request_attributes("GET", "/apis/tessera.io/v1", b"") == ("get", "tessera.io", "", "")
    assert request_attributes("GET", "/healthz", b"") == ("get", "", "/healthz", "")
