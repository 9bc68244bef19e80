"""A docker-runtime node registers the GPUs its host has (here from a description file: no GPU
is on these machines), and a pod given a whole GPU gets a device request naming that GPU's UUID.
The engine here has no NVIDIA runtime, so the container cannot start: the test reads what the
agent asked the engine for (the container's HostConfig.DeviceRequests).

The engine is needed: without one these tests skip, or fail when CI is set."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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


@contextmanager
def running_host(
    docker_host: str, database_url: str, data_dir: Path, **agent_env: str
) -> Iterator[dict[str, Any]]:
    """A server and a docker agent for a node that does not exist yet, on a host described by
    a GPU file (four H100s)."""
    if not database_url.startswith("sqlite"):
        pytest.skip("the runtime is the same on either database: these run on SQLite")
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
    env = {**server.env, "DOCKER_HOST": docker_host, "TESSERA_AGENT_GPU_FILE": str(gpus)}
    agents: list[subprocess.Popen[bytes]] = []

    def start_agent() -> None:
        with (data_dir / f"agent-{len(agents)}.log").open("w") as log:
            agents.append(
                subprocess.Popen(
                    [TESSERA, "agent", "--runtime", "docker", "--nodes", str(inventory)],
                    env={**env, **agent_env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def restart_agent() -> None:
        """The agent SIGKILLed (nothing of it cleans up) and started again."""
        agents[-1].send_signal(signal.SIGKILL)
        agents[-1].wait(timeout=10)
        start_agent()

    start_agent()
    try:
        until(
            lambda: (
                (got := admin.get(f"/api/v1/nodes/{node}")).status_code == 200
                and got.json()["metadata"]["labels"].get("tessera.io/runtime") == "docker"
            ),
            timeout=60,
            what="the node registered and labelled by its agent",
        )
        yield {
            "admin": admin,
            "node": node,
            "namespace": tenant,
            "host": docker_host,
            "restart_agent": restart_agent,
            "agent_log": lambda: (data_dir / f"agent-{len(agents) - 1}.log").read_text(),
        }
    finally:
        agents[-1].terminate()
        agents[-1].wait(timeout=15)
        stop_server(server)
        for label in (f"tessera.io/node={node}", f"tessera.io/mps-node={node}"):
            ids = docker(docker_host, "ps", "-aq", "--filter", f"label={label}").split()
            if ids:
                docker(docker_host, "rm", "-f", *ids)
        docker(docker_host, "network", "rm", f"tessera-ns-{tenant}", check=False)
        volumes = docker(
            docker_host, "volume", "ls", "-q", "--filter", f"label=tessera.io/mps-node={node}"
        ).split()
        if volumes:
            docker(docker_host, "volume", "rm", "-f", *volumes, check=False)


@pytest.fixture(scope="module")
def gpu_host(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with running_host(docker_host, database_url, tmp_path_factory.mktemp("gpu-host")) as host:
        yield host


def create_pod(
    host: dict[str, Any], gpu: int, limits: dict[str, Any], share: dict[str, int]
) -> tuple[str, str]:
    """A busybox pod bound to the node's GPU `gpu` with `share` of it: (name, uid)."""
    admin, node, namespace = host["admin"], host["node"], host["namespace"]
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
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX,
                        "command": ["sleep", "600"],
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": limits,
                        },
                    }
                ],
            },
        },
    )
    assert created.status_code == 201, created.text
    allocation = [{"gpu": f"{node}-gpu{gpu}", **share}]
    bound = admin.post(
        f"{path}/{name}/binding",
        json={
            "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(allocation)}},
            "target": {"kind": "Node", "name": node},
        },
    )
    assert bound.status_code == 201, bound.text
    return name, str(created.json()["metadata"]["uid"])


def main_container(host: dict[str, Any], uid: str) -> dict[str, Any] | None:
    ids = docker(host["host"], "ps", "-aq", "--filter", f"label=tessera.io/pod-uid={uid}").split()
    for found in ids:
        shown = docker(host["host"], "inspect", found, check=False)
        for info in json.loads(shown) if shown.strip() else []:
            if info["Config"]["Labels"].get("tessera.io/container") == "main":
                return dict(info)
    return None


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
    _, uid = create_pod(
        gpu_host, 2, {"nvidia.com/gpu": 1}, {"memoryMiB": 81920, "corePercent": 100}
    )
    made = until(lambda: main_container(gpu_host, uid), timeout=60, what="the pod's container")
    (request,) = made["HostConfig"].get("DeviceRequests")
    assert request["Driver"] == "nvidia" and request["Capabilities"] == [["gpu"]]
    assert request["DeviceIDs"] == [UUIDS[2]]  # the GPU bound, by its UUID, not its index


