"""Node heartbeats: N virtual nodes renewing their leases against a real `tessera serve`.

Starts a real server process (one API process) on a fresh database, registers N nodes with a
node token each (through the admin API), then renews every node's Lease every `interval`
seconds for `seconds` seconds with the agent's own client (agent/client.py: one conditional
PUT per renewal). It reports the API process's CPU seconds per heartbeat (from
/proc/PID/stat) and so how many nodes one API process sustains at the agent's default
10-second heartbeat on one core.

    tessera bench heartbeat --nodes 200 --interval 2 --seconds 20
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import httpx
import typer

from agent.client import NodeClient
from bench.api_create import _free_port, _fresh_postgres, _wait_ready

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DEFAULT_HEARTBEAT = 10.0  # the agent's default TESSERA_AGENT_HEARTBEAT_SECONDS


@dataclass
class Result:
    database: str
    nodes: int
    interval_s: float
    seconds: float
    heartbeats: int
    errors: int
    heartbeats_per_second: float
    api_cpu_seconds: float
    api_cpu_ms_per_heartbeat: float
    p50_ms: float
    p99_ms: float
    nodes_per_api_process_at_10s: int


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


async def _beat(
    clients: list[NodeClient], interval: float, seconds: float
) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def node(client: NodeClient, offset: float) -> None:
        nonlocal errors
        await asyncio.sleep(offset)  # spread the nodes over the interval, as real agents are
        while loop.time() < end:
            started = time.perf_counter()
            try:
                await client.renew(40)
                latencies.append(time.perf_counter() - started)
            except httpx.HTTPError:
                errors += 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))

    began = time.perf_counter()
    await asyncio.gather(*(node(c, interval * i / len(clients)) for i, c in enumerate(clients)))
    return latencies, errors, time.perf_counter() - began


async def _first_leases(clients: list[NodeClient]) -> None:
    for start in range(0, len(clients), 50):
        await asyncio.gather(*(c.renew(40) for c in clients[start : start + 50]))


def measure(
    database: str, *, nodes: int, interval: float, seconds: float, postgres_url: str
) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        drop: Callable[[], None] | None = None
        if database == "sqlite":
            url = f"sqlite:///{data / 'bench.db'}"
        else:
            url, drop = _fresh_postgres(postgres_url)
        port = _free_port()
        env = {
            **os.environ,
            "TESSERA_DATA_DIR": str(data),
            "TESSERA_DATABASE_URL": url,
            "TESSERA_PORT": str(port),
            "TESSERA_RATE_LIMIT_PER_SECOND": "0",
        }
        env.pop("TESSERA_REDIS_URL", None)
        tessera = str(Path(sys.executable).with_name("tessera"))
        subprocess.run([tessera, "migrate"], env=env, check=True, capture_output=True)
        admin_token = subprocess.run(
            [tessera, "token", "create", "--admin"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        server = subprocess.Popen(
            [tessera, "serve", "--workers", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ca = data / "tls" / "ca.crt"
            _wait_ready(port, ca)
            base = f"https://127.0.0.1:{port}"
            admin = httpx.Client(
                base_url=base,
                headers={"Authorization": f"Bearer {admin_token}"},
                verify=ssl.create_default_context(cafile=str(ca)),
                timeout=60,
            )
            clients = []
            for i in range(nodes):
                name = f"hb-{i:05d}"
                node = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name},
                    "status": {"capacity": {"cpu": "8", "memory": "32Gi"}},
                }
                admin.post("/api/v1/nodes", json=node).raise_for_status()
                made = admin.post(
                    "/apis/tessera.io/v1/nodetokens", json={"kind": "NodeToken", "node": name}
                )
                made.raise_for_status()
                clients.append(NodeClient(base, made.json()["token"], name, ca_cert=ca))

            async def run() -> tuple[list[float], int, float, float]:
                await _first_leases(clients)
                before = _cpu_seconds(server.pid)
                latencies, errors, took = await _beat(clients, interval, seconds)
                cpu = _cpu_seconds(server.pid) - before
                for c in clients:
                    await c.close()
                return latencies, errors, took, cpu

            latencies, errors, took, cpu = asyncio.run(run())
        finally:
            server.terminate()
            server.wait(timeout=20)
            if drop:
                drop()
    ordered = sorted(latencies) or [0.0]
    per_beat = cpu / max(len(latencies), 1)
    return Result(
        database=database,
        nodes=nodes,
        interval_s=interval,
        seconds=round(took, 2),
        heartbeats=len(latencies),
        errors=errors,
        heartbeats_per_second=round(len(latencies) / took, 1),
        api_cpu_seconds=round(cpu, 2),
        api_cpu_ms_per_heartbeat=round(per_beat * 1000, 2),
        p50_ms=round(statistics.median(ordered) * 1000, 1),
        p99_ms=round(ordered[max(int(len(ordered) * 0.99) - 1, 0)] * 1000, 1),
        nodes_per_api_process_at_10s=int(DEFAULT_HEARTBEAT / per_beat) if per_beat else 0,
    )


def main(
    database: Annotated[
        str, typer.Option(help="sqlite, postgresql, or both (comma-separated).")
    ] = "sqlite,postgresql",
    nodes: Annotated[int, typer.Option(min=1, max=20000, help="Virtual nodes.")] = 200,
    interval: Annotated[
        float, typer.Option(min=0.1, max=60, help="Seconds between one node's renewals.")
    ] = 2.0,
    seconds: Annotated[float, typer.Option(min=1, max=3600, help="How long to measure.")] = 20.0,
    postgres_url: Annotated[
        str, typer.Option(help="Where to create the PostgreSQL bench database.")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    out: Annotated[Path | None, typer.Option(help="Write the results here (JSON).")] = None,
) -> None:
    """Node heartbeats against a real API process: CPU per heartbeat, nodes per process."""
    results = []
    for kind in [d.strip() for d in database.split(",") if d.strip()]:
        typer.secho(f"{kind}: {nodes} nodes every {interval}s for {seconds}s", err=True)
        result = measure(
            kind, nodes=nodes, interval=interval, seconds=seconds, postgres_url=postgres_url
        )
        results.append(asdict(result))
        typer.echo(json.dumps(asdict(result)))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
