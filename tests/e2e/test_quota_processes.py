"""A quota is exact when the creates that race for it are served by several API processes
(`tessera serve --workers 3`): on PostgreSQL no lock is shared by every writer, so a check
locks the quotas it counts against (app/quotas/service.py) and concurrent checks of one
namespace or tenant run one after the other, in whichever process."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import unique
from tests.e2e.conftest import Process, start_server, stop_server
from tests.factories import pod


@pytest.fixture(scope="module")
def three_workers(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    server = start_server(tmp_path_factory.mktemp("workers"), database_url, workers=3)
    yield server
    stop_server(server)


def _race(server: Process, token: str, path: str, bodies: list[dict]) -> list[int]:
    results: list[int] = []
    start = threading.Barrier(len(bodies))
    context = ssl.create_default_context(cafile=str(server.ca))

    def create(body: dict) -> None:
        # a connection of its own: the kernel hands connections to the three processes
        with httpx.Client(
            base_url=server.url, verify=context, headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ) as http:  # fmt: skip
            start.wait()
            results.append(http.post(path, json=body).status_code)

    threads = [threading.Thread(target=create, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(results)


def test_creates_served_by_three_processes_admit_exactly_the_quota(three_workers: Process) -> None:
    tenant = unique("qp")
    three_workers.create_tenant(tenant)
    token = three_workers.tenant_token(tenant)
    with three_workers.admin() as admin:
        for name, hard in (("pods", {"pods": "8"}), ("maps", {"count/configmaps": "5"})):
            made = admin.post(
                f"/api/v1/namespaces/{tenant}/resourcequotas",
                json={"metadata": {"name": name}, "spec": {"hard": hard}},
            )
            assert made.status_code == 201, made.text
    pods = [pod(f"race-{i}") for i in range(40)]
    assert _race(three_workers, token, f"/api/v1/namespaces/{tenant}/pods", pods) == (
        [201] * 8 + [403] * 32
    )
    maps = [{"metadata": {"name": f"c-{i}"}, "data": {"k": "v"}} for i in range(30)]
    assert _race(three_workers, token, f"/api/v1/namespaces/{tenant}/configmaps", maps) == (
        [201] * 5 + [403] * 25
    )
    with three_workers.admin() as admin:
        listed = admin.get(f"/api/v1/namespaces/{tenant}/pods").json()["items"]
        assert len(listed) == 8
        used = admin.get(f"/api/v1/namespaces/{tenant}/resourcequotas/pods").json()
        assert used["status"]["used"] == {"pods": "8"}


def test_tenant_quota_is_exact_across_processes(three_workers: Process) -> None:
    tenant = unique("qt")
    three_workers.create_tenant(tenant)
    with three_workers.admin() as admin:
        patched = admin.patch(
            f"/apis/tessera.io/v1/tenants/{tenant}",
            json={"spec": {"quota": {"hard": {"pods": "6"}}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
    token = three_workers.tenant_token(tenant)
    pods = [pod(f"t-{i}") for i in range(30)]
    assert _race(three_workers, token, f"/api/v1/namespaces/{tenant}/pods", pods) == (
        [201] * 6 + [403] * 24
    )
