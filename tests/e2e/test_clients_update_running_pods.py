"""The official `kubernetes` client and `kubernetes_asyncio` change a running pod: replace what
they read, patch, and server-side apply, against a real `tessera serve`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kubernetes_asyncio
import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.conftest import unique
from tests.e2e.conftest import Kubectl, Process
from tests.e2e.lifecycle import bring_to, manifest

APPLY = "application/apply-patch+yaml"


def applied(name: str, label: str) -> dict[str, Any]:
    """A manifest as a GitOps tool applies it: quantities as strings, no server fields."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": label}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "2Gi"},
                        "limits": {"tessera.io/gpu-memory": "10Gi", "tessera.io/gpu-core": "10"},
                    },
                }
            ]
        },
    }


@pytest.fixture
def running(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> Iterator[tuple[Kubectl, str, dict[str, Any]]]:
    kubectl: Kubectl = tenant_kubectl()
    name = unique("run-")
    kubectl("create", "-f", "-", stdin=manifest(name))
    pod = bring_to(
        "Running",
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name=name,
    )
    yield kubectl, name, pod
    # Give the GPU slice back for the tests that count free GPUs.
    kubectl("delete", "pod", name, "--grace-period=0", "--force", "--ignore-not-found")


def test_official_client_replaces_patches_and_applies_a_running_pod(running) -> None:
    kubectl, name, before = running
    ns = str(kubectl.namespace)
    api_client = config.new_client_from_config(config_file=str(kubectl.kubeconfig))
    api = client.CoreV1Api(api_client)
    try:
        pod = api.read_namespaced_pod(name, ns)
        pod.metadata.labels["stage"] = "read-modify-write"
        replaced = api.replace_namespaced_pod(name, ns, pod)
        assert replaced.metadata.labels["stage"] == "read-modify-write"
        assert replaced.spec.node_name == before["spec"]["nodeName"]

        patched = api.patch_namespaced_pod(name, ns, {"metadata": {"labels": {"p": "1"}}})
        assert patched.metadata.labels["p"] == "1"
        json_patched = api.patch_namespaced_pod(
            name, ns, [{"op": "add", "path": "/metadata/annotations/j", "value": "1"}]
        )
        assert json_patched.metadata.annotations["j"] == "1"

        for label in ("ssa-1", "ssa-1", "ssa-2"):
            result = api.patch_namespaced_pod(
                name, ns, applied(name, label), field_manager="gitops", _content_type=APPLY
            )
            assert result.metadata.labels["app"] == label
        managers = {m.manager for m in result.metadata.managed_fields}
        assert "gitops" in managers
        assert result.status.phase == "Running"

        # An image may change (Kubernetes allows it; the node restarts the container), the
        # command may not.
        changed = applied(name, "ssa-3")
        changed["spec"]["containers"][0]["image"] = "registry.example/app:2.0"
        result = api.patch_namespaced_pod(
            name, ns, changed, field_manager="gitops", _content_type=APPLY
        )
        assert result.spec.containers[0].image == "registry.example/app:2.0"
        with pytest.raises(ApiException) as refused:
            changed["spec"]["containers"][0]["command"] = ["sleep", "1"]
            api.patch_namespaced_pod(name, ns, changed, field_manager="gitops", _content_type=APPLY)
        assert refused.value.status == 422
        assert "spec.containers[0].command" in refused.value.body
        assert "nodeName" not in refused.value.body
    finally:
        api_client.close()


def test_kubernetes_asyncio_replaces_patches_and_applies_a_running_pod(running) -> None:
    kubectl, name, before = running
    ns = str(kubectl.namespace)

    async def scenario() -> None:
        api_client = await kubernetes_asyncio.config.new_client_from_config(
            config_file=str(kubectl.kubeconfig)
        )
        async with api_client:
            api = kubernetes_asyncio.client.CoreV1Api(api_client)
            pod = await api.read_namespaced_pod(name, ns)
            pod.metadata.labels["stage"] = "async"
            replaced = await api.replace_namespaced_pod(name, ns, pod)
            assert replaced.metadata.labels["stage"] == "async"
            assert replaced.spec.node_name == before["spec"]["nodeName"]
            patched = await api.patch_namespaced_pod(
                name, ns, {"metadata": {"annotations": {"note": "async"}}}
            )
            assert patched.metadata.annotations["note"] == "async"
            for label in ("a1", "a1", "a2"):
                result = await api.patch_namespaced_pod(
                    name,
                    ns,
                    applied(name, label),
                    field_manager="async-gitops",
                    _content_type=APPLY,
                )
                assert result.metadata.labels["app"] == label
            assert result.spec.node_name == before["spec"]["nodeName"]
            assert result.status.phase == "Running"

    asyncio.run(scenario())
