"""`tessera dev` (what `make run` starts) as a real process over HTTPS, with the scheduler and
the node agent inside it.

It migrates, seeds the demo pool and tenant, writes kubeconfigs carrying the CA and a token, and
keeps all of it across a restart.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.factories import pod

TESSERA = str(Path(sys.executable).with_name("tessera"))


class DevServer:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir, self.port = data_dir, port
        self.process: subprocess.Popen[str] | None = None
        self.output = ""

    def start(self) -> None:
        env = {**os.environ, "TESSERA_DATA_DIR": str(self.data_dir), "TESSERA_PORT": str(self.port)}
        env.pop("TESSERA_DATABASE_URL", None)
        self.log = self.data_dir.parent / "dev.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [TESSERA, "dev"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            if (self.data_dir / "tls" / "ca.crt").exists():
                try:
                    if (
                        httpx.get(
                            f"https://127.0.0.1:{self.port}/readyz",
                            verify=ssl.create_default_context(
                                cafile=str(self.data_dir / "tls" / "ca.crt")
                            ),
                            timeout=1,
                        ).status_code
                        == 200
                    ):
                        self.output = self.log.read_text()
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise AssertionError("tessera dev did not become ready: " + self.log.read_text())

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[DevServer]:
    server = DevServer(tmp_path / "data", free_port())
    server.start()
    yield server
    server.stop()
    # every stop ends its connections, however late their TLS handshake ended
    assert "graceful shutdown exceeded" not in server.log.read_text()


def client_from(kubeconfig: Path) -> httpx.Client:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    ca = kubeconfig.with_suffix(".ca")
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    token = config["users"][0]["user"]["token"]
    return httpx.Client(
        base_url=cluster["server"],
        verify=ssl.create_default_context(cafile=str(ca)),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_dev_serves_https_with_a_ready_kubeconfig_and_keeps_data(dev: DevServer) -> None:
    demo_config = dev.data_dir / "kubeconfig-demo"
    admin_config = dev.data_dir / "kubeconfig-admin"
    assert (
        str(demo_config) in dev.output
        and "tsr_" in dev.output
        and "export KUBECONFIG=" in dev.output
    )
    assert oct(demo_config.stat().st_mode & 0o777) == "0o600"
    demo, admin = client_from(demo_config), client_from(admin_config)
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
        httpx.get(f"http://127.0.0.1:{dev.port}/version", timeout=2)

    nodes = demo.get("/api/v1/nodes").json()["items"]
    gpus = demo.get("/apis/tessera.io/v1/gpudevices").json()["items"]
    assert len(gpus) == 512 and {g["spec"]["model"] for g in gpus} == {"H200"}
    assert len([n for n in nodes if "nvidia.com/gpu" in n["status"]["capacity"]]) == 64

    created = demo.post(
        "/api/v1/namespaces/demo/pods",
        json=pod("kept", cpu="2", memory="3.5Gi", gpu_memory="20Gi", gpu_core=25),
    )
    assert created.status_code == 201, created.text
    assert created.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"

    # The embedded scheduler places it and the embedded agent starts it.
    deadline = time.monotonic() + 20
    while (current := demo.get("/api/v1/namespaces/demo/pods/kept").json())["status"][
        "phase"
    ] != "Running":
        assert time.monotonic() < deadline, (
            f"the pod was not scheduled and started: {current['status']}"
        )
        time.sleep(0.2)
    node = current["spec"]["nodeName"]
    # It runs on the virtual node agent (the demo pool's, in the process): the node holds a
    # lease in kube-node-lease and the container status is the agent's.
    lease = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
    assert lease.status_code == 200 and lease.json()["spec"]["holderIdentity"] == node
    assert current["status"]["containerStatuses"][0]["containerID"].startswith("virtual://")
    held = [
        g
        for g in admin.get("/apis/tessera.io/v1/gpudevices").json()["items"]
        if g["status"]["pods"]
    ]
    assert [(g["spec"]["nodeName"], g["status"]["free"]) for g in held] == [
        (node, {"memory": "121Gi", "corePercent": 75})
    ]
    # the demo price list is in effect, so the running pod costs money
    (price,) = demo.get("/apis/billing.tessera.io/v1/prices").json()["items"]
    assert price["metadata"]["name"] == "demo-2026" and price["status"]["phase"] == "Active"
    time.sleep(1.1)
    usage = demo.get("/apis/billing.tessera.io/v1/namespaces/demo/usage").json()
    assert Decimal(usage["total"]["amount"]) > 0, usage

    # A kubeconfig made in another terminal, where TESSERA_PORT is not set, points at the
    # server that is running on this data directory (not at the default port)...
    other_terminal = {**os.environ, "TESSERA_DATA_DIR": str(dev.data_dir)}
    for key in ("TESSERA_PORT", "TESSERA_DATABASE_URL", "TESSERA_PUBLIC_URL"):
        other_terminal.pop(key, None)
    made = dev.data_dir.parent / "acme.kubeconfig"

    def make_kubeconfig(env: dict[str, str]) -> str:
        done = subprocess.run(
            [TESSERA, "kubeconfig", "--tenant", "demo", "--out", str(made)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"https://127.0.0.1:{dev.port}" in done.stdout or "8443" in done.stdout
        return str(yaml.safe_load(made.read_text())["clusters"][0]["cluster"]["server"])

    assert make_kubeconfig(other_terminal) == f"https://127.0.0.1:{dev.port}"
    assert client_from(made).get("/api/v1/namespaces/demo/pods").status_code == 200
    # ...while a port set in that terminal still wins
    assert make_kubeconfig({**other_terminal, "TESSERA_PORT": "8443"}) == "https://127.0.0.1:8443"

    dev.stop()
    # Start and stop were quiet: the embedded agents waited for the server to listen (rather
    # than fail once per node), their requests are not logged one by one, and the stop ended
    # their watches instead of cancelling them at the graceful timeout.
    log = dev.log.read_text()
    for noise in (
        "Traceback",
        "graceful shutdown exceeded",
        "All connection attempts failed",
        "HTTP Request:",
    ):
        assert noise not in log, log[-3000:]
    # once it has stopped, nothing claims to be running there
    assert make_kubeconfig(other_terminal) == "https://127.0.0.1:8443"
    dev.start()
    assert "tsr_" in dev.output
    again = client_from(demo_config)  # the same kubeconfig still works after a restart
    kept = again.get("/api/v1/namespaces/demo/pods/kept")
    assert kept.status_code == 200 and kept.json()["status"]["phase"] == "Running"
    # the node tokens of the first start still work: the agents take up their pods again
    inventory = yaml.safe_load((dev.data_dir / "virtual-nodes.yaml").read_text())
    assert len(inventory["nodes"]) == len(nodes) and inventory["nodes"][0]["token"].startswith(
        "tsr_"
    )
    assert oct((dev.data_dir / "virtual-nodes.yaml").stat().st_mode & 0o777) == "0o600"
    assert len(again.get("/apis/tessera.io/v1/gpudevices").json()["items"]) == 512
    assert again.get("/apis/billing.tessera.io/v1/prices").json()["items"] == [price]
