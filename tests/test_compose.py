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
TESSERA_SERVICES = [name for name, s in SERVICES.items() if s.get("build", {}).get("context")]
TESSERA = str(Path(sys.executable).with_name("tessera"))
IMAGE_SOURCE = "/src/"  # where the Dockerfile puts the checkout's files (examples/)


def in_checkout(argv: list[str]) -> list[str]:
    """A service's command with the image's paths to shipped files made this checkout's."""
    return [
        str(ROOT / word.removeprefix(IMAGE_SOURCE)) if word.startswith(IMAGE_SOURCE) else word
        for word in argv
    ]


def test_the_stack_has_what_production_needs() -> None:
    assert {"postgres", "redis", "migrate", "api", "scheduler", "agent", "node-agent"} <= (
        SERVICES.keys()
    )
    assert set(TESSERA_SERVICES) == {
        "migrate",
        "api",
        "scheduler",
        "agent",
        "node-agent",
        "host-node",
    }
    assert (ROOT / "Dockerfile").exists()
    assert SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "scheduler", "agent", "node-agent", "host-node"):
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
    # A fresh stack rates usage and has nodes: the example price list and the demo pool, which
    # the image ships.
    migrate = SERVICES["migrate"]["command"]
    for option in ("--seed-prices", "--seed-nodes"):
        shipped = migrate[migrate.index(option) + 1]
        assert shipped.startswith(IMAGE_SOURCE) and Path(in_checkout([shipped])[0]).is_file()
    # The real node (docker runtime) is opt-in, with the engine's socket.
    host = SERVICES["host-node"]
    assert host["profiles"] == ["docker"]
    assert host["environment"]["TESSERA_AGENT_RUNTIME"] == "docker"
    assert any(v.endswith(":/var/run/docker.sock") for v in host["volumes"])


def test_ports_are_published_on_the_loopback_only() -> None:
    published = [(name, port) for name, s in SERVICES.items() for port in s.get("ports", [])]
    assert published, "the API must be reachable from the host"
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every address"


def test_the_image_ships_what_every_command_imports() -> None:
    """The Dockerfile copies every package `tessera` imports (only `bench`, which no command
    but `tessera bench` imports, stays out), and the agent's HTTP client is a runtime
    dependency."""
    import tomllib

    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = packages["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (p.rstrip("*") for p in included):
        if package != "bench":
            assert package in copied, f"the Dockerfile does not copy {package}/"
    runtime = " ".join(packages["project"]["dependencies"])
    for module in ("httpx", "yaml", "uvicorn", "psycopg"):
        assert (module if module != "yaml" else "pyyaml") in runtime
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, app.cli; print(sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "'bench" not in imported, "importing the CLI imports the benchmarks"


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
        "TESSERA_ALIVE_FILE": str(data_dir / "alive"),
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
            [TESSERA, *in_checkout(migrate["command"])],
            env=localised(migrate["environment"], url, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "latest schema" in done.stdout
        assert "loaded from" in done.stdout and "EXAMPLE price list" in done.stderr

        api = SERVICES["api"]
        command = list(api["command"])
        port = free_port()
        command[command.index("--port") + 1] = str(port)
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
        # The demo pool that migrate loaded, each node with its own token.
        assert len(inventory["nodes"]) == len({n["name"] for n in inventory["nodes"]}) > 1
        entry = inventory["nodes"][0]
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


def test_the_virtual_node_agents_leave_a_node_of_another_runtime_alone(tmp_path: Path) -> None:
    """`node-agent` (`tessera agent --virtual --issue-tokens`) issues tokens for the virtual
    nodes only: the host node, labelled for the docker runtime, has its own agent (host-node),
    and two agents acting for one node would report two truths about its pods."""
    from agent.main import load_inventory
    from app.bootstrap import bootstrap, seed_node_tokens
    from app.db.engine import Database
    from app.db.migrate import upgrade
    from app.inventory import service as inventory
    from app.settings import Settings

    url = f"sqlite:///{tmp_path / 'tessera.db'}"
    upgrade(url)
    db = Database(url)
    bootstrap(db)
    for name, labels in (("v1", {}), ("host-1", {"tessera.io/runtime": "docker"})):
        spec = inventory.NodeSpec(
            name=name,
            cpu_milli=4000,
            memory_mib=8192,
            compute_classes=("general-purpose",),
            labels=labels,
        )
        db.write(lambda s, spec=spec: inventory.create_node(s, spec))
    settings = Settings(data_dir=tmp_path, agent_server="https://api:8443")
    ca = tmp_path / "ca.crt"
    virtual = seed_node_tokens(db, settings, ca, path=tmp_path / "v.yaml", virtual_only=True)
    assert [n.name for n in load_inventory(virtual).nodes] == ["v1"]
    every = seed_node_tokens(db, settings, ca, path=tmp_path / "all.yaml")
    assert sorted(n.name for n in load_inventory(every).nodes) == ["host-1", "v1"]
    db.dispose()
