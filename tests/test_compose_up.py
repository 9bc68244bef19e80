"""The production stack for real: the image built from this checkout, docker-compose.yml brought
up on a Docker engine, a tenant's pod made Running through kubectl, its usage rated, every
service stopped cleanly, everything removed.

No image registry is reachable from the machines the suite runs on, so what the stack runs is
built here: Tessera's image on a Python base made from Debian's packages with debootstrap
(tests/engine.py, once per engine), and stand-ins for the postgres and redis images from
Debian's packages (tests/compose/, through the override file tests/compose/standins.yml).
Stand-ins rather than the machine's own PostgreSQL and Redis: the compose file is then tested
as users run it, service names, healthchecks, `depends_on` conditions and volumes included.
The engine runs without iptables and without its default bridge (.ci/docker-engine); compose's
own network still resolves service names and publishes ports (through docker-proxy), so the
file needs no change for it. The image builds use the host's network (`--network host`) so that
pip and apt reach their indexes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import IN_CI, free_port
from tests.engine import ensure_python_base, images_lock

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "tests" / "compose"
IMAGE = "tessera-test/tessera:compose"
BUILDS = {  # image -> (Dockerfile, context)
    IMAGE: (ROOT / "Dockerfile", ROOT),
    "tessera-test/postgres:standin": (STANDINS / "postgres.Dockerfile", STANDINS),
    "tessera-test/redis:standin": (STANDINS / "redis.Dockerfile", STANDINS),
}
BUILT_HERE = "io.tessera.test=compose"  # a label on the images this test builds
STOP_SECONDS = 10.0  # docker stop's default timeout: past it, SIGKILL


def compose_command() -> list[str]:
    """Debian's docker-compose (1.29), or the `docker compose` plugin (v2)."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if plugin.returncode == 0:
        return ["docker", "compose"]
    message = "neither docker-compose nor the docker compose plugin is installed"
    if IN_CI:
        pytest.fail(f"{message}: CI installs Debian's docker-compose")
    pytest.skip(message)


def build_images(host: str) -> None:
    """The three images, built at once (each from its layer cache when nothing changed). One
    builder at a time: `.ci/run` begins them before the suite, and this waits for it."""
    with images_lock("compose"):
        _build_images(host)


