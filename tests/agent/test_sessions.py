"""`kubectl exec`, `attach`, `port-forward` and `top` against real containers: a real `tessera
serve` with two worker processes sharing Redis (a session's user and its agent land on either),
a real node agent with `--runtime docker` and no listening port, a real Docker engine, the real
kubectl and the official Python client.

The engine is needed: without one these tests skip, or fail when CI is set."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.auth import service as auth
from app.db.engine import Database
from tests.conftest import REDIS_URL, unique
from tests.e2e.conftest import KUBECTL, TESSERA, Process, start_server, stop_server
from tests.engine import BUSYBOX, docker
from tests.factories import cpu_node

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

TIMING = {
    "TESSERA_NODE_LEASE_SECONDS": "10",
    "TESSERA_AGENT_HEARTBEAT_SECONDS": "1",
    "TESSERA_WATCH_POLL_SECONDS": "0.2",
    "TESSERA_AGENT_RELAY_IMAGE": BUSYBOX,
    "TESSERA_AGENT_METRICS_SECONDS": "1",
    "TESSERA_SESSION_CHECK_SECONDS": "0.5",
}


@dataclass
class Stack:
    server: Process
    admin: httpx.Client
    tenant: httpx.Client
    namespace: str
    node: str
    kubeconfig: Path
    other_kubeconfig: Path
    token: str
    agents: list[subprocess.Popen[bytes]]

    def path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" + (f"/{name}" if name else "")

    def run(self, name: str, script: str, node: str | None = None, **container: Any) -> None:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX,
                        "command": ["sh", "-c", script],
                        "resources": {"requests": {"cpu": "250m", "memory": "32Mi"}},
                        **container,
                    }
                ],
                "restartPolicy": "Never",
            },
        }
        created = self.tenant.post(self.path(), json=manifest)
        assert created.status_code == 201, created.text
        bound = self.admin.post(
            f"{self.path(name)}/binding",
            json={"target": {"kind": "Node", "name": node or self.node}},
        )
        assert bound.status_code == 201, bound.text
        until(
            lambda: self.admin.get(self.path(name)).json()["status"].get("phase") == "Running",
            what=f"{name} Running",
        )

    def kubectl(
        self, *args: str, input: str | None = None, other: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        config = self.other_kubeconfig if other else self.kubeconfig
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(config), "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            check=False,
        )


def until(check: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.1)


def kubeconfig(path: Path, server: Process, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "t",
                        "cluster": {"server": server.url, "certificate-authority": str(server.ca)},
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "t", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def stack(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    if not database_url.startswith("sqlite"):
        pytest.skip("sessions are the same on either database: these run on SQLite")
    data_dir = tmp_path_factory.mktemp("sessions")
    server = start_server(
        data_dir,
        database_url,
        workers=2,
        TESSERA_REDIS_URL=REDIS_URL,
        **TIMING,
        PYTHONPATH=os.environ.get("PYTHONPATH", "."),
    )
    db = Database(database_url)
    try:
        admin_token = db.write(lambda s: auth.create_token(s, role="admin")).value
        verify = ssl.create_default_context(cafile=str(server.ca))
        admin = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {admin_token}"},
            verify=verify,
            timeout=30,
        )
        names = [unique("ex"), unique("ox")]
        for name in names:
            assert admin.post(
                "/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}}
            ).is_success
        token, other_token = (
            db.write(lambda s, n=n: auth.create_token(s, role="tenant", tenant=n)).value
            for n in names
        )
        node, virtual = unique("sn-"), unique("vn-")
        node_tokens = {}
        for n in (node, virtual):
            assert admin.post("/api/v1/nodes", json=cpu_node(n, cpu="4", memory="8Gi")).is_success
            node_tokens[n] = db.write(
                lambda s, n=n: auth.create_token(s, role="node", node=n)
            ).value
    finally:
        db.dispose()
    tenant = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        verify=verify,
        timeout=30,
    )
    agents = []
    for n, runtime in ((node, "docker"), (virtual, "virtual")):
        inventory = data_dir / f"{n}.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "server": server.url,
                    "caCert": str(server.ca),
                    "nodes": [{"name": n, "token": node_tokens[n]}],
                }
            )
        )
        with (data_dir / f"agent-{n}.log").open("w") as log:
            agents.append(
                subprocess.Popen(
                    [TESSERA, "agent", "--runtime", runtime, "--nodes", str(inventory)],
                    env={**server.env, "DOCKER_HOST": docker_host},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    stack = Stack(
        server,
        admin,
        tenant,
        names[0],
        node,
        kubeconfig(data_dir / "tenant.kubeconfig", server, token),
        kubeconfig(data_dir / "other.kubeconfig", server, other_token),
        token,
        agents,
    )
    stack.virtual = virtual  # type: ignore[attr-defined]
    for n in (node, virtual):
        until(
            lambda n=n: (
                admin.get(f"/api/v1/nodes/{n}")
                .json()["metadata"]["labels"]
                .get("tessera.io/runtime")
            ),
            what="the nodes labelled by their agents",
        )
    yield stack
    for agent in agents:
        agent.terminate()
        agent.wait(timeout=15)
    stop_server(server)
    ids = docker(docker_host, "ps", "-aq", "--filter", f"label=tessera.io/node={node}").split()
    if ids:
        docker(docker_host, "rm", "-f", *ids)
    docker(docker_host, "network", "rm", f"tessera-ns-{names[0]}", check=False)


def test_kubectl_exec_prints_the_output_and_exits_with_the_code(stack: Stack) -> None:
    name = unique("ex-")
    stack.run(name, "sleep 600")
    for _ in range(3):  # each session lands on either worker, its agent's on either
        done = stack.kubectl("exec", name, "--", "sh", "-c", "echo hi; echo oops >&2; exit 3")
        assert done.returncode == 3, done.stderr
        assert done.stdout == "hi\n"
        assert "oops" in done.stderr
    ok = stack.kubectl("exec", name, "--", "sh", "-c", "echo $((6 * 7))")
    assert ok.returncode == 0 and ok.stdout == "42\n", ok.stderr


def test_kubectl_exec_with_stdin(stack: Stack) -> None:
    name = unique("in-")
    stack.run(name, "mkdir -p /tmp; sleep 600")  # the test image is busybox alone: no /tmp
    text = "".join(f"line {i}\n" for i in range(2000))  # more than one frame
    done = stack.kubectl("exec", "-i", name, "--", "sh", "-c", "wc -l; exit 0", input=text)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2000"
    upper = stack.kubectl("exec", "-i", name, "--", "tr", "a-z", "A-Z", input="hello\n")
    assert upper.stdout == "HELLO\n", upper.stderr
    # kubectl cp is an exec of tar, both ways
    source = stack.kubeconfig.parent / f"{name}.txt"
    source.write_text(text)
    copied = stack.kubectl("cp", str(source), f"{name}:/tmp/in.txt")
    assert copied.returncode == 0, copied.stderr
    back = stack.kubeconfig.parent / f"{name}-back.txt"
    copied = stack.kubectl("cp", f"{name}:/tmp/in.txt", str(back))
    assert copied.returncode == 0, copied.stderr
    assert back.read_text() == text


def test_kubectl_exec_with_a_terminal(stack: Stack) -> None:
    name = unique("tt-")
    stack.run(name, "sleep 600")
    # kubectl's -t needs a terminal on its side: `script` gives it one
    done = subprocess.run(
        [
            "script",
            "-qec",
            f"{KUBECTL} --kubeconfig {stack.kubeconfig} -n {stack.namespace} exec -it {name} "
            "-- sh -c 'test -t 0 && echo a-terminal; exit 5'",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        input="",
        timeout=60,
        check=False,
    )
    assert "a-terminal" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 5


def test_exec_into_another_tenants_pod_is_forbidden(stack: Stack) -> None:
    name = unique("fb-")
    stack.run(name, "sleep 600")
    done = stack.kubectl("exec", name, "--", "true", other=True)
    assert done.returncode != 0
    assert "Forbidden" in done.stderr or "forbidden" in done.stderr, done.stderr
    assert "yes" in stack.kubectl("auth", "can-i", "create", "pods/exec").stdout
    assert "yes" in stack.kubectl("auth", "can-i", "create", "pods/portforward").stdout
    assert "no" in stack.kubectl("auth", "can-i", "create", "pods/exec", other=True).stdout


def test_exec_on_a_virtual_node_says_why_not(stack: Stack) -> None:
    name = unique("vx-")
    stack.run(name, "sleep 600", node=stack.virtual)  # type: ignore[attr-defined]
    done = stack.kubectl("exec", name, "--", "true")
    assert done.returncode != 0
    assert "virtual runtime" in done.stderr and "tessera.io/runtime=docker" in done.stderr


def test_kubectl_attach_streams_the_containers_output(stack: Stack) -> None:
    name = unique("at-")
    stack.run(name, "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done")
    proc = subprocess.Popen(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(stack.kubeconfig),
            "-n",
            stack.namespace,
            "attach",
            name,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(3)]
        assert all(line.startswith("tick ") for line in seen), seen
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_attach_with_stdin_reaches_the_process(stack: Stack) -> None:
    name = unique("ai-")
    stack.run(name, "read line; echo got $line; sleep 600", stdin=True)
    proc = subprocess.Popen(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(stack.kubeconfig),
            "-n",
            stack.namespace,
            "attach",
            "-i",
            name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        time.sleep(0)  # the line is read by the container once the session is open
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        until(
            lambda: "got hello" in stack.tenant.get(f"{stack.path(name)}/log").text,
            what="the line attached into the container read back",
        )
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _client(stack: Stack) -> Any:
    from kubernetes import client as k8s

    configuration = k8s.Configuration()
    configuration.host = stack.server.url
    configuration.ssl_ca_cert = str(stack.server.ca)
    configuration.api_key = {"authorization": f"Bearer {stack.token}"}
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


def test_the_official_python_clients_stream_exec(stack: Stack) -> None:
    from kubernetes.stream import stream

    name = unique("py-")
    stack.run(name, "sleep 600")
    api = _client(stack)
    out = stream(
        api.connect_get_namespaced_pod_exec,
        name,
        stack.namespace,
        command=["sh", "-c", "echo from python; echo err >&2"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    assert "from python" in out and "err" in out
    session = stream(
        api.connect_get_namespaced_pod_exec,
        name,
        stack.namespace,
        command=["sh", "-c", "exit 4"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    session.run_forever(timeout=30)
    assert session.returncode == 4


def test_port_forward_with_the_python_client(stack: Stack) -> None:
    from kubernetes.stream import portforward

    name = unique("pf-")
    stack.run(name, "while true; do echo served-by-nc | nc -l -p 8080; done")
    api = _client(stack)
    forward = portforward(
        api.connect_get_namespaced_pod_portforward, name, stack.namespace, ports="8080"
    )
    sock = forward.socket(8080)
    sock.setblocking(True)
    sock.settimeout(30)
    sock.sendall(b"hello\n")
    received = b""
    while b"served-by-nc" not in received:
        chunk = sock.recv(1024)
        if not chunk:
            break
        received += chunk
    assert b"served-by-nc" in received
    sock.close()
    forward.close()


def _exchange(port: int, send: bytes, until_seen: bytes) -> bytes:
    """Connect to a local port, send, and read until `until_seen` or the connection ends."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(send)
        received = b""
        while until_seen not in received:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        return received


