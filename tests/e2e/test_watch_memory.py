"""Watches do not leak: a `tessera serve` process holds 200 watches of a 256-GPU pool at once
(each sends the whole pool first), they close, and again; its resident memory (read
from /proc) stays where the first round left it. On PostgreSQL, the production backend: the
stream code that could leak is the same on SQLite, and a run takes a minute, so once is enough."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import unique
from tests.e2e.conftest import Process, start_server, stop_server

WATCHES = 200
ROUNDS = 2
INVENTORY = """
nodeClasses:
  h100x8:
    cpu: 96
    memory: 1024Gi
    gpus: {model: H100, count: 8}
regions:
  - name: mem
    zones:
      - name: ZONE
        racks:
          - {name: r1, nodes: {h100x8: 32}}
"""


def resident_mib(process: Process) -> float:
    for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc")


async def hold_watches(server: Process, token: str, count: int, zone: str) -> list[int]:
    """Open `count` GPU watches at once, read each one's initial events, then close them all;
    returns how many GPUs each watch sent."""
    verify = ssl.create_default_context(cafile=str(server.ca))
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=server.url,
        verify=verify,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        limits=limits,
    ) as client:
        opened = asyncio.Event()
        ready: list[int] = []

        async def one() -> int:
            params = {"watch": "true", "labelSelector": f"topology.kubernetes.io/zone={zone}"}
            async with client.stream(
                "GET", "/apis/tessera.io/v1/gpudevices", params=params
            ) as response:
                assert response.status_code == 200, await response.aread()
                seen = 0
                async for line in response.aiter_lines():
                    if json.loads(line)["type"] == "ADDED":
                        seen += 1
                    if seen == 256:
                        break
                ready.append(seen)
                if len(ready) == count:
                    opened.set()
                await opened.wait()  # all are open together before any closes
                return seen

        return await asyncio.gather(*(one() for _ in range(count)))


@pytest.fixture
def server(fresh_database_url: str, tmp_path: Path):
    process = start_server(tmp_path, fresh_database_url, TESSERA_WATCH_MAX_PER_TENANT="1000")
    process.zone = unique("mem-")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("ZONE", process.zone))
    process.cli("inventory", "load", str(inventory))
    yield process
    stop_server(process)


@pytest.mark.parametrize("fresh_database_url", ["postgresql"], indirect=True)
def test_memory_returns_after_many_watches_close(server: Process) -> None:
    """Rounds of 200 watches: the first round may raise the process's high-water mark (the
    allocator keeps some heap); later rounds must not add to it, or watches leak."""
    tenant = unique("mem")
    server.create_tenant(tenant)
    token = server.tenant_token(tenant)
    asyncio.run(hold_watches(server, token, 20, server.zone))  # warm caches and pools
    before = resident_mib(server)
    after_rounds = []
    for _ in range(ROUNDS):
        sent = asyncio.run(hold_watches(server, token, WATCHES, server.zone))
        assert sent == [256] * WATCHES
        time.sleep(0.5)  # the last close hands the heap back
        after_rounds.append(resident_mib(server))
    shown = ", ".join(f"{r:.0f}" for r in after_rounds)
    print(f"resident MiB before: {before:.0f}; after each round of {WATCHES} watches: {shown}")
    assert after_rounds[-1] - after_rounds[0] < 12, (before, after_rounds)
    assert after_rounds[0] - before < 96, (before, after_rounds)