def _build_images(host: str) -> None:
    base = ensure_python_base(host)
    env = {**os.environ, "DOCKER_HOST": host}
    builds = {
        image: subprocess.Popen(
            [
                "docker",
                "build",
                "-q",
                "--network",
                "host",
                "--build-arg",
                f"BASE={base}",
                "--label",
                BUILT_HERE,
                "-t",
                image,
                "-f",
                str(dockerfile),
                str(context),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for image, (dockerfile, context) in BUILDS.items()
    }
    for image, build in builds.items():
        output, _ = build.communicate(timeout=900)
        assert build.returncode == 0, f"building {image}:\n{output[-3000:]}"
    # The images these replaced (a tag moves to each new build): untagged, nothing uses them.
    subprocess.run(
        ["docker", "image", "prune", "--force", "--filter", f"label={BUILT_HERE}"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


class Stack:
    def __init__(self, host: str, port: int, tmp: Path) -> None:
        self.project = f"tessera-test-{uuid.uuid4().hex[:8]}"
        self.port, self.tmp = port, tmp
        self.env = {
            **os.environ,
            "DOCKER_HOST": host,
            "TESSERA_IMAGE": IMAGE,
            "TESSERA_HOST_PORT": str(port),
        }
        self.base = [
            *compose_command(),
            "--project-name",
            self.project,
            "--file",
            str(ROOT / "docker-compose.yml"),
            "--file",
            str(STANDINS / "standins.yml"),
        ]

    def __call__(self, *args: str, timeout: float = 240) -> str:
        done = subprocess.run(
            [*self.base, *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"compose {' '.join(args)}:\n{done.stderr}\n{self.logs()}"
        return done.stdout

    def logs(self) -> str:
        done = subprocess.run(
            [*self.base, "logs", "--no-color", "--tail", "40"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout[-8000:]

    def containers(self, service: str) -> list[str]:
        return self("ps", "-q", service).split()

    def inspect(self, container: str) -> dict:
        done = subprocess.run(
            ["docker", "inspect", container],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(done.stdout)[0]


def kubectl(config: Path, *args: str) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def images(docker_host: str) -> str:
    build_images(docker_host)
    return docker_host


def subcommands() -> list[list[str]]:
    """Every `tessera` command, subgroups' commands included."""
    import click
    import typer.main

    from app.cli import cli

    found: list[list[str]] = []

    def walk(group: click.Group, path: list[str]) -> None:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                walk(command, [*path, name])
            else:
                found.append([*path, name])

    walk(typer.main.get_command(cli), [])  # type: ignore[arg-type]
    return found


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a machine's first run builds the base and installs the dependencies
def test_every_command_starts_in_the_image(images: str) -> None:
    """What the image ships is what each command imports (a missing `agent/`, or `httpx` left a
    development dependency, failed every command once); `tessera bench` alone says it is not
    installed, since the image does not ship the benchmarks."""
    commands = [c for c in subcommands() if c != ["bench"]]
    assert len(commands) > 10
    script = "; ".join(
        f'tessera {" ".join(c)} --help >/dev/null 2>/tmp/err || {{ echo "{" ".join(c)}"; '
        "cat /tmp/err; exit 1; }"
        for c in commands
    )
    done = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", IMAGE, "-c", script],
        env={**os.environ, "DOCKER_HOST": images},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    bench = subprocess.run(
        ["docker", "run", "--rm", IMAGE, "bench", "--help"],
        env={**os.environ, "DOCKER_HOST": images},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bench.returncode == 1 and "the benchmarks are not installed here" in bench.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a machine's first run builds the base and installs the dependencies
def test_docker_compose_up_runs_a_pod_and_stops_cleanly(images: str, tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed") if IN_CI else pytest.skip("no kubectl")
    stack = Stack(images, free_port(), tmp_path)
    try:
        # `up` returns once every service has started, the node agent after the API is healthy.
        stack("up", "--detach", "--no-build")
        migrated = stack("logs", "--no-color", "migrate")
        assert "nodes: 88 loaded" in migrated and '"demo-2026" loaded' in migrated, migrated
        assert "EXAMPLE price list" in migrated  # said loudly: made-up rates
        assert len(stack.containers("scheduler")) == 2  # a leader and its standby

        created = stack("exec", "-T", "api", "tessera", "tenant", "create", "acme")
        assert 'tenant "acme" created' in created
        config = tmp_path / "acme.kubeconfig"
        config.write_text(stack("exec", "-T", "api", "tessera", "kubeconfig", "--tenant", "acme"))
        assert f"https://localhost:{stack.port}" in config.read_text()

        # The virtual demo pool registered by the node agent, Ready.
        deadline = time.monotonic() + 60
        while "Ready" not in kubectl(config, "get", "nodes", "--no-headers"):
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.5)
        kubectl(config, "run", "hello", "--image=busybox", "--restart=Never", "--", "sleep", "600")
        deadline = time.monotonic() + 90
        while (
            phase := kubectl(config, "get", "pod", "hello", "-o", "jsonpath={.status.phase}")
        ) != "Running":
            assert time.monotonic() < deadline, f"{phase}\n{stack.logs()}"
            time.sleep(0.5)
        assert kubectl(config, "get", "pod", "hello", "-o", "jsonpath={.spec.nodeName}")

        # Every long-running service reports healthy (those without HTTP by a file they touch).
        for service in ("api", "scheduler", "agent", "node-agent"):
            for container in stack.containers(service):
                deadline = time.monotonic() + 90
                while stack.inspect(container)["State"]["Health"]["Status"] != "healthy":
                    assert time.monotonic() < deadline, f"{service}:\n{stack.logs()}"
                    time.sleep(1)

        # Its usage, rated with the price list the stack started with (not at 0).
        time.sleep(2)
        usage = json.loads(
            stack("exec", "-T", "api", "tessera", "usage", "--tenant", "acme", "-o", "json")
        )
        resources = {item["resource"] for item in usage["items"]}
        assert {"vcpu", "memory"} <= resources, usage
        assert Decimal(usage["total"]["amount"]) > 0, usage

        # Each service stops on SIGTERM (SIGINT for PostgreSQL) well before docker's SIGKILL.
        for service in ("node-agent", "api", "scheduler", "agent", "redis", "postgres"):
            containers = stack.containers(service)
            began = time.monotonic()
            stack("stop", service, timeout=60)
            took = time.monotonic() - began
            assert took < STOP_SECONDS, f"{service} took {took:.1f} s to stop"
            for container in containers:
                state = stack.inspect(container)["State"]
                assert (state["ExitCode"], state["OOMKilled"]) == (0, False), (
                    f"{service}: {state}\n{stack.logs()}"
                )
    finally:
        subprocess.run(
            [*stack.base, "down", "--volumes", "--remove-orphans", "--timeout", "5"],
            env=stack.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