EXPECTED = b"hello\n" + b"x" * 200_000 + b"\nserved-by-nc\n"


def test_kubectl_port_forward(stack: Stack) -> None:
    """kubectl port-forward (SPDY in a WebSocket): each local connection reaches the pod's
    port, one after another and side by side, and what the pod sends comes back whole; a
    connection to a port nothing listens on is refused with kubectl's words; a pod of
    another tenant is forbidden."""
    import re
    import threading

    name = unique("kpf-")
    # each connection gets back its first 6 bytes, then more than one SPDY frame and WebSocket
    # message: 200,000 bytes and a marker (nc -ll: a process per connection, so connections
    # may come side by side; the server reads what it is sent, so it closes with a FIN)
    stack.run(
        name,
        'nc -ll -p 8080 -e sh -c "head -c 6; dd if=/dev/zero bs=1000 count=200 2>/dev/null'
        " | tr '\\\\0' x; echo; echo served-by-nc\"",
    )
    assert KUBECTL is not None
    forward = subprocess.Popen(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(stack.kubeconfig),
            "-n",
            stack.namespace,
            "port-forward",
            f"pod/{name}",
            ":8080",
            ":9999",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None and forward.stderr is not None
        ports = []
        while len(ports) < 2:
            line = forward.stdout.readline()
            assert line, forward.stderr.read()
            found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)", line)
            if found:
                ports.append(int(found.group(1)))
        local, closed = ports
        for _ in range(2):  # one connection after another
            received = _exchange(local, b"hello\n", b"served-by-nc\n")
            assert received == EXPECTED
        # Side by side: two connections at once, each its own session with the agent.
        results: list[bytes] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(_exchange(local, b"hello\n", b"served-by-nc\n"))
            )
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        assert results == [EXPECTED] * 2
        # Nothing listens on 9999: the connection ends at once, and kubectl says why.
        assert _exchange(closed, b"hello", b"never") == b""
        assert forward.poll() is None  # one refused connection does not end the forward
    finally:
        forward.terminate()
        _, errors = forward.communicate(timeout=30)
    assert "an error occurred forwarding" in errors and "9999" in errors
    other = stack.kubectl("port-forward", f"pod/{name}", ":8080", other=True, timeout=30)
    assert other.returncode != 0 and "forbidden" in other.stderr.lower()


