"""The admin's answers match the schemas the OpenAPI document gives for them.

The schemathesis suite acts as a tenant; this covers what only the admin may do, with the same
models (`extra="forbid"`: an undocumented field fails as surely as a missing one).
"""

from __future__ import annotations

import pytest

from app.auth.schemas import Tenant, TenantList, TenantToken
from app.inventory.schemas import GPUDevice, GPUDeviceList, Node, NodeList
from tests.conftest import unique
from tests.factories import gpu_node

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def test_tenant_answers_match_their_schemas(admin) -> None:
    name = unique("schema")
    created = admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}})
    assert created.status_code == 201
    assert Tenant.model_validate(created.json()).metadata.name == name
    listed = TenantList.model_validate(admin.get("/apis/tessera.io/v1/tenants").json())
    assert name in {t.metadata.name for t in listed.items}
    Tenant.model_validate(admin.get(f"/apis/tessera.io/v1/tenants/{name}").json())
    token = admin.post(f"/apis/tessera.io/v1/tenants/{name}/tokens", json={})
    assert token.status_code == 201
    issued = TenantToken.model_validate(token.json())
    assert issued.token.startswith(f"tsr_{issued.key_id}_")


def test_inventory_answers_match_their_schemas(admin) -> None:
    name = unique("schema-node")
    created = admin.post("/api/v1/nodes", json=gpu_node(name, gpus=2))
    assert created.status_code == 201
    node = Node.model_validate(created.json())
    assert node.status.capacity["nvidia.com/gpu"] == "2"
    cordoned = admin.patch(
        f"/api/v1/nodes/{name}",
        json={"spec": {"unschedulable": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert Node.model_validate(cordoned.json()).spec.unschedulable is True
    NodeList.model_validate(admin.get("/api/v1/nodes").json())
    gpus = GPUDeviceList.model_validate(
        admin.get(
            "/apis/tessera.io/v1/gpudevices", params={"fieldSelector": f"spec.nodeName={name}"}
        ).json()
    )
    assert len(gpus.items) == 2
    gpu = gpus.items[0].metadata.name
    sick = admin.patch(
        f"/apis/tessera.io/v1/gpudevices/{gpu}",
        json={"status": {"health": "Unhealthy"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert GPUDevice.model_validate(sick.json()).status.health == "Unhealthy"
    removed = admin.delete(f"/api/v1/nodes/{name}")
    assert Node.model_validate(removed.json()).metadata.name == name
