"""`fieldValidation` on every kind an admin writes: nodes, GPU devices and tenants.

Pods, namespaces and PodGroups have their own tests. Here, through a node's and a GPU's whole
life (create, cordon, replace, mark unhealthy, delete) and a tenant's creation: `Strict` refuses
an unknown field naming it and writes nothing, `Warn` (the default) drops it and says so in a
`Warning` header, `Ignore` drops it silently. Runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import unique
from tests.factories import cpu_node, gpu_node

MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
STRICT = {"fieldValidation": "Strict"}


def warnings_of(response: httpx.Response) -> str:
    return response.headers.get("warning", "")


def refused_naming(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["reason"] == "BadRequest"
    assert f'unknown field "{field}"' in body["message"]
    assert [c["field"] for c in body["details"]["causes"]] == [field]


def test_a_node_through_its_life_refuses_or_drops_unknown_fields(admin) -> None:
    name = unique("fv-node")
    url = f"/api/v1/nodes/{name}"
    manifest: dict[str, Any] = cpu_node(name)
    manifest["spec"] = {"unschedulable": True, "podCIDR": "10.0.0.0/24"}

    strict = admin.post("/api/v1/nodes", params=STRICT, json=manifest)
    refused_naming(strict, "spec.podCIDR")
    assert admin.get(url).status_code == 404  # nothing was written

    created = admin.post("/api/v1/nodes", json=manifest)
    assert created.status_code == 201, created.text
    assert warnings_of(created) == '299 - "unknown field \\"spec.podCIDR\\""'
    assert (
        created.json()["spec"]["unschedulable"] is True and "podCIDR" not in created.json()["spec"]
    )

    # A merge patch with an unknown field: Strict changes nothing, Warn applies the rest.
    patch = {"metadata": {"labels": {"rack": "r9"}}, "spec": {"providerID": "x"}}
    refused_naming(admin.patch(url, params=STRICT, json=patch, headers=MERGE), "spec.providerID")
    assert "rack" not in admin.get(url).json()["metadata"]["labels"]
    warned = admin.patch(url, json=patch, headers=MERGE)
    assert warned.status_code == 200, warned.text
    assert "spec.providerID" in warnings_of(warned)
    assert warned.json()["metadata"]["labels"]["rack"] == "r9"
    assert "providerID" not in warned.json()["spec"]

    # A JSON patch that adds an unknown field under status.
    add = [{"op": "add", "path": "/status/phase", "value": "Running"}]
    refused_naming(admin.patch(url, params=STRICT, json=add, headers=JSON_PATCH), "status.phase")
    ignored = admin.patch(url, params={"fieldValidation": "Ignore"}, json=add, headers=JSON_PATCH)
    assert ignored.status_code == 200 and warnings_of(ignored) == ""
    assert "phase" not in ignored.json()["status"]

    # A replace of what was read, without its status, uncordoned and with an unknown field.
    current = admin.get(url).json()
    replacement = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": current["metadata"],
        "spec": {"unschedulable": False, "configSource": {}},
    }
    refused_naming(admin.put(url, params=STRICT, json=replacement), "spec.configSource")
    assert admin.get(url).json()["spec"]["unschedulable"] is True
    del replacement["spec"]["configSource"]
    replaced = admin.put(url, params=STRICT, json=replacement)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["spec"].get("unschedulable") in (False, None)

    assert admin.delete(url).status_code == 200
    assert admin.get(url).status_code == 404


def test_a_gpu_refuses_or_drops_unknown_fields(admin) -> None:
    node = unique("fv-gpu")
    manifest = gpu_node(node, gpus=1)
    manifest["spec"] = {"unschedulable": True}  # nobody else's pod lands here meanwhile
    assert admin.post("/api/v1/nodes", json=manifest).status_code == 201
    gpus = admin.get(
        "/apis/tessera.io/v1/gpudevices", params={"fieldSelector": f"spec.nodeName={node}"}
    ).json()["items"]
    url = f"/apis/tessera.io/v1/gpudevices/{gpus[0]['metadata']['name']}"
    sick = {"status": {"health": "Unhealthy", "reason": "Xid 79"}}

    refused_naming(admin.patch(url, params=STRICT, json=sick, headers=MERGE), "status.reason")
    assert admin.get(url).json()["status"]["health"] == "Healthy"
    warned = admin.patch(url, json=sick, headers=MERGE)
    assert warned.status_code == 200, warned.text
    assert "status.reason" in warnings_of(warned)
    assert warned.json()["status"]["health"] == "Unhealthy"
    assert "reason" not in warned.json()["status"]

    healthy = admin.patch(url, params=STRICT, json={"status": {"health": "Healthy"}}, headers=MERGE)
    assert healthy.status_code == 200 and healthy.json()["status"]["health"] == "Healthy"
    assert admin.delete(f"/api/v1/nodes/{node}").status_code == 200


def test_a_tenant_refuses_or_drops_unknown_fields(admin) -> None:
    name = unique("fv")
    body = {"metadata": {"name": name}, "spec": {"plan": "gold"}}
    refused_naming(admin.post("/apis/tessera.io/v1/tenants", params=STRICT, json=body), "spec.plan")
    assert admin.get(f"/apis/tessera.io/v1/tenants/{name}").status_code == 404
    created = admin.post("/apis/tessera.io/v1/tenants", json=body)
    assert created.status_code == 201, created.text
    assert warnings_of(created) == '299 - "unknown field \\"spec.plan\\""'
    assert created.json()["spec"] == {"weight": 1}
    wrong = admin.post("/apis/tessera.io/v1/tenants", json={"kind": "Pod", "metadata": {}})
    assert wrong.status_code == 400 and "takes a Tenant" in wrong.json()["message"]
