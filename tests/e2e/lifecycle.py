"""Pods in each phase of their life, for end-to-end tests: Pending (nothing places pods in the
e2e server), Running (bound through the Binding API as the scheduler does, started by the node
agent) and Succeeded (the node's report, through the service layer)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from app.db.engine import Database
from app.pods import service as pods
from tests.e2e.conftest import Kubectl, Process

PHASES = ("Pending", "Running", "Succeeded")

# A slice pod, as people write manifests: no defaults, quantities as strings, as the server
# returns them (so a second `kubectl apply` finds nothing to patch).
POD = """
apiVersion: v1
kind: Pod
metadata:
  name: NAME
  labels: {app: LABEL}
spec:
  containers:
  - name: main
    image: registry.example/app:1.0
    resources:
      requests: {cpu: "1", memory: 2Gi}
      limits: {tessera.io/gpu-memory: 10Gi, tessera.io/gpu-core: "10"}
"""


def manifest(name: str, label: str = "x", extra_meta: str = "") -> str:
    text = POD.replace("NAME", name).replace("LABEL", label)
    if extra_meta:
        text = text.replace("  labels:", f"  {extra_meta}\n  labels:")
    return text


def bind(admin: Kubectl, tessera: Process, namespace: str, name: str) -> str:
    """Bind the pod to a GPU of the e2e pool, as the scheduler does; returns the node's name."""
    gpus = json.loads(
        admin("get", "gpu", "-l", f"topology.kubernetes.io/zone={tessera.zone}", "-o", "json")
    )["items"]
    gpu = random.choice(gpus)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": name,
            "annotations": {
                "tessera.io/gpu-allocation": json.dumps(
                    [{"gpu": gpu["metadata"]["name"], "memoryMiB": 10240, "corePercent": 10}]
                )
            },
        },
        "target": {"kind": "Node", "name": gpu["spec"]["nodeName"]},
    }
    admin(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
        "-f",
        "-",
        stdin=json.dumps(binding),
    )
    return str(gpu["spec"]["nodeName"])


def wait_for_phase(kubectl: Kubectl, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = json.loads(kubectl("get", "pod", name, "-o", "json"))
        if pod["status"]["phase"] == phase:
            return pod
        assert time.monotonic() < deadline, f"pod {name} stayed {pod['status']['phase']}"
        time.sleep(0.1)


def bring_to(
    phase: str,
    *,
    kubectl: Kubectl,
    admin: Kubectl,
    tessera: Process,
    database_url: str,
    name: str,
) -> dict[str, Any]:
    """Take an existing Pending pod to `phase`; returns it as kubectl reads it."""
    if phase == "Pending":
        return wait_for_phase(kubectl, name, "Pending")
    assert kubectl.namespace is not None
    bind(admin, tessera, kubectl.namespace, name)
    running = wait_for_phase(kubectl, name, "Running")
    if phase == "Running":
        return running
    db = Database(database_url)
    try:
        uid = running["metadata"]["uid"]
        assert db.write(lambda s: pods.finish(s, uid=uid))
    finally:
        db.dispose()
    return wait_for_phase(kubectl, name, "Succeeded")
