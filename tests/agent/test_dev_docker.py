"""`tessera dev` with and without a Docker engine: with one, the host is a node run by the docker
runtime beside the virtual demo pool, and a newcomer's `kubectl run` with the runtime's
nodeSelector runs for real (its output, its exit code); without one, dev starts all the same and
says so.

The engine is needed: without one these tests skip, or fail when CI is set."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, unique
from tests.e2e.conftest import KUBECTL
from tests.engine import BUSYBOX, docker
from tests.test_dev_server import DevServer

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
SELECT_DOCKER = '{"spec":{"nodeSelector":{"tessera.io/runtime":"docker"}}}'


def kubectl(server: DevServer, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(server.data_dir / "kubeconfig-demo"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not check or done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def dev_with_docker(
    docker_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DevServer]:
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    monkeypatch.delenv("TESSERA_AGENT_RUNTIME", raising=False)
    server = DevServer(tmp_path / "data", free_port())
    server.start()
    yield server
    server.stop()


def remove_containers(host: str, pod: str) -> None:
    ids = docker(host, "ps", "-aq", "--filter", f"label=tessera.io/pod-name={pod}").split()
    if ids:
        docker(host, "rm", "-f", *ids)


def test_dev_adds_the_host_as_a_docker_node_and_a_pod_runs_for_real(
    dev_with_docker: DevServer, docker_host: str
) -> None:
    server = dev_with_docker
    assert "docker:  docker-" in server.output and "TESSERA_AGENT_RUNTIME=virtual" in server.output
    name = unique("hi-")
    try:
        _run_hello(server, name)
    finally:
        remove_containers(docker_host, name)


def _run_hello(server: DevServer, name: str) -> None:
    # the label is set by the node's agent when it starts
    deadline = time.monotonic() + 30
    while not kubectl(server, "get", "nodes", "-l", "tessera.io/runtime=docker", "-o", "name"):
        assert time.monotonic() < deadline, "no node labelled tessera.io/runtime=docker"
        time.sleep(0.3)
    assert kubectl(server, "get", "nodes", "-l", "tessera.io/runtime=virtual", "-o", "name")
    kubectl(
        server,
        "run",
        name,
        f"--image={BUSYBOX}",
        "--restart=Never",
        f"--overrides={SELECT_DOCKER}",
        "--",
        "sh",
        "-c",
        "echo hello; exit 3",
    )
    pod: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while pod.get("status", {}).get("phase") != "Failed":
        assert time.monotonic() < deadline, pod.get("status")
        time.sleep(0.3)
        pod = json.loads(kubectl(server, "get", "pod", name, "-o", "json"))
    assert pod["spec"]["nodeName"].startswith("docker-")
    ended = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert ended["exitCode"] == 3 and ended["reason"] == "Error", ended
    assert kubectl(server, "logs", name) == "hello\n"


def test_dev_without_a_docker_engine_runs_the_virtual_pool_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv("TESSERA_AGENT_RUNTIME", raising=False)
    server = DevServer(tmp_path / "data", free_port())
    server.start()
    try:
        assert "docker:  none (no Docker engine answers" in server.output, server.output
        assert (
            kubectl(server, "get", "nodes", "-l", "tessera.io/runtime=docker", "-o", "name") == ""
        )
        assert kubectl(server, "get", "nodes", "-o", "name").count("node/") >= 2
    finally:
        server.stop()
