"""End-to-end fixtures: a real `tessera serve` process over HTTPS, the real `kubectl` binary,
and kubeconfigs: the admin's written by the real CLI (`tessera kubeconfig --admin`), tenants'
made through the admin API (a CLI call costs seconds of imports; dozens of tenants add up)."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import kubeconfig
from tests.conftest import IN_CI, free_port, unique

TESSERA = str(Path(sys.executable).with_name("tessera"))
KUBECTL = shutil.which("kubectl")

INVENTORY = """
nodeClasses:
  h100x8:
    cpu: 96
    memory: 1024Gi
    gpus: {model: H100, count: 8}
  cpu32:
    cpu: 32
    memory: 128Gi
regions:
  - name: e2e
    zones:
      - name: ZONE
        racks:
          - {name: r1, nodes: {h100x8: 2, cpu32: 1}}
"""


@dataclass
class Process:
    url: str
    data_dir: Path
    env: dict[str, str]
    zone: str
    process: subprocess.Popen[bytes]
    _admin_token: str | None = None

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [TESSERA, *args], env=self.env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def admin(self) -> httpx.Client:
        """An HTTPS client acting as the admin (its token issued once by the CLI)."""
        if self._admin_token is None:
            self._admin_token = self.cli("token", "create", "--admin")
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {self._admin_token}"},
            timeout=30,
        )

    def create_tenant(self, name: str) -> None:
        with self.admin() as http:
            made = http.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}})
        assert made.status_code == 201, made.text

    def tenant_token(self, tenant: str) -> str:
        with self.admin() as http:
            issued = http.post(f"/apis/tessera.io/v1/tenants/{tenant}/tokens", json={})
        assert issued.status_code == 201, issued.text
        return str(issued.json()["token"])

    def kubeconfig(self, tenant: str | None) -> Path:
        path = self.data_dir / f"{tenant or 'admin'}-{unique('k')}.kubeconfig"
        if tenant is None:
            self.cli("kubeconfig", "--admin", "--out", str(path))
            return path
        config = kubeconfig.build(
            server=self.url,
            ca_cert=self.ca,
            user=tenant,
            token=self.tenant_token(tenant),
            namespace=tenant,
        )
        return kubeconfig.write(path, config)

    @property
    def ca(self) -> Path:
        return self.data_dir / "tls" / "ca.crt"


def start_server(
    data_dir: Path, database_url: str, *, workers: int = 1, **extra_env: str
) -> Process:
    port = free_port()
    env = {
        **os.environ,
        "TESSERA_DATA_DIR": str(data_dir),
        "TESSERA_DATABASE_URL": database_url,
        "TESSERA_PORT": str(port),
        "TESSERA_AUTH_CACHE_SECONDS": "0",
        "TESSERA_RATE_LIMIT_PER_SECOND": "0",
        "TESSERA_WATCH_BOOKMARK_SECONDS": "1",
        "TESSERA_CALLBACK_ALLOWED_DESTINATIONS": "127.0.0.0/8,::1/128,localhost",  # receivers
        **extra_env,
    }
    if "TESSERA_REDIS_URL" not in extra_env:
        env.pop("TESSERA_REDIS_URL", None)
    with (data_dir / f"serve-{port}.log").open("w") as log:
        process = subprocess.Popen(
            [TESSERA, "serve", "--workers", str(workers)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    ca = data_dir / "tls" / "ca.crt"
    while True:
        assert process.poll() is None, (data_dir / f"serve-{port}.log").read_text()
        if ca.exists():
            try:
                if httpx.get(
                    f"{url}/readyz", verify=ssl.create_default_context(cafile=str(ca)), timeout=1
                ).is_success:
                    break
            except httpx.HTTPError:
                pass
        assert time.monotonic() < deadline, "tessera serve did not become ready"
        time.sleep(0.1)
    return Process(url, data_dir, env, "", process)


def race_creates(server: Process, token: str, posts: list[tuple[str, Any]]) -> list[int]:
    """POST each (path, body) at once, each from a connection of its own (the kernel spreads
    them over a server's worker processes); the answers' status codes, sorted."""
    results: list[int] = []
    start = threading.Barrier(len(posts))
    context = ssl.create_default_context(cafile=str(server.ca))

    def create(path: str, body: Any) -> None:
        with httpx.Client(
            base_url=server.url,
            verify=context,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ) as http:
            start.wait()
            results.append(http.post(path, json=body).status_code)

    threads = [threading.Thread(target=create, args=post) for post in posts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(results)


def stop_server(server: Process) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="session")
def tessera(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    data_dir = tmp_path_factory.mktemp("e2e")
    server = start_server(data_dir, database_url)
    server.zone = unique("zone-")
    inventory = data_dir / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("ZONE", server.zone))
    server.cli("inventory", "load", str(inventory))
    # The node agent runs bound pods and removes stopped ones, as in the production stack.
    with (data_dir / "agent.log").open("w") as log:
        agent = subprocess.Popen(
            [TESSERA, "agent", "--interval", "0.2"],
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    yield server
    agent.terminate()
    agent.wait(timeout=15)
    stop_server(server)


@pytest.fixture(scope="session")
def two_workers(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """`tessera serve --workers 2` on the session's database: the tests of what several API
    processes share (quotas admitted exactly, /metrics summed) share one."""
    server = start_server(tmp_path_factory.mktemp("two-workers"), database_url, workers=2)
    yield server
    stop_server(server)


@dataclass
class Kubectl:
    kubeconfig: Path
    namespace: str | None

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        done = subprocess.run(
            [KUBECTL, "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **env} if env else None,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}\n{done.stdout}\n{done.stderr}"
        return done

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout

    def fails(self, *args: str, stdin: str | None = None) -> str:
        done = self.run(*args, stdin=stdin, check=False)
        assert done.returncode != 0, f"kubectl {' '.join(args)} should have failed:\n{done.stdout}"
        return done.stderr


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    if KUBECTL is None:
        if IN_CI:
            pytest.fail("kubectl is not installed: CI must run the kubectl suite")
        pytest.skip("kubectl is not installed")
    return KUBECTL


@pytest.fixture
def tenant_kubectl(tessera: Process, kubectl_binary: str) -> Callable[[], Kubectl]:
    def make() -> Kubectl:
        name = unique("kc")
        tessera.create_tenant(name)
        return Kubectl(tessera.kubeconfig(name), name)

    return make


@pytest.fixture(scope="session")
def admin_kubectl(tessera: Process, kubectl_binary: str) -> Kubectl:
    return Kubectl(tessera.kubeconfig(None), None)