def test_a_port_forward_keeps_a_bounded_number_of_half_open_connections(stack: Stack) -> None:
    """A client that opens only error streams, each of a new connection, is refused past
    twice the connections one port-forward carries (RST_STREAM, refused), and the connection
    itself goes on (a PING is still answered)."""
    import asyncio
    import ssl as ssl_module
    import struct

    import aiohttp  # its WebSocket client takes a subprotocol with a "/", as kubectl's does

    from app.sessions import spdy
    from app.sessions.router import MAX_FORWARDS, SPDY_TUNNEL
    from tests.unit.test_spdy import Client

    name = unique("halfopen-")
    stack.run(name, "sleep 600")  # Running on the docker node, whose agent is connected
    url = stack.server.url + stack.path(name) + "/portforward"
    context = ssl_module.create_default_context(cafile=str(stack.server.ca))
    client, server = Client(), spdy.Connection()
    opened = 3 * MAX_FORWARDS

    async def exchange() -> list[spdy.Frame]:
        headers = {"Authorization": f"Bearer {stack.token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, protocols=[SPDY_TUNNEL], ssl=context, headers=headers) as ws,
        ):
            for i in range(opened):
                fields = {"streamtype": "error", "port": "8080", "requestid": str(i)}
                await ws.send_bytes(client.syn_stream(2 * i + 1, fields))
            await ws.send_bytes(struct.pack("!HHII", 0x8003, spdy.PING, 4, 77))
            frames: list[spdy.Frame] = []
            while not any(f.kind == spdy.PING for f in frames):
                frames += server.feed(await ws.receive_bytes(timeout=30))
            return frames

    frames = asyncio.run(exchange())
    replies = [f for f in frames if f.kind == spdy.SYN_REPLY]
    refused = [f for f in frames if f.kind == spdy.RST_STREAM]
    assert len(replies) == 2 * MAX_FORWARDS
    assert len(refused) == opened - 2 * MAX_FORWARDS
    assert all(f.value == spdy.RST_REFUSED_STREAM for f in refused)