@pytest.fixture(scope="module")
def mps_host(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The same host whose MPS control daemon is a busybox stand-in (no GPU, no NVIDIA
    runtime here: no device requests)."""
    with running_host(
        docker_host,
        database_url,
        tmp_path_factory.mktemp("mps-host"),
        TESSERA_AGENT_NVIDIA_RUNTIME="false",
        TESSERA_AGENT_MPS_IMAGE=BUSYBOX,
        TESSERA_AGENT_MPS_COMMAND='["sleep", "3600"]',
    ) as host:
        yield host


def daemons(host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The node's MPS control daemons that run, by GPU."""
    ids = docker(
        host["host"], "ps", "-q", "--filter", f"label=tessera.io/mps-node={host['node']}"
    ).split()
    found: dict[str, dict[str, Any]] = {}
    for container in ids:
        shown = docker(host["host"], "inspect", container, check=False)
        for info in json.loads(shown) if shown.strip() else []:
            if info["State"]["Running"]:
                found.setdefault(info["Config"]["Labels"]["tessera.io/mps-gpu"], info)
    return found


def test_one_mps_daemon_per_shared_gpu_from_its_first_slice_to_its_last(
    mps_host: dict[str, Any],
) -> None:
    admin, namespace = mps_host["admin"], mps_host["namespace"]
    slice_limits = {"tessera.io/gpu-memory": "20Gi", "tessera.io/gpu-core": "25"}
    share = {"memoryMiB": 20480, "corePercent": 25}
    pods = [create_pod(mps_host, gpu, slice_limits, share) for gpu in (1, 1, 3)]
    made = [
        until(lambda uid=uid: main_container(mps_host, uid), timeout=90, what="a slice's container")
        for _, uid in pods
    ]
    running = daemons(mps_host)
    assert set(running) == {UUIDS[1], UUIDS[3]}  # one per shared GPU, not one per slice
    daemon = running[UUIDS[1]]
    assert f"CUDA_VISIBLE_DEVICES={UUIDS[1]}" in daemon["Config"]["Env"]
    assert daemon["Config"]["Cmd"] == ["3600"] and daemon["Config"]["Entrypoint"] == ["sleep"]
    pipe = next(m for m in daemon["Mounts"] if m["Destination"] == "/tmp/nvidia-mps")
    for container in made[:2]:  # the slices of GPU 1 share its daemon's pipe directory
        mounts = {m["Destination"]: m.get("Name") for m in container["Mounts"]}
        assert mounts["/tmp/nvidia-mps"] == pipe["Name"]
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in container["Config"]["Env"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in container["Config"]["Env"]
    third = {m["Destination"]: m.get("Name") for m in made[2]["Mounts"]}
    assert third["/tmp/nvidia-mps"] != pipe["Name"]

    def delete(name: str) -> None:
        gone = admin.delete(
            f"/api/v1/namespaces/{namespace}/pods/{name}", params={"gracePeriodSeconds": 0}
        )
        assert gone.status_code in (200, 202), gone.text

    delete(pods[0][0])
    until(lambda: main_container(mps_host, pods[0][1]) is None, timeout=60, what="A removed")
    assert set(daemons(mps_host)) == {UUIDS[1], UUIDS[3]}  # B still uses GPU 1's daemon
    delete(pods[1][0])
    until(
        lambda: set(daemons(mps_host)) == {UUIDS[3]},
        timeout=60,
        what="GPU 1's daemon stopped after its last slice",
    )
    delete(pods[2][0])
    until(lambda: not daemons(mps_host), timeout=60, what="GPU 3's daemon stopped")


def test_a_restarted_agent_stops_the_daemon_after_the_slices_it_resumed(
    mps_host: dict[str, Any],
) -> None:
    limits = {"tessera.io/gpu-memory": "20Gi", "tessera.io/gpu-core": "25"}
    name, uid = create_pod(mps_host, 0, limits, {"memoryMiB": 20480, "corePercent": 25})
    until(lambda: main_container(mps_host, uid), timeout=90, what="the slice's container")
    until(lambda: UUIDS[0] in daemons(mps_host), timeout=30, what="GPU 0's daemon")
    mps_host["restart_agent"]()
    until(
        lambda: "to resume" in mps_host["agent_log"](),
        timeout=60,
        what="the new agent finding the slice's containers",
    )
    assert UUIDS[0] in daemons(mps_host)  # kept: the slice still runs
    gone = mps_host["admin"].delete(
        f"/api/v1/namespaces/{mps_host['namespace']}/pods/{name}",
        params={"gracePeriodSeconds": 0},
    )
    assert gone.status_code in (200, 202), gone.text
    until(
        lambda: UUIDS[0] not in daemons(mps_host),
        timeout=60,
        what="GPU 0's daemon stopped after the slice the restarted agent resumed",
    )


@pytest.fixture(scope="module")
def mps_unavailable_host(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The same host whose MPS control daemon's image cannot be had (no registry answers)."""
    with running_host(
        docker_host,
        database_url,
        tmp_path_factory.mktemp("mps-unavailable"),
        TESSERA_AGENT_NVIDIA_RUNTIME="false",
        TESSERA_AGENT_MPS_IMAGE="127.0.0.1:1/tessera-test/no-such-mps:1",
    ) as host:
        yield host


def test_a_slice_waits_with_the_reason_when_its_daemon_cannot_start(
    mps_unavailable_host: dict[str, Any],
) -> None:
    host = mps_unavailable_host
    limits = {"tessera.io/gpu-memory": "20Gi", "tessera.io/gpu-core": "25"}
    name, uid = create_pod(host, 0, limits, {"memoryMiB": 20480, "corePercent": 25})
    path = f"/api/v1/namespaces/{host['namespace']}/pods/{name}"

    def waiting() -> dict[str, Any] | None:
        statuses = host["admin"].get(path).json()["status"].get("containerStatuses") or []
        state = (statuses[0]["state"].get("waiting") or {}) if statuses else {}
        return state if state.get("reason") == "CreateContainerConfigError" else None

    state = until(waiting, timeout=60, what="the slice waiting for its daemon")
    assert f"the MPS control daemon of GPU {UUIDS[0]} did not start" in state["message"]
    assert not daemons(host) and main_container(host, uid) is None  # nothing ran without it
