"""Manifests for tests."""

from __future__ import annotations

from typing import Any


def pod(
    name: str | None = "web",
    *,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int | None = None,
    gpu_memory: str | None = None,
    gpu_core: int | str | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    if gpus is not None:
        limits["nvidia.com/gpu"] = gpus
    if gpu_memory is not None:
        limits["tessera.io/gpu-memory"] = gpu_memory
    if gpu_core is not None:
        limits["tessera.io/gpu-core"] = gpu_core
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1.0"}
    if requests or limits:
        container["resources"] = {
            k: v for k, v in (("requests", requests), ("limits", limits)) if v
        }
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": "job-"}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container], **spec},
    }


def gpu_node(
    name: str,
    *,
    model: str = "H100",
    gpus: int = 8,
    cpu: str = "96",
    memory: str = "1024Gi",
    zone: str = "z1",
    rack: str = "r1",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "topology.kubernetes.io/region": "test",
                "topology.kubernetes.io/zone": zone,
                "tessera.io/rack": rack,
                "tessera.io/gpu-model": model,
            },
        },
        "status": {"capacity": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)}},
    }


def cpu_node(
    name: str, *, cpu: str = "64", memory: str = "256Gi", zone: str = "z1"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"capacity": {"cpu": cpu, "memory": memory}},
    }
