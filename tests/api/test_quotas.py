"""v1 ResourceQuota over real HTTP, on SQLite and on PostgreSQL: what a quota counts (each live
pod's sold spec, not what it asked), the 403 in Kubernetes' words for a create or a resize that
would pass it, dry runs, pods that ended, who may read and write quotas, and 50 concurrent
creates against room for 10."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson

from app import agent
from app.pods import service as pods
from tests.conftest import unique
from tests.factories import cpu_node, gpu_node, pod

SMP = {"Content-Type": "application/strategic-merge-patch+json"}


def quota(name: str, **hard: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": {k.replace("_", "/"): v for k, v in hard.items()}},
    }


def quotas_url(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/resourcequotas"


def set_quota(admin, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    made = admin.post(quotas_url(ns), json=body)
    assert made.status_code == 201, made.text
    return made.json()


def sized(name: str, cpu: str, memory: str) -> dict[str, Any]:
    manifest = pod(name)
    manifest["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return manifest


def test_a_quota_counts_the_sold_spec_and_refuses_what_would_pass_it(admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, {**quota("compute", cpu="4", memory="10Gi")})
    url = f"/api/v1/namespaces/{ns}/pods"
    # 1.2 vCPU is sold as 1.5: the quota counts 1.5
    for name in ("a", "b"):
        made = tenant.post(url, json=sized(name, "1.2", "2Gi"))
        assert made.status_code == 201, made.text
        assert made.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "1.5-2Gi"
    shown = tenant.get(f"{quotas_url(ns)}/compute").json()
    assert shown["status"] == {
        "hard": {"cpu": "4", "memory": "10Gi"},
        "used": {"cpu": "3", "memory": "4Gi"},
    }
    refused = tenant.post(url, json=sized("c", "1.2", "2Gi"))
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods "c" is forbidden: exceeded quota: compute, requested: cpu=1500m, used: cpu=3, '
        "limited: cpu=4"
    )
    assert tenant.get(f"{url}/c").status_code == 404
    # a dry run is checked the same, and one that fits writes nothing
    dry = tenant.post(f"{url}?dryRun=All", json=sized("c", "1.2", "2Gi"))
    assert dry.status_code == 403 and "exceeded quota: compute" in dry.json()["message"]
    fits = tenant.post(f"{url}?dryRun=All", json=sized("d", "1", "2Gi"))
    assert fits.status_code == 201, fits.text
    assert tenant.get(f"{url}/d").status_code == 404
    assert tenant.post(url, json=sized("d", "1", "2Gi")).status_code == 201
    # memory exceeded alone, named alone
    tenant.delete(f"{url}/d")
    over = tenant.post(url, json=sized("e", "1", "8Gi"))
    assert over.status_code == 403
    assert over.json()["message"].endswith(
        "exceeded quota: compute, requested: memory=8Gi, used: memory=4Gi, limited: memory=10Gi"
    )
    # a deleted pod no longer counts
    assert tenant.delete(f"{url}/a").status_code == 200
    assert tenant.get(f"{quotas_url(ns)}/compute").json()["status"]["used"] == {
        "cpu": "1500m",
        "memory": "2Gi",
    }


def test_pod_counts_every_quota_and_the_strictest_refuses(admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, quota("count", count_pods="2"))
    set_quota(admin, ns, quota("requests", **{"requests.cpu": "100", "pods": "5"}))
    url = f"/api/v1/namespaces/{ns}/pods"
    assert tenant.post(url, json=pod("one")).status_code == 201
    assert tenant.post(url, json=pod("two")).status_code == 201
    third = tenant.post(url, json=pod("three"))
    assert third.status_code == 403
    assert third.json()["message"] == (
        'pods "three" is forbidden: exceeded quota: count, requested: count/pods=1, used: '
        "count/pods=2, limited: count/pods=2"
    )
    applied = tenant.patch(
        f"{url}/four?fieldManager=m",
        content=orjson.dumps(pod("four")),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert applied.status_code == 403 and "exceeded quota: count" in applied.json()["message"]
    listed = tenant.get(quotas_url(ns)).json()["items"]
    used = {q["metadata"]["name"]: q["status"]["used"] for q in listed}
    # the default spec (no resources asked) is 2 vCPU
    assert used == {"count": {"count/pods": "2"}, "requests": {"requests.cpu": "4", "pods": "2"}}


def test_pods_that_ended_do_not_count(server, admin, tenant) -> None:
    ns = tenant.tenant
    node = unique("qn-")
    assert admin.post("/api/v1/nodes", json=cpu_node(node)).status_code == 201
    set_quota(admin, ns, quota("pods", pods="1"))
    url = f"/api/v1/namespaces/{ns}/pods"
    made = tenant.post(url, json=pod("first")).json()
    binding = {"metadata": {"name": "first"}, "target": {"kind": "Node", "name": node}}
    assert admin.post(f"{url}/first/binding", json=binding).status_code == 201
    agent.run_once(server.services.db, keep_changes=100_000)
    assert tenant.post(url, json=pod("second")).status_code == 403
    assert server.services.db.write(lambda s: pods.finish(s, uid=made["metadata"]["uid"]))
    assert tenant.get(f"{url}/first").json()["status"]["phase"] == "Succeeded"
    assert tenant.get(f"{quotas_url(ns)}/pods").json()["status"]["used"] == {"pods": "0"}
    assert tenant.post(url, json=pod("second")).status_code == 201


def test_a_resize_that_grows_past_a_quota_is_refused(admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, quota("compute", **{"limits.cpu": "3", "limits.memory": "12Gi"}))
    url = f"/api/v1/namespaces/{ns}/pods"
    assert tenant.post(url, json=sized("grow", "1", "2Gi")).status_code == 201
    patch = {
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}
            ]
        }
    }
    refused = tenant.patch(f"{url}/grow/resize", content=orjson.dumps(patch), headers=SMP)
    assert refused.status_code == 403, refused.text
    assert refused.json()["message"] == (
        'pods "grow" is forbidden: exceeded quota: compute, requested: limits.cpu=3, used: '
        "limits.cpu=1, limited: limits.cpu=3"
    )
    assert (
        tenant.get(f"{url}/grow").json()["metadata"]["annotations"]["tessera.io/pod-use-spec"]
        == "1-2Gi"
    )
    patch["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    grown = tenant.patch(f"{url}/grow/resize", content=orjson.dumps(patch), headers=SMP)
    assert grown.status_code == 200, grown.text
    assert tenant.get(f"{quotas_url(ns)}/compute").json()["status"]["used"] == {
        "limits.cpu": "2",
        "limits.memory": "8Gi",
    }


def test_tenants_read_their_quotas_and_only_the_admin_writes_them(admin, make_tenant) -> None:
    owner, other = make_tenant(), make_tenant()
    url = quotas_url(owner.tenant)
    set_quota(admin, owner.tenant, quota("q", pods="3"))
    assert owner.get(f"{url}/q").status_code == 200
    assert [q["metadata"]["name"] for q in owner.get(url).json()["items"]] == ["q"]
    assert [q["metadata"]["name"] for q in owner.get("/api/v1/resourcequotas").json()["items"]] == [
        "q"
    ]
    watched = owner.get(url, params={"watch": "1", "timeoutSeconds": "1"})
    assert watched.status_code == 200 and '"ADDED"' in watched.text
    for method, path, body in (
        ("POST", url, quota("mine", pods="100")),
        ("PUT", f"{url}/q", quota("q", pods="100")),
        ("PATCH", f"{url}/q", {"spec": {"hard": {"pods": "100"}}}),
        ("PATCH", f"{url}/q/status", {"status": {"hard": {"pods": "100"}}}),
        ("DELETE", f"{url}/q", None),
        ("DELETE", url, None),
    ):
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else None
        answer = owner.request(method, path, json=body, headers=headers)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "only the admin" in answer.json()["message"]
    assert owner.get(f"{url}/q").json()["spec"]["hard"] == {"pods": "3"}
    assert other.get(f"{url}/q").status_code == 403
    assert other.get("/api/v1/resourcequotas").json()["items"] == []
    raised = admin.patch(
        f"{url}/q",
        json={"spec": {"hard": {"pods": "4"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert raised.status_code == 200 and raised.json()["status"]["hard"] == {"pods": "4"}
    assert admin.delete(f"{url}/q").status_code == 200


def test_a_quota_is_validated(admin, tenant) -> None:
    url = quotas_url(tenant.tenant)
    for hard, expected in (
        ({"gpus": "1"}, 'Unsupported value: "gpus": a quota limits cpu, requests.cpu'),
        ({"cpu": "-1"}, "must be greater than or equal to 0"),
        ({"memory": "lots"}, "is not a quantity"),
        ({"pods": "1.5"}, "must be a whole number"),
        ({"nvidia.com/gpu": "1e40"}, "too large"),
        ({"cpu": "1e17"}, "must be at most"),
    ):
        answer = admin.post(url, json={**quota("bad"), "spec": {"hard": hard}})
        assert answer.status_code == 422, (hard, answer.text)
        assert expected in answer.json()["message"], answer.json()["message"]
    assert admin.get(f"{url}/bad").status_code == 404
    made = set_quota(
        admin,
        tenant.tenant,
        {
            **quota("all"),
            "spec": {
                "hard": {
                    "requests.cpu": "8",
                    "requests.memory": "32Gi",
                    "limits.cpu": "8",
                    "limits.memory": "32Gi",
                    "nvidia.com/gpu": 2,
                    "requests.nvidia.com/gpu": "2",
                    "tessera.io/gpu-memory": "40Gi",
                    "tessera.io/gpu-core": "100",
                    "count/pods": "10",
                }
            },
        },
    )
    assert made["status"]["used"]["tessera.io/gpu-memory"] == "0"
    table = admin.get(
        f"{url}", headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    ).json()
    (row,) = table["rows"]
    assert "requests.cpu: 0/8" in row["cells"][2]


def test_fifty_concurrent_creates_against_room_for_ten_admit_ten(server, admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, quota("ten", pods="10"))
    results: list[int] = []
    start = threading.Barrier(50)

    def create(i: int) -> None:
        with httpx.Client(
            base_url=str(tenant.http.base_url), headers=dict(tenant.http.headers), timeout=60
        ) as http:
            start.wait()
            answer = http.post(f"/api/v1/namespaces/{ns}/pods", json=pod(f"race-{i}"))
            results.append(answer.status_code)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [201] * 10 + [403] * 40
    listed = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    assert len(listed) == 10
    assert tenant.get(f"{quotas_url(ns)}/ten").json()["status"]["used"] == {"pods": "10"}


def test_gpu_slices_count_their_vram_and_sm_share(admin, tenant) -> None:
    ns = tenant.tenant
    node = unique("qg-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    set_quota(
        admin,
        ns,
        quota("gpu", **{"tessera.io/gpu-memory": "30Gi", "requests.tessera.io/gpu-core": "100"}),
    )
    url = f"/api/v1/namespaces/{ns}/pods"
    made = tenant.post(url, json=pod("slice-a", gpu_memory="20Gi", gpu_core=25))
    assert made.status_code == 201, made.text
    shown = tenant.get(f"{quotas_url(ns)}/gpu").json()["status"]["used"]
    assert shown == {"tessera.io/gpu-memory": "20Gi", "requests.tessera.io/gpu-core": "25"}
    refused = tenant.post(url, json=pod("slice-b", gpu_memory="20Gi", gpu_core=25))
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        'pods "slice-b" is forbidden: exceeded quota: gpu, requested: '
        "tessera.io/gpu-memory=20Gi, used: tessera.io/gpu-memory=20Gi, limited: "
        "tessera.io/gpu-memory=30Gi"
    )
    # a pod without GPUs is not limited by a GPU quota
    assert tenant.post(url, json=pod("cpu-only")).status_code == 201
    table = tenant.get(
        quotas_url(ns), headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    ).json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age", "Request", "Limit"]
    assert table["rows"][0]["cells"][2] == (
        "requests.tessera.io/gpu-core: 25/100, tessera.io/gpu-memory: 20Gi/30Gi"
    )


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def secret(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {}}


def test_count_of_every_registry_kind_is_limited(admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(
        admin,
        ns,
        quota("objects", count_configmaps="2", count_secrets="1", count_resourcequotas="2"),
    )
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    assert tenant.post(cms, json=configmap("one")).status_code == 201
    # a dry run that fits is checked and writes nothing
    dry = tenant.post(f"{cms}?dryRun=All", json=configmap("dry"))
    assert dry.status_code == 201, dry.text
    assert tenant.get(f"{cms}/dry").status_code == 404
    assert tenant.post(cms, json=configmap("two")).status_code == 201
    third = tenant.post(cms, json=configmap("three"))
    assert third.status_code == 403, third.text
    assert third.json()["reason"] == "Forbidden"
    assert third.json()["message"] == (
        'configmaps "three" is forbidden: exceeded quota: objects, requested: '
        "count/configmaps=1, used: count/configmaps=2, limited: count/configmaps=2"
    )
    assert tenant.get(f"{cms}/three").status_code == 404
    assert tenant.post(f"{cms}?dryRun=All", json=configmap("three")).status_code == 403
    secrets = f"/api/v1/namespaces/{ns}/secrets"
    assert tenant.post(secrets, json=secret("s1")).status_code == 201
    refused = tenant.post(secrets, json=secret("s2"))
    assert refused.status_code == 403
    assert "exceeded quota: objects, requested: count/secrets=1" in refused.json()["message"]
    # the quota itself is one of the two resourcequotas allowed
    set_quota(admin, ns, quota("second", pods="9"))
    more = admin.post(quotas_url(ns), json=quota("third", pods="9"))
    assert more.status_code == 403
    assert "count/resourcequotas=1, used: count/resourcequotas=2" in more.json()["message"]
    status = tenant.get(f"{quotas_url(ns)}/objects").json()["status"]
    assert status["used"] == {
        "count/configmaps": "2",
        "count/secrets": "1",
        "count/resourcequotas": "2",
    }
    # a deleted object frees its place; pods are not limited by object counts
    assert tenant.delete(f"{cms}/one").status_code == 200
    assert tenant.post(cms, json=configmap("three")).status_code == 201
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("p")).status_code == 201
    # an unknown kind is refused with the known keys listed
    bad = admin.post(quotas_url(ns), json=quota("bad", count_widgets="1"))
    assert bad.status_code == 422
    assert 'Unsupported value: "count/widgets"' in bad.json()["message"]
    assert "count/configmaps" in bad.json()["message"]


def test_count_races_admit_exactly_the_room(admin, tenant) -> None:
    ns = tenant.tenant
    set_quota(admin, ns, quota("five", count_configmaps="5"))
    results: list[int] = []
    start = threading.Barrier(20)

    def create(i: int) -> None:
        with httpx.Client(
            base_url=str(tenant.http.base_url), headers=dict(tenant.http.headers), timeout=60
        ) as http:
            start.wait()
            answer = http.post(f"/api/v1/namespaces/{ns}/configmaps", json=configmap(f"c-{i}"))
            results.append(answer.status_code)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [201] * 5 + [403] * 15
    assert len(tenant.get(f"/api/v1/namespaces/{ns}/configmaps").json()["items"]) == 5
