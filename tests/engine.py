"""A real Docker engine for the tests that run containers, and the images they run.

No image registry is reachable from the machines the suite runs on, so every image a test runs
is built here: `BUSYBOX` from scratch with the host's statically linked busybox (Debian's
`busybox-static`). The engine is the one at `DOCKER_HOST`, else Tessera's own test engine
(`.ci/docker-engine` starts it; `.ci/run` does so before the suite), else the system's. Without
one, the tests that need it are skipped, or fail when `CI` is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("unix:///run/tessera-docker.sock", "unix:///var/run/docker.sock")
BUSYBOX = "tessera-test/busybox:1"
BUSYBOX_BINARIES = ("/bin/busybox", "/usr/bin/busybox")


def docker(host: str, *args: str, timeout: float = 120, check: bool = True) -> str:
    """Run the docker CLI against `host`; its stdout."""
    done = subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


def find_engine() -> tuple[str | None, str]:
    """(DOCKER_HOST of an engine that answers, or None; why not)."""
    if shutil.which("docker") is None:
        return None, "no docker command (apt-get install docker.io)"
    hosts = [os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else list(CANDIDATES)
    why = "no engine answers"
    for host in hosts:
        try:
            docker(host, "version", "--format", "{{.Server.Version}}", timeout=10)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            why = f"{host}: {str(exc).splitlines()[0] if str(exc) else 'no answer'}"
            continue
        return host, ""
    return None, f"{why} (start one with .ci/docker-engine)"


@contextlib.contextmanager
def images_lock(name: str = "images") -> Iterator[None]:
    """One builder at a time across pytest-xdist workers (and `.ci/run`'s early build): a lock
    per `name`, since a builder of one kind of image may take the lock of another inside."""
    path = Path(tempfile.gettempdir()) / f"tessera-test-{name}.lock"
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_busybox(host: str) -> str:
    """The busybox test image (built once per engine): `sh`, `sleep`, `nc`, `wget` and the rest
    of busybox's applets, nothing else."""
    with images_lock():
        if docker(host, "images", "-q", BUSYBOX).strip():
            return BUSYBOX
        binary = next((b for b in BUSYBOX_BINARIES if Path(b).exists()), None)
        if binary is None:
            raise RuntimeError("no static busybox here: apt-get install busybox-static")
        with tempfile.TemporaryDirectory() as context:
            shutil.copy(binary, Path(context) / "busybox")
            (Path(context) / "Dockerfile").write_text(
                "FROM scratch\n"
                "COPY busybox /bin/busybox\n"
                'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
                'CMD ["sh"]\n'
            )
            docker(host, "build", "-q", "-t", BUSYBOX, context, timeout=300)
    return BUSYBOX


# Tessera's own image is built on a Python base; no registry serves `python:3.11-slim` here, so
# the tests build one from Debian's packages (bookworm's Python is 3.11), once per engine.
PYTHON_BASE = "tessera-test/python:3.11-bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PYTHON_PACKAGES = ("python3", "python3-venv", "ca-certificates")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PRUNED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


def ensure_python_base(host: str) -> str:
    """A minimal Debian with Python 3.11 and venv (debootstrap's minbase variant, ~40 s the first
    time; root only), imported as PYTHON_BASE: the `BASE` that Tessera's Dockerfile builds on."""
    with images_lock():
        if docker(host, "images", "-q", PYTHON_BASE).strip():
            return PYTHON_BASE
        if shutil.which("debootstrap") is None:
            raise RuntimeError("no debootstrap here: apt-get install debootstrap")
        with tempfile.TemporaryDirectory(prefix="tessera-rootfs-") as work:
            root = Path(work) / "root"
            done = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PYTHON_PACKAGES)}",
                    "bookworm",
                    str(root),
                    DEBIAN_MIRROR,
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                log = root / "debootstrap" / "debootstrap.log"
                tail = log.read_text()[-2000:] if log.exists() else done.stderr[-2000:]
                raise RuntimeError(f"debootstrap failed: {tail}")
            for pruned in PRUNED:
                shutil.rmtree(root / pruned, ignore_errors=True)
            # This machine's trust (Debian's bundle and the CAs it adds, such as a TLS proxy's):
            # pip in the image build reaches the package index as this machine does.
            if CA_BUNDLE.exists():
                shutil.copy(CA_BUNDLE, root / CA_BUNDLE.relative_to("/"))
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            imported = subprocess.run(
                [
                    "docker",
                    "import",
                    "--change",
                    f"ENV PIP_CERT={CA_BUNDLE} SSL_CERT_FILE={CA_BUNDLE}",
                    "--change",
                    'CMD ["python3"]',
                    "-",
                    PYTHON_BASE,
                ],
                stdin=tar.stdout,
                env={**os.environ, "DOCKER_HOST": host},
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            tar.wait()
            if imported.returncode != 0:
                raise RuntimeError(f"docker import: {imported.stderr.strip()}")
    return PYTHON_BASE


# --- a local image registry ------------------------------------------------------------------
# Debian's `docker-registry` (the CNCF distribution registry) on 127.0.0.1, with htpasswd
# (bcrypt, made by Debian's `htpasswd`) when asked: the pulls, their credentials and their
# failures are tested against it. The engine pulls from 127.0.0.1 over plain HTTP.


@dataclass
class Registry:
    address: str  # host:port
    process: subprocess.Popen[bytes]
    user: str = ""
    password: str = ""

    def push(self, host: str, image: str, name: str) -> str:
        """`image` of the engine at `host` pushed as `name` (a path with a tag); its
        reference in this registry. The engine's copy of that reference is removed after."""
        reference = f"{self.address}/{name}"
        docker(host, "tag", image, reference)
        with tempfile.TemporaryDirectory() as config:
            env = ["--config", config]
            if self.user:
                docker(host, *env, "login", "-u", self.user, "-p", self.password, self.address)
            docker(host, *env, "push", reference, timeout=300)
        docker(host, "rmi", reference)
        return reference


def start_registry(directory: Path, *, user: str = "", password: str = "") -> Registry:
    binary = shutil.which("docker-registry")
    if binary is None:
        raise RuntimeError("no docker-registry here: apt-get install docker-registry")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(directory / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    if user:
        if shutil.which("htpasswd") is None:
            raise RuntimeError("no htpasswd here: apt-get install apache2-utils")
        made = subprocess.run(
            ["htpasswd", "-Bbn", user, password], capture_output=True, text=True, check=True
        )
        (directory / "htpasswd").write_text(made.stdout)
        config["auth"] = {
            "htpasswd": {"realm": "tessera-test", "path": str(directory / "htpasswd")}
        }
    (directory / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = (directory / "registry.log").open("w")
    process = subprocess.Popen(
        [binary, "serve", str(directory / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    f"docker-registry did not start: {(directory / 'registry.log').read_text()}"
                ) from None
            time.sleep(0.1)
    return Registry(f"127.0.0.1:{port}", process, user, password)
