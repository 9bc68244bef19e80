"""A docker-runtime node registers the GPUs its host has (here from a description file: no GPU
is on these machines), and a pod given a whole GPU gets a device request naming that GPU's UUID.
The engine here has no NVIDIA runtime, so the container cannot start: the test reads what the
agent asked the engine for (the container's HostConfig.DeviceRequests).

The engine is needed: without one these tests skip, or fail when CI is set."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from app.auth import service as auth
from app.db.engine import Database
from tests.agent.test_docker_runtime import TIMING, until
from tests.agent.test_host_gpus import UUIDS, write_gpus
from tests.conftest import unique
from tests.e2e.conftest import TESSERA, start_server, stop_server
from tests.engine import BUSYBOX, docker


@pytest.fixture(scope="module")
def gpu_host(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A server and a docker agent for a node that does not exist yet, on a host described by
    a GPU file (four H100s)."""
    if not database_url.startswith("sqlite"):
        pytest.skip("the runtime is the same on either database: these run on SQLite")
    data_dir = tmp_path_factory.mktemp("gpu-host")
    server = start_server(
        data_dir, database_url, **TIMING, PYTHONPATH=os.environ.get("PYTHONPATH", ".")
    )
    node = unique("gh-")
    db = Database(database_url)
    try:
        admin_token = db.write(lambda s: auth.create_token(s, role="admin")).value
        tenant = unique("gt")
        node_token = db.write(lambda s: auth.create_token(s, role="node", node=node)).value
    finally:
        db.dispose()
    verify = ssl.create_default_context(cafile=str(server.ca))
    admin = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {admin_token}"},
        verify=verify,
        timeout=30,
    )
    assert admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": tenant}}).is_success
    inventory = data_dir / "nodes.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "server": server.url,
                "caCert": str(server.ca),
                "nodes": [{"name": node, "token": node_token}],
            }
        )
    )
    gpus = write_gpus(data_dir / "gpus.yaml")
    with (data_dir / "agent.log").open("w") as log:
        agent = subprocess.Popen(
            [TESSERA, "agent", "--runtime", "docker", "--nodes", str(inventory)],
            env={**server.env, "DOCKER_HOST": docker_host, "TESSERA_AGENT_GPU_FILE": str(gpus)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        until(
            lambda: (
                (got := admin.get(f"/api/v1/nodes/{node}")).status_code == 200
                and got.json()["metadata"]["labels"].get("tessera.io/runtime") == "docker"
            ),
            timeout=60,
            what="the node registered and labelled by its agent",
        )
        yield {"admin": admin, "node": node, "namespace": tenant, "host": docker_host}
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        stop_server(server)
        ids = docker(docker_host, "ps", "-aq", "--filter", f"label=tessera.io/node={node}").split()
        if ids:
            docker(docker_host, "rm", "-f", *ids)
        docker(docker_host, "network", "rm", f"tessera-ns-{tenant}", check=False)


def test_the_node_registers_the_hosts_gpus_with_their_uuids(gpu_host: dict[str, Any]) -> None:
    admin, node = gpu_host["admin"], gpu_host["node"]
    got = admin.get(f"/api/v1/nodes/{node}").json()
    assert got["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert got["metadata"]["labels"]["tessera.io/gpu-model"] == "H100"
    listed = admin.get("/apis/tessera.io/v1/gpudevices").json()["items"]
    mine = sorted(
        (g for g in listed if g["spec"]["nodeName"] == node), key=lambda g: g["spec"]["index"]
    )
    assert [g["spec"]["uuid"] for g in mine] == UUIDS
    assert [g["spec"]["numaNode"] for g in mine] == [0, 0, 1, 1]
    assert mine[0]["spec"]["nvlinkDomain"] == mine[1]["spec"]["nvlinkDomain"]
    assert mine[1]["spec"]["nvlinkDomain"] != mine[2]["spec"]["nvlinkDomain"]


def test_a_whole_gpu_is_asked_of_the_engine_by_its_uuid(gpu_host: dict[str, Any]) -> None:
    admin, node, namespace = gpu_host["admin"], gpu_host["node"], gpu_host["namespace"]
    name = unique("g-")
    path = f"/api/v1/namespaces/{namespace}/pods"
    created = admin.post(
        path,
        json={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX,
                        "command": ["sleep", "60"],
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {"nvidia.com/gpu": 1},
                        },
                    }
                ],
            },
        },
    )
    assert created.status_code == 201, created.text
    uid = created.json()["metadata"]["uid"]
    share = [{"gpu": f"{node}-gpu2", "memoryMiB": 81920, "corePercent": 100}]
    bound = admin.post(
        f"{path}/{name}/binding",
        json={
            "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(share)}},
            "target": {"kind": "Node", "name": node},
        },
    )
    assert bound.status_code == 201, bound.text

    def container() -> dict[str, Any] | None:
        ids = docker(
            gpu_host["host"], "ps", "-aq", "--filter", f"label=tessera.io/pod-uid={uid}"
        ).split()
        for found in ids:
            shown = docker(gpu_host["host"], "inspect", found, check=False)
            for info in json.loads(shown) if shown.strip() else []:
                if info["Config"]["Labels"].get("tessera.io/container") == "main":
                    return dict(info)
        return None

    made = until(container, timeout=60, what="the pod's container")
    requests = made["HostConfig"].get("DeviceRequests")
    (request,) = requests
    assert request["Driver"] == "nvidia" and request["Capabilities"] == [["gpu"]]
    assert request["DeviceIDs"] == [UUIDS[2]]  # the GPU bound, by its UUID, not its index
