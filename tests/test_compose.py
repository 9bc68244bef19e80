"""docker-compose.yml describes the production stack; no Docker engine runs here, so this checks
the file and then runs the very commands it gives each Tessera service, with its environment,
against the real PostgreSQL and Redis of the test machine."""

from __future__ import annotations

import os
import shlex
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
import yaml
from sqlalchemy.engine import make_url

from app.cli import cli
from tests.conftest import REDIS_URL, drop_postgres_database, free_port, fresh_postgres_database

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
TESSERA_SERVICES = [name for name, s in SERVICES.items() if s.get("build") == "."]
TESSERA = str(Path(sys.executable).with_name("tessera"))


def test_the_stack_has_what_production_needs() -> None:
    assert {"postgres", "redis", "migrate", "api", "scheduler", "agent", "node-agent"} <= (
        SERVICES.keys()
    )
    assert set(TESSERA_SERVICES) == {"migrate", "api", "scheduler", "agent", "node-agent"}
    assert (ROOT / "Dockerfile").exists()
    assert SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "scheduler", "agent", "node-agent"):
        assert (
            SERVICES[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )
    # The node agents speak only the API, over its TLS, once it is up.
    node_agent = SERVICES["node-agent"]
    assert node_agent["depends_on"]["api"]["condition"] == "service_healthy"
    assert node_agent["environment"]["TESSERA_AGENT_SERVER"] == "https://api:8443"
    assert "api" in SERVICES["api"]["environment"]["TESSERA_TLS_EXTRA_SANS"]
    assert "--workers" in SERVICES["api"]["command"]
    assert int(SERVICES["api"]["command"][SERVICES["api"]["command"].index("--workers") + 1]) > 1


@pytest.mark.parametrize("service", TESSERA_SERVICES)
def test_each_command_is_a_real_tessera_subcommand(service: str) -> None:
    command = SERVICES[service]["command"]
    group = typer.main.get_command(cli)
    subcommand = group.commands.get(command[0])  # type: ignore[attr-defined]
    assert subcommand is not None, f"{service}: `tessera {command[0]}` does not exist"
    options = {opt for param in subcommand.params for opt in param.opts}
    for word in command[1:]:
        if word.startswith("--"):
            assert word in options, f"{service}: `tessera {command[0]}` has no option {word}"


@pytest.mark.parametrize("service", TESSERA_SERVICES)
def test_each_service_gets_the_environment_it_needs(service: str) -> None:
    env = SERVICES[service]["environment"]
    database = make_url(env["TESSERA_DATABASE_URL"])
    assert database.drivername == "postgresql+psycopg" and database.host == "postgres"
    assert database.username == SERVICES["postgres"]["environment"]["POSTGRES_USER"]
    assert database.database == SERVICES["postgres"]["environment"]["POSTGRES_DB"]
    assert env["TESSERA_REDIS_URL"].startswith("redis://redis:")
    assert env["TESSERA_DATA_DIR"] == "/data"


def localised(env: dict[str, str], database_url: str, data_dir: Path) -> dict[str, str]:
    """The service's environment, pointed at this machine's PostgreSQL and Redis."""
    return {
        **os.environ,
        **{k: str(v) for k, v in env.items()},
        "TESSERA_DATABASE_URL": database_url,
        "TESSERA_REDIS_URL": REDIS_URL,
        "TESSERA_DATA_DIR": str(data_dir),
        # the test's receiver listens on this machine's loopback
        "TESSERA_CALLBACK_ALLOWED_DESTINATIONS": "127.0.0.0/8",
    }


def _eventually(read: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except (OSError, httpx.HTTPError):
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_the_commands_run_against_real_postgres_and_redis(tmp_path: Path) -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        from tests.conftest import unavailable

        unavailable("Redis", str(exc))
    url, name = fresh_postgres_database()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        migrate = SERVICES["migrate"]
        done = subprocess.run(
            [TESSERA, *migrate["command"]],
            env=localised(migrate["environment"], url, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "latest schema" in done.stdout

        api = SERVICES["api"]
        command = list(api["command"])
        port = free_port()
        command[command.index("--port") + 1] = str(port)
        # A node for the node agents to act for (the operator loads the pool).
        node = tmp_path / "pool.yaml"
        node.write_text(
            "nodeClasses: {c: {cpu: 8, memory: 32Gi}}\n"
            "regions: [{name: r, zones: [{name: z, racks: [{name: k, nodes: {c: 1}}]}]}]\n"
        )
        loaded = subprocess.run(
            [TESSERA, "inventory", "load", str(node)],
            env=localised(migrate["environment"], url, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert loaded.returncode == 0, loaded.stderr
        agent_env = {
            **SERVICES["node-agent"]["environment"],
            "TESSERA_AGENT_SERVER": f"https://127.0.0.1:{port}",
            "TESSERA_AGENT_CA_CERT": str(tmp_path / "tls" / "ca.crt"),
        }
        for service, argv, env in (
            ("api", command, SERVICES["api"]["environment"]),
            ("scheduler", SERVICES["scheduler"]["command"], SERVICES["scheduler"]["environment"]),
            ("agent", SERVICES["agent"]["command"], SERVICES["agent"]["environment"]),
        ):
            log = (tmp_path / f"{service}.log").open("w")
            processes.append(
                subprocess.Popen(
                    [TESSERA, *argv],
                    env=localised(env, url, tmp_path),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        ca = tmp_path / "tls" / "ca.crt"
        deadline = time.monotonic() + 120  # four API workers start slowly on a busy machine
        while True:
            assert all(p.poll() is None for p in processes), {
                s: (tmp_path / f"{s}.log").read_text() for s in ("api", "scheduler", "agent")
            }
            if ca.exists():
                try:
                    if httpx.get(
                        f"https://127.0.0.1:{port}/readyz",
                        verify=ssl.create_default_context(cafile=str(ca)),
                        timeout=1,
                    ).is_success:
                        break
                except httpx.HTTPError:
                    pass
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
            time.sleep(0.2)
        # As compose starts it: once the API is healthy.
        with (tmp_path / "node-agent.log").open("w") as log:
            processes.append(
                subprocess.Popen(
                    [TESSERA, *SERVICES["node-agent"]["command"]],
                    env=localised(agent_env, url, tmp_path),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        inventory = yaml.safe_load(
            _eventually(lambda: (tmp_path / "virtual-nodes.yaml").read_text())
        )
        (entry,) = inventory["nodes"]
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{entry['name']}"
        verify = ssl.create_default_context(cafile=str(ca))
        headers = {"Authorization": f"Bearer {entry['token']}"}
        _eventually(
            lambda: httpx.get(
                f"https://127.0.0.1:{port}{lease}", headers=headers, verify=verify
            ).raise_for_status()
        )
        services = ("api", "scheduler", "agent", "node-agent")
        for process, service in zip(processes, services, strict=True):
            assert process.poll() is None, (
                f"{service} exited: {(tmp_path / f'{service}.log').read_text()}"
            )
            assert "Traceback" not in (tmp_path / f"{service}.log").read_text(), shlex.join(
                SERVICES[service]["command"]
            )
        delivered_once_by_the_api_workers(url, f"https://127.0.0.1:{port}", ca)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
        drop_postgres_database(name)


def delivered_once_by_the_api_workers(database_url: str, api_url: str, ca: Path) -> None:
    """The stack's API processes (four workers) send a callback delivery emitted by another
    process (here: this one, as the scheduler or the agent would), exactly once."""
    from app.auth import service as auth
    from app.callbacks import service as callbacks
    from app.db.engine import Database
    from app.kube.meta import now
    from tests.receiver import Receiver

    db = Database(database_url)
    try:
        db.write(lambda s: auth.create_tenant(s, name="acme"))
        token = db.write(lambda s: auth.create_token(s, role="tenant", tenant="acme")).value
        api = httpx.Client(
            base_url=api_url,
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=str(ca)),
            timeout=10,
        )
        base = "/apis/tessera.io/v1/namespaces/acme/callbacks"
        with Receiver() as receiver:
            created = api.post(
                base,
                json={
                    "metadata": {"name": "hook"},
                    "spec": {"url": receiver.url(), "events": ["PodFinished"]},
                },
            )
            assert created.status_code == 201, created.text
            tenant_id = db.read(lambda s: auth.get_tenant(s, "acme").id)
            db.write(
                lambda s: callbacks.emit(
                    s,
                    tenant_id=tenant_id,
                    namespace="acme",
                    type="PodFinished",
                    subject="namespaces/acme/pods/job",
                    data={"phase": "Succeeded"},
                    at=now(),
                )
            )
            (got,) = receiver.wait_for(1, timeout=20)
            deadline = time.monotonic() + 20
            while (items := api.get(f"{base}/hook/deliveries").json()["items"])[0][
                "phase"
            ] != "Delivered":
                assert time.monotonic() < deadline, items
                time.sleep(0.1)
            assert items[0]["attempts"] == 1 and items[0]["eventId"] == got.event["id"]
            assert len(receiver.requests) == 1
    finally:
        db.dispose()
