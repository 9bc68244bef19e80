"""Fault injection on command: the admin annotates a Node `tessera.io/inject-gpu-fault` (with
real kubectl), the real virtual agent of that node reports the GPU fault through the API and
removes the annotation; the GPU is Unhealthy and the pod on it gets its DisruptionTarget."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.main import parse_injection
from app import kubeconfig
from app.auth import service as auth
from app.db.engine import Database
from tests.agent.test_virtual_agent import TESSERA, Stack, _phase, stack, until
from tests.conftest import unique
from tests.e2e.conftest import KUBECTL
from tests.factories import gpu_node, pod

__all__ = ["stack"]  # the module's fixture

GPUS = "/apis/tessera.io/v1/gpudevices"


def test_an_injection_reads_gpu_kind_and_xid_and_refuses_anything_else() -> None:
    assert parse_injection("n1", "gpu0:xid:79") == (
        "n1-gpu0",
        {"kind": "xid", "xid": 79, "message": "injected through tessera.io/inject-gpu-fault"},
    )
    assert parse_injection("n1", "n1-gpu1:ecc")[0] == "n1-gpu1"
    for bad in ("gpu0", "gpu0:overheat", ":ecc", "gpu0:xid:79:1", "gpu0:xid:abc", "gpu0:xid:1000"):
        with pytest.raises(ValueError, match="inject-gpu-fault"):
            parse_injection("n1", bad)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_an_annotated_node_reports_its_gpu_fault_and_the_pod_on_it_is_told(
    stack: Stack, tmp_path: Path
) -> None:
    node = unique("vg-")
    assert stack.admin.post("/api/v1/nodes", json=gpu_node(node, gpus=2)).is_success
    db = Database(stack.database_url)
    try:
        token = db.write(lambda s: auth.create_token(s, role="node", node=node)).value
    finally:
        db.dispose()
    inventory = tmp_path / "gpu-nodes.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "server": stack.server.url,
                "caCert": str(stack.server.ca),
                "nodes": [{"name": node, "token": token}],
            }
        )
    )
    agent = subprocess.Popen(
        [TESSERA, "agent", "--virtual", "--nodes", str(inventory)],
        env=stack.server.env,
        stdout=(tmp_path / "agent.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        name = unique("gp-")
        manifest = pod(name, cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25)
        created = stack.tenant.post(f"/api/v1/namespaces/{stack.namespace}/pods", json=manifest)
        assert created.status_code == 201, created.text
        share = [{"gpu": f"{node}-gpu0", "memoryMiB": 20480, "corePercent": 25}]
        binding = {
            "target": {"kind": "Node", "name": node},
            "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(share)}},
        }
        bound = stack.admin.post(
            f"/api/v1/namespaces/{stack.namespace}/pods/{name}/binding", json=binding
        )
        assert bound.status_code == 201, bound.text
        until(_phase(stack, name, "Running"), what="Running")
        assert stack.admin.get(f"{GPUS}/{node}-gpu0").json()["status"]["health"] == "Healthy"
        config = kubeconfig.write(
            tmp_path / "admin.kubeconfig",
            kubeconfig.build(
                server=stack.server.url,
                ca_cert=stack.server.ca,
                user="admin",
                token=stack.admin_token,
                namespace="default",
            ),
        )
        done = subprocess.run(
            [
                str(KUBECTL),
                "--kubeconfig",
                str(config),
                "annotate",
                "node",
                node,
                "tessera.io/inject-gpu-fault=gpu0:xid:79",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr

        def unhealthy() -> dict[str, Any] | None:
            gpu = stack.admin.get(f"{GPUS}/{node}-gpu0").json()
            return gpu if gpu["status"]["health"] == "Unhealthy" else None

        gpu = until(unhealthy, what="the GPU Unhealthy")
        assert gpu["status"]["faults"][-1]["kind"] == "xid"
        assert gpu["status"]["faults"][-1]["xid"] == 79
        # The other GPU is untouched, the annotation is gone (the fault is reported once).
        assert stack.admin.get(f"{GPUS}/{node}-gpu1").json()["status"]["health"] == "Healthy"
        until(
            lambda: (
                "tessera.io/inject-gpu-fault"
                not in (
                    stack.admin.get(f"/api/v1/nodes/{node}").json()["metadata"].get("annotations")
                    or {}
                )
            ),
            what="the annotation removed",
        )
        assert len(stack.admin.get(f"{GPUS}/{node}-gpu0").json()["status"]["faults"]) == 1
        told = stack.pod(name)
        condition = next(c for c in told["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert condition["status"] == "True" and node in json.dumps(told["spec"])
        stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{name}")
    finally:
        agent.terminate()
        agent.wait(timeout=10)
