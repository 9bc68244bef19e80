"""Pod-create throughput and latency: N concurrent clients over HTTPS on loopback.

Starts a real `tessera serve` process on a fresh database (SQLite file or a new PostgreSQL
database), makes a tenant, then drives `POST /api/v1/namespaces/{ns}/pods` from N keep-alive
connections. The client is a minimal HTTP/1.1 writer/reader on asyncio streams so that it costs
the shared CPU as little as possible; it runs in this process while the server runs in its own.

    tessera bench api-create --database sqlite --clients 32 --requests 4000
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
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

DEMO_POOL = Path(__file__).resolve().parents[1] / "examples" / "demo-pool.yaml"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "", "labels": {"app": "bench"}},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/infer:1",
                "resources": {
                    "requests": {"cpu": "2", "memory": "3.5Gi"},
                    "limits": {"tessera.io/gpu-memory": "20Gi", "tessera.io/gpu-core": "25"},
                },
            }
        ]
    },
}


@dataclass
class Result:
    database: str
    workers: int
    clients: int
    requests: int
    errors: int
    first_error: str
    seconds: float
    creates_per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float


async def _client(
    host: str,
    port: int,
    context: ssl.SSLContext,
    path: str,
    token: str,
    names: list[str],
    latencies: list[float],
    errors: list[str],
) -> None:
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    try:
        for name in names:
            POD["metadata"]["name"] = name  # type: ignore[index]
            body = json.dumps(POD).encode()
            request = (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            started = time.perf_counter()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            payload = await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if b" 201 " not in status:
                errors.append(
                    f"{status.decode().strip()}: {payload[:300].decode(errors='replace')}"
                )
    finally:
        writer.close()


async def _drive(
    url_host: str, port: int, ca: Path, namespace: str, token: str, clients: int, requests: int
) -> tuple[list[float], list[str], float]:
    context = ssl.create_default_context(cafile=str(ca))
    path = f"/api/v1/namespaces/{namespace}/pods"
    latencies: list[float] = []
    errors: list[str] = []
    per_client = [[f"b{c}-{i}" for i in range(requests // clients)] for c in range(clients)]
    # warm-up: one request per connection path, not measured
    await _client(url_host, port, context, path, token, ["warmup"], [], [])
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _client(url_host, port, context, path, token, names, latencies, errors)
            for names in per_client
        )
    )
    return latencies, errors, time.perf_counter() - started


def measure(
    database: str, *, clients: int, requests: int, workers: int, postgres_url: str
) -> Result:
    """Start a server on a fresh database of kind `database` and measure creates."""
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
        load = [tessera, "inventory", "load", str(DEMO_POOL)]
        subprocess.run(load, env=env, check=True, capture_output=True)
        subprocess.run(
            [tessera, "tenant", "create", "bench"], env=env, check=True, capture_output=True
        )
        token = subprocess.run(
            [tessera, "token", "create", "--tenant", "bench"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        server = subprocess.Popen(
            [tessera, "serve", "--workers", str(workers)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ca = data / "tls" / "ca.crt"
            _wait_ready(port, ca)
            latencies, errors, seconds = asyncio.run(
                _drive("127.0.0.1", port, ca, "bench", token, clients, requests)
            )
        finally:
            server.terminate()
            server.wait(timeout=20)
            if drop:
                drop()
    ordered = sorted(latencies)
    return Result(
        database=database,
        workers=workers,
        clients=clients,
        requests=len(latencies),
        errors=len(errors),
        first_error=errors[0] if errors else "",
        seconds=round(seconds, 3),
        creates_per_second=round(len(latencies) / seconds, 1),
        p50_ms=round(statistics.median(ordered) * 1000, 2),
        p99_ms=round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        max_ms=round(ordered[-1] * 1000, 2),
    )


READY_SECONDS = 180.0


def _wait_ready(port: int, ca: Path) -> None:
    import httpx

    # a fresh database is migrated first: on a loaded two-core machine that took over a minute
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if ca.exists():
            try:
                context = ssl.create_default_context(cafile=str(ca))
                if httpx.get(
                    f"https://127.0.0.1:{port}/readyz", verify=context, timeout=1
                ).is_success:
                    return
            except (httpx.HTTPError, ssl.SSLError):
                pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready in {READY_SECONDS:g} s")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fresh_postgres(admin_url: str) -> tuple[str, Callable[[], None]]:
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(admin_url)
    conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"tessera_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return admin.set(database=name).render_as_string(hide_password=False), drop


def api_create(
    database: Annotated[
        str, typer.Option(help="sqlite, postgresql, or both (comma-separated).")
    ] = "sqlite,postgresql",
    clients: Annotated[int, typer.Option(help="Concurrent keep-alive connections.")] = 32,
    requests: Annotated[int, typer.Option(help="Pod creates in all.")] = 4000,
    workers: Annotated[int, typer.Option(help="API worker processes.")] = 1,
    postgres_url: Annotated[
        str, typer.Option(envvar="TESSERA_TEST_POSTGRES_URL")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    out: Annotated[
        Path | None, typer.Option(help="Write the figures as JSON here (a directory).")
    ] = None,
) -> None:
    """Pod creates per second and latency over HTTPS on loopback."""
    results = []
    for kind in database.split(","):
        typer.echo(
            f"measuring {requests} creates from {clients} clients on {kind} ({workers} worker(s))...",
            err=True,
        )
        result = measure(
            kind.strip(),
            clients=clients,
            requests=requests,
            workers=workers,
            postgres_url=postgres_url,
        )
        results.append(result)
        typer.echo(
            f"{result.database:<11} {result.creates_per_second:>8.1f} creates/s  p50 {result.p50_ms:.1f} ms  "
            f"p99 {result.p99_ms:.1f} ms  errors {result.errors} {result.first_error}"
        )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "api_create.json").write_text(
            json.dumps([asdict(r) for r in results], indent=2) + "\n"
        )
