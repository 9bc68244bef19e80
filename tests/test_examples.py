"""The examples the README names, applied with the real kubectl to what `make run` starts (a
real `tessera dev` with the demo pool), through their whole life: created, running, deleted
with `kubectl delete -f` (exit 0, in the order kubectl deletes: a gang's group first)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, free_port
from tests.test_dev_server import DevServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo tenant's kubeconfig of a running `tessera dev`."""
    if KUBECTL is None:
        if IN_CI:
            pytest.fail("kubectl is not installed: CI must run the examples with it")
        pytest.skip("kubectl is not installed")
    server = DevServer(tmp_path_factory.mktemp("examples") / "data", free_port())
    server.start()
    yield server.data_dir / "kubeconfig-demo"
    server.stop()


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def phases(kubeconfig: Path, names: list[str]) -> dict[str, str]:
    out = kubectl(kubeconfig, "get", "pods", "-o", "json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    return {
        p["metadata"]["name"]: p["status"]["phase"] for p in items if p["metadata"]["name"] in names
    }


def versions(kubeconfig: Path, names: list[str]) -> dict[str, str]:
    out = kubectl(kubeconfig, "get", "pods", "-o", "json")
    items = json.loads(out.stdout)["items"]
    return {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in items
        if p["metadata"]["name"] in names
    }


def wait_running(kubeconfig: Path, names: list[str]) -> None:
    deadline = time.monotonic() + 30
    while set((seen := phases(kubeconfig, names)).values()) != {"Running"} or len(seen) != len(
        names
    ):
        assert time.monotonic() < deadline, f"not all running: {seen}"
        time.sleep(0.3)


@pytest.mark.parametrize(
    ("example", "pods"),
    [
        ("gpu-slice-pod.yaml", ["infer"]),
        ("whole-gpu-pod.yaml", ["train"]),
        ("gang.yaml", ["train-0", "train-1", "train-2", "train-3"]),
        ("configmap-and-secret.yaml", ["app"]),
    ],
)
def test_a_pod_example_runs_and_goes_with_kubectl_delete_f(
    demo: Path, example: str, pods: list[str]
) -> None:
    path = str(EXAMPLES / example)
    applied = kubectl(demo, "apply", "-f", path)
    assert applied.returncode == 0, applied.stderr
    wait_running(demo, pods)
    # Applied again, unchanged, it changes nothing (kubectl may still send a patch: a quantity
    # written as a number, 2, is the quantity "2" the server returns).
    before = versions(demo, pods)
    again = kubectl(demo, "apply", "-f", path)
    assert again.returncode == 0, again.stderr
    assert versions(demo, pods) == before
    deleted = kubectl(demo, "delete", "-f", path, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    deadline = time.monotonic() + 30
    while phases(demo, pods):
        assert time.monotonic() < deadline, phases(demo, pods)
        time.sleep(0.3)


def test_the_commitment_example_makes_the_tenants_plan(demo: Path) -> None:
    applied = kubectl(demo, "apply", "-f", str(EXAMPLES / "commitment.yaml"))
    assert applied.returncode == 0, applied.stderr
    plan = json.loads(kubectl(demo, "get", "commitments", "plan", "-o", "json").stdout)
    assert plan["spec"]["amountPerDay"].startswith("20")
    assert plan["status"]["nextChange"]  # a new plan starts at the next UTC day
    assert kubectl(demo, "delete", "-f", str(EXAMPLES / "commitment.yaml")).returncode == 0


def test_the_deployment_example_rolls_out_and_goes_with_kubectl_delete_f(demo: Path) -> None:
    path = str(EXAMPLES / "deployment.yaml")
    applied = kubectl(demo, "apply", "-f", path)
    assert applied.returncode == 0, applied.stderr
    rolled = kubectl(demo, "rollout", "status", "deploy/web", "--timeout=60s")
    assert rolled.returncode == 0, rolled.stderr + rolled.stdout
    pods = json.loads(kubectl(demo, "get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    assert len(pods) == 3 and {p["status"]["phase"] for p in pods} == {"Running"}
    image = kubectl(demo, "set", "image", "deploy/web", "web=nginx:1.27")
    assert image.returncode == 0, image.stderr
    rolled = kubectl(demo, "rollout", "status", "deploy/web", "--timeout=60s")
    assert rolled.returncode == 0, rolled.stderr + rolled.stdout
    history = kubectl(demo, "rollout", "history", "deploy/web")
    assert history.returncode == 0 and "2" in history.stdout.split(), history.stdout
    deleted = kubectl(demo, "delete", "-f", path, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    deadline = time.monotonic() + 30
    while kubectl(demo, "get", "pods", "-l", "app=web", "-o", "name").stdout.strip():
        assert time.monotonic() < deadline, "the Deployment's pods are still there"
        time.sleep(0.3)