def test_kubectl_top_pod_and_node(stack: Stack) -> None:
    name = unique("tp-")
    stack.run(name, "while true; do :; done")  # keeps a CPU busy

    def top_pod() -> str | None:
        done = stack.kubectl("top", "pod", name, "--no-headers")
        return done.stdout if done.returncode == 0 and name in done.stdout else None

    line = until(top_pod, what="kubectl top pod")
    cpu = line.split()[1]
    # the engine's measure, not what was asked: a busy loop uses its whole 250m (the CPU it was
    # sold is its quota), an idle pod that asked as much uses almost none
    assert cpu.endswith("m") and int(cpu[:-1]) > 150, line
    # the pod's containers, without its sandbox (which holds its network, and is none of them)
    per_container = stack.kubectl("top", "pod", name, "--containers", "--no-headers")
    assert per_container.returncode == 0, per_container.stderr
    assert [row.split()[1] for row in per_container.stdout.splitlines()] == ["main"]
    idle = unique("ti-")
    stack.run(idle, "sleep 600")
    line = until(
        lambda: (lambda d: d.stdout if d.returncode == 0 and idle in d.stdout else None)(
            stack.kubectl("top", "pod", idle, "--no-headers")
        ),
        what="kubectl top pod of an idle pod",
    )
    assert int(line.split()[1].rstrip("m")) < 50, line
    admin_config = kubeconfig(
        stack.kubeconfig.parent / "admin.kubeconfig",
        stack.server,
        stack.admin.headers["Authorization"].split()[1],
    )
    done = until(
        lambda: (lambda d: d if d.returncode == 0 and stack.node in d.stdout else None)(
            subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(admin_config), "top", "node", stack.node],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        ),
        what="kubectl top node",
    )
    assert stack.node in done.stdout
    other = stack.kubectl("top", "pod", name, other=True)
    assert other.returncode != 0 and "orbidden" in other.stderr
    # the virtual runtime reports what its pods request
    vname = unique("vt-")
    stack.run(vname, "sleep 600", node=stack.virtual)  # type: ignore[attr-defined]
    line = until(
        lambda: (lambda d: d.stdout if d.returncode == 0 and vname in d.stdout else None)(
            stack.kubectl("top", "pod", vname, "--no-headers")
        ),
        what="kubectl top pod of a virtual pod",
    )
    assert line.split()[1:3] == ["250m", "32Mi"], line
