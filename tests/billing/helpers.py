"""Helpers for billing tests: bind a pod through the real API; a clock the test moves."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tests.conftest import Api, unique
from tests.factories import cpu_node, gpu_node, pod


def bound_pod(
    tenant: Api,
    admin: Api,
    name: str,
    *,
    gpus: int = 0,
    slice_gib: int = 0,
    core: int = 0,
    **resources,
) -> dict:
    """Create a pod as `tenant`, bind it as the admin on a fresh node; returns the pod."""
    node = unique("bill-")
    manifest_node = gpu_node(node, gpus=2) if gpus or slice_gib else cpu_node(node)
    assert admin.post("/api/v1/nodes", json=manifest_node).status_code == 201
    ns = tenant.tenant
    manifest = pod(
        name,
        cpu=resources.get("cpu", "2"),
        memory=resources.get("memory", "4Gi"),
        gpus=gpus or None,
        gpu_memory=f"{slice_gib}Gi" if slice_gib else None,
        gpu_core=core or None,
        labels=resources.get("labels"),
    )
    created = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest)
    assert created.status_code == 201, created.text
    allocation = []
    if gpus:
        allocation = [
            {"gpu": f"{node}-gpu{i}", "memoryMiB": 81920, "corePercent": 100} for i in range(gpus)
        ]
    elif slice_gib:
        allocation = [{"gpu": f"{node}-gpu0", "memoryMiB": slice_gib * 1024, "corePercent": core}]
    binding = {
        "target": {"kind": "Node", "name": node},
        "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(allocation)}},
    }
    bound = admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=binding)
    assert bound.status_code == 201, bound.text
    return tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()


class Clock:
    def __init__(self) -> None:
        self.at = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.at

    def move(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at
