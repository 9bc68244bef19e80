"""The docker runtime end to end: a real `tessera serve`, a real node agent with
`--runtime docker` speaking only the public API with its node token, and a real Docker engine
running the busybox test image. A pod's whole life (run, logs, exit codes, OOMKilled, restart
with back-off, delete with grace), the agent SIGKILLed and restarted while its pods run, and the
API restarted while a job ends.

The engine is needed: without one these tests skip, or fail when CI is set."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.auth import service as auth
from app.db.engine import Database
from tests.conftest import unique
from tests.e2e.conftest import TESSERA, Process, start_server, stop_server
from tests.engine import BUSYBOX, Registry, docker, start_registry
from tests.factories import cpu_node

TIMING = {
    "TESSERA_NODE_LEASE_SECONDS": "10",
    "TESSERA_AGENT_HEARTBEAT_SECONDS": "1",
    "TESSERA_WATCH_POLL_SECONDS": "0.2",
}


@dataclass
class Stack:
    server: Process
    admin: httpx.Client
    tenant: httpx.Client
    namespace: str
    node: str
    inventory: Path
    host: str
    agent: subprocess.Popen[bytes] | None = None

    def start_agent(self) -> None:
        with (self.server.data_dir / f"docker-agent-{unique('')}.log").open("w") as log:
            self.agent = subprocess.Popen(
                [TESSERA, "agent", "--runtime", "docker", "--nodes", str(self.inventory)],
                env={**self.server.env, "DOCKER_HOST": self.host},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill_agent(self) -> None:
        assert self.agent is not None
        self.agent.send_signal(signal.SIGKILL)
        self.agent.wait(timeout=10)
        self.agent = None

    def path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" + (f"/{name}" if name else "")

    def pod(self, name: str) -> dict[str, Any]:
        response = self.admin.get(self.path(name))
        response.raise_for_status()
        return dict(response.json())

    def run(self, name: str, script: str, **spec: Any) -> str:
        """A busybox pod running `sh -c script` on the docker node; its uid."""
        container = {
            "name": "main",
            "image": BUSYBOX,
            "command": ["sh", "-c", script],
            "resources": spec.pop("resources", {"requests": {"cpu": "500m", "memory": "64Mi"}}),
            **spec.pop("container", {}),
        }
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [container], "restartPolicy": "Never", **spec},
        }
        created = self.tenant.post(self.path(), json=manifest)
        assert created.status_code == 201, created.text
        bound = self.admin.post(
            f"{self.path(name)}/binding", json={"target": {"kind": "Node", "name": self.node}}
        )
        assert bound.status_code == 201, bound.text
        return str(created.json()["metadata"]["uid"])

    def log(self, name: str, **params: Any) -> str:
        """The pod's log ("" before it runs, or while its agent has sent none: the API answers
        400 then)."""
        response = self.tenant.get(f"{self.path(name)}/log", params=params)
        if response.status_code == 400 and (
            "has not sent its log yet" in response.text or "is waiting to start" in response.text
        ):
            return ""
        assert response.status_code == 200, response.text
        return response.text

    def containers(self, uid: str, *, sandbox: bool = False) -> list[dict[str, Any]]:
        """The pod's containers (`sandbox`: its sandbox, the holder of its network namespace,
        alone)."""
        ids = docker(self.host, "ps", "-aq", "--filter", f"label=tessera.io/pod-uid={uid}").split()
        found = []
        for container_id in ids:  # one removed meanwhile is gone
            shown = docker(self.host, "inspect", container_id, check=False)
            found += json.loads(shown) if shown.strip() else []
        return [
            c for c in found if (c["Config"]["Labels"]["tessera.io/container"] == "POD") == sandbox
        ]

    def events(self, name: str) -> list[tuple[str, str]]:
        """The kubelet's events about a pod, oldest first: (reason, message)."""
        listed = self.tenant.get(
            f"/api/v1/namespaces/{self.namespace}/events",
            params={"fieldSelector": f"involvedObject.name={name},source=kubelet"},
        )
        assert listed.status_code == 200, listed.text
        return [(e["reason"], e["message"]) for e in listed.json()["items"]]


def until(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.1)


def phase(stack: Stack, name: str, want: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        got = stack.pod(name)
        return got if got["status"]["phase"] == want else None

    return check


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["status"]["containerStatuses"][0]["state"]["terminated"])


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def stack(
    docker_host: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    if not database_url.startswith("sqlite"):
        pytest.skip("the runtime is the same on either database: these run on SQLite")
    data_dir = tmp_path_factory.mktemp("docker-agent")
    server = start_server(
        data_dir, database_url, **TIMING, PYTHONPATH=os.environ.get("PYTHONPATH", ".")
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
        tenant_name = unique("dk")
        assert admin.post(
            "/apis/tessera.io/v1/tenants", json={"metadata": {"name": tenant_name}}
        ).is_success
        tenant_token = db.write(
            lambda s: auth.create_token(s, role="tenant", tenant=tenant_name)
        ).value
        node = unique("dn-")
        assert admin.post("/api/v1/nodes", json=cpu_node(node, cpu="4", memory="8Gi")).is_success
        node_token = db.write(lambda s: auth.create_token(s, role="node", node=node)).value
    finally:
        db.dispose()
    tenant = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {tenant_token}"},
        verify=verify,
        timeout=30,
    )
    inventory = data_dir / "nodes.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "server": server.url,
                "caCert": str(server.ca),
                "nodes": [{"name": node, "token": node_token}],
            }
        )
    )
    stack = Stack(server, admin, tenant, tenant_name, node, inventory, docker_host)
    stack.start_agent()
    until(
        lambda: (
            stack.admin.get(f"/api/v1/nodes/{node}")
            .json()["metadata"]["labels"]
            .get("tessera.io/runtime")
            == "docker"
        ),
        what="the node labelled by its agent",
    )
    yield stack
    if stack.agent is not None:
        stack.agent.terminate()
        stack.agent.wait(timeout=15)
    stop_server(stack.server)
    ids = docker(docker_host, "ps", "-aq", "--filter", f"label=tessera.io/node={node}").split()
    if ids:
        docker(docker_host, "rm", "-f", *ids)
    docker(docker_host, "network", "rm", f"tessera-ns-{tenant_name}", check=False)


def test_a_pod_runs_its_command_with_its_limits_logs_and_exit_code(stack: Stack) -> None:
    bad, ok = unique("bad-"), unique("ok-")
    uid = stack.run(
        bad,
        'echo "hello from $POD_NAME in $(pwd)"; echo oops >&2; exit 3',
        container={
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ],
            "workingDir": "/tmp",
        },
        resources={"limits": {"cpu": "500m", "memory": "64Mi"}},
    )
    stack.run(ok, "echo fine")
    failed = until(phase(stack, bad, "Failed"), what="Failed")
    ended = terminated(failed)
    assert ended["exitCode"] == 3 and ended["reason"] == "Error", ended
    assert at(ended["finishedAt"]) >= at(ended["startedAt"])
    assert ended["containerID"].startswith("docker://")
    lines = until(lambda: stack.log(bad).splitlines() if "oops" in stack.log(bad) else None)
    # stdout and stderr are two streams: their lines' order between them is the engine's
    assert sorted(lines) == sorted([f"hello from {bad} in /tmp", "oops"]), lines
    done = until(phase(stack, ok, "Succeeded"), what="Succeeded")
    assert terminated(done)["exitCode"] == 0 and terminated(done)["reason"] == "Completed"
    (container,) = stack.containers(uid)
    assert container["HostConfig"]["NanoCpus"] == 500_000_000
    assert container["HostConfig"]["Memory"] == 64 << 20
    assert container["HostConfig"]["Privileged"] is False
    # one container, never restarted: it holds the pod's network itself (no sandbox)
    assert not stack.containers(uid, sandbox=True)
    assert container["HostConfig"]["NetworkMode"] == f"tessera-ns-{stack.namespace}"
    assert container["Config"]["Hostname"] == bad
    assert container["Config"]["Labels"]["tessera.io/restart-count"] == "0"
    # Deleting an ended pod removes it and its container at once.
    assert stack.tenant.delete(stack.path(bad)).is_success
    until(lambda: stack.admin.get(stack.path(bad)).status_code == 404, what="removed")
    until(lambda: not stack.containers(uid), what="its container removed")


def sold_spec(pod: dict[str, Any]) -> tuple[int, int]:
    """(NanoCpus, memory bytes) of the spec the pod was sold, from its annotation."""
    cpu, memory = pod["metadata"]["annotations"]["tessera.io/pod-use-spec"].split("-")
    return int(float(cpu) * 1e9), int(float(memory.removesuffix("Gi")) * (1 << 30))


def test_containers_get_the_spec_the_pod_was_sold_not_a_smaller_request(stack: Stack) -> None:
    """A request rounded up to a sold spec (and billed for it) gets the whole spec on the
    engine; in a pod of two containers, one with a limit gets its limit and the other the
    rest of the spec."""
    small, pair = unique("small-"), unique("pair-")
    uid = stack.run(small, "sleep 60", resources={"requests": {"cpu": "10m", "memory": "16Mi"}})
    two = stack.run(
        pair,
        "sleep 60",
        containers=[
            {
                "name": "main",
                "image": BUSYBOX,
                "command": ["sleep", "60"],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
            },
            {
                "name": "side",
                "image": BUSYBOX,
                "command": ["sleep", "60"],
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
            },
        ],
    )
    until(phase(stack, small, "Running"), what="Running")
    cpu, memory = sold_spec(stack.pod(small))
    assert (cpu, memory) > (10_000_000, 16 << 20)  # rounded up: more than it asked
    (container,) = stack.containers(uid)
    assert container["HostConfig"]["NanoCpus"] == cpu
    assert container["HostConfig"]["Memory"] == container["HostConfig"]["MemorySwap"] == memory
    until(phase(stack, pair, "Running"), what="Running")
    cpu, memory = sold_spec(stack.pod(pair))
    got = {
        c["Config"]["Labels"]["tessera.io/container"]: (
            c["HostConfig"]["NanoCpus"],
            c["HostConfig"]["Memory"],
        )
        for c in stack.containers(two)
    }
    assert got == {
        "main": (500_000_000, 256 << 20),
        "side": (cpu - 500_000_000, memory - (256 << 20)),
    }, (got, cpu, memory)
    for name in (small, pair):
        stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": "0"})
        until(lambda n=name: stack.admin.get(stack.path(n)).status_code == 404, what="gone")
    # more CPUs than the engine's host has (the node says 4): as many as it has
    big = unique("big-")
    uid = stack.run(big, "sleep 60", resources={"requests": {"cpu": "3", "memory": "3Gi"}})
    until(phase(stack, big, "Running"), what="Running")
    host_cpus = int(docker(stack.host, "info", "--format", "{{.NCPU}}").strip())
    (container,) = stack.containers(uid)
    assert container["HostConfig"]["NanoCpus"] == min(3, host_cpus) * 1_000_000_000
    assert container["HostConfig"]["Memory"] == 3 << 30
    stack.tenant.delete(stack.path(big), params={"gracePeriodSeconds": "0"})


def test_a_resize_changes_the_running_containers_limits_in_place(stack: Stack) -> None:
    name = unique("grow-")
    uid = stack.run(name, "sleep 120", resources={"requests": {"cpu": "500m", "memory": "1Gi"}})
    until(phase(stack, name, "Running"), what="Running")
    (before,) = stack.containers(uid)
    assert (before["HostConfig"]["NanoCpus"], before["HostConfig"]["Memory"]) == sold_spec(
        stack.pod(name)
    )
    asks = {"requests": {"cpu": "1", "memory": "2Gi"}}
    resized = stack.tenant.patch(
        f"{stack.path(name)}/resize",
        json={"spec": {"containers": [{"name": "main", "resources": asks}]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert resized.status_code == 200, resized.text
    cpu, memory = sold_spec(stack.pod(name))
    assert (cpu, memory) == (1_000_000_000, 2 << 30)

    def applied() -> dict[str, Any] | None:
        (now,) = stack.containers(uid)
        held = (now["HostConfig"]["NanoCpus"], now["HostConfig"]["Memory"])
        return now if held == (cpu, memory) else None

    after = until(applied, what="the new limits on the engine")
    # the same container, never restarted
    assert after["Id"] == before["Id"]
    assert after["State"]["StartedAt"] == before["State"]["StartedAt"]
    assert after["HostConfig"]["MemorySwap"] == memory
    pod = stack.pod(name)
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert ("ResizedContainer", "Container main now has 1 CPU, 2048 MiB") in until(
        lambda: (
            stack.events(name)
            if any(r == "ResizedContainer" for r, _ in stack.events(name))
            else None
        ),
        what="the ResizedContainer event",
    )
    stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": "0"})


def test_an_image_update_restarts_the_container_with_it(stack: Stack) -> None:
    """`kubectl set image` on a running pod: its container is stopped and started again with
    the new image at once (the restart policy is Never), its restart count 1."""
    retagged = f"tessera-test/busybox:{unique('re')}"
    docker(stack.host, "tag", BUSYBOX, retagged)
    name = unique("image-")
    uid = stack.run(name, "echo started; sleep 120", terminationGracePeriodSeconds=1)
    until(phase(stack, name, "Running"), what="Running")
    (first,) = stack.containers(uid)
    changed = stack.tenant.patch(
        stack.path(name),
        json={"spec": {"containers": [{"name": "main", "image": retagged}]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert changed.status_code == 200, changed.text

    def restarted() -> dict[str, Any] | None:
        got = stack.pod(name)
        (status,) = got["status"]["containerStatuses"]
        return got if status["restartCount"] == 1 and "running" in status["state"] else None

    pod = until(restarted, timeout=60, what="the container started again")
    assert pod["status"]["phase"] == "Running"
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"] == retagged
    assert status["lastState"]["terminated"]["containerID"] == f"docker://{first['Id']}"
    runs = {c["Config"]["Labels"]["tessera.io/restart-count"]: c for c in stack.containers(uid)}
    assert sorted(runs) == ["0", "1"]  # the last run kept for `kubectl logs --previous`
    assert runs["0"]["Id"] == first["Id"] and not runs["0"]["State"]["Running"]
    assert runs["1"]["Config"]["Image"] == retagged and runs["1"]["State"]["Running"]
    assert ("Killing", "Container main definition changed, will be restarted") in stack.events(name)
    stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": "0"})
    docker(stack.host, "rmi", retagged, check=False)


def test_logs_follow_a_running_container_within_a_second(stack: Stack) -> None:
    name = unique("follow-")
    stack.run(name, "echo one; sleep 2; echo two; sleep 1")
    until(lambda: "one" in stack.log(name), what="the first line")
    arrived: dict[str, tuple[datetime, float]] = {}
    with stack.tenant.stream(
        "GET", f"{stack.path(name)}/log", params={"follow": "true", "timestamps": "true"}
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            stamp, _, text = line.partition(" ")
            arrived[text] = (at(stamp), time.time())
            if text == "two":
                break
    written, seen = arrived["two"]
    assert list(arrived) == ["one", "two"], arrived
    assert seen - written.timestamp() < 1.0, (written, seen)  # the engine's own timestamp


def test_a_container_over_its_memory_limit_is_oomkilled(stack: Stack) -> None:
    name = unique("oom-")
    stack.run(
        name,
        "exec dd if=/dev/zero of=/dev/null bs=64M count=1",
        resources={"limits": {"cpu": "500m", "memory": "16Mi"}},
    )
    failed = until(phase(stack, name, "Failed"), what="OOMKilled")
    ended = terminated(failed)
    assert ended["reason"] == "OOMKilled" and ended["exitCode"] == 137, ended


def test_a_command_not_in_the_image_cannot_run(stack: Stack) -> None:
    name = unique("nocmd-")
    stack.run(name, "", container={"command": ["/no/such/program"]})
    failed = until(phase(stack, name, "Failed"), what="ContainerCannotRun")
    ended = terminated(failed)
    assert ended["reason"] == "ContainerCannotRun" and ended["exitCode"] != 0, ended
    assert "/no/such/program" in ended["message"], ended  # the engine's words


def test_two_tenants_pods_never_share_a_network(stack: Stack) -> None:
    """A server in one tenant's pod: a pod of the same namespace reaches it, another tenant's
    pod on the same node does not."""
    other = unique("dk2")
    assert stack.admin.post(
        "/apis/tessera.io/v1/tenants", json={"metadata": {"name": other}}
    ).is_success
    server = unique("srv-")
    # a readiness probe on a port of its own: its socket is made in the network namespace the
    # container holds itself
    ready = {"tcpSocket": {"port": 8081}, "periodSeconds": 1}
    server_uid = stack.run(
        server,
        "while true; do nc -l -p 8081 </dev/null; done & "
        "while true; do echo hi | nc -l -p 8080; done",
        container={"readinessProbe": ready},
    )
    until(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in stack.pod(server)["status"].get("conditions") or []
        ),
        what="the server Ready",
    )
    (holder,) = stack.containers(server_uid)  # no sandbox: one container, never restarted
    assert not stack.containers(server_uid, sandbox=True)
    network = holder["HostConfig"]["NetworkMode"]
    assert network == f"tessera-ns-{stack.namespace}"
    assert json.loads(docker(stack.host, "network", "inspect", network))[0]["Internal"]
    address = holder["NetworkSettings"]["Networks"][network]["IPAddress"]
    assert stack.pod(server)["status"]["podIP"] == address
    probe = f"nc -w 2 {address} 8080 </dev/null | grep -q hi"
    neighbour, stranger = unique("same-"), unique("other-")
    stack.run(neighbour, probe)
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": stranger},
        "spec": {
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", probe]}],
            "restartPolicy": "Never",
        },
    }
    other_pods = f"/api/v1/namespaces/{other}/pods"
    assert stack.admin.post(other_pods, json=manifest).is_success
    assert stack.admin.post(
        f"{other_pods}/{stranger}/binding", json={"target": {"kind": "Node", "name": stack.node}}
    ).is_success
    assert until(phase(stack, neighbour, "Succeeded"), what="the neighbour connected")

    def stranger_ended() -> dict[str, Any] | None:
        got = stack.admin.get(f"{other_pods}/{stranger}").json()
        return got if got["status"]["phase"] in ("Succeeded", "Failed") else None

    ended = until(stranger_ended, what="the stranger's probe")
    assert ended["status"]["phase"] == "Failed", "another tenant's pod reached the server"
    stranger_uid = ended["metadata"]["uid"]
    (theirs,) = stack.containers(stranger_uid)
    assert theirs["HostConfig"]["NetworkMode"] == f"tessera-ns-{other}"
    stack.tenant.delete(stack.path(server), params={"gracePeriodSeconds": 0})
    stack.admin.delete(f"{other_pods}/{stranger}", params={"gracePeriodSeconds": 0})
    until(
        lambda: not stack.containers(stranger_uid) + stack.containers(stranger_uid, sandbox=True),
        what="theirs removed",
    )
    docker(stack.host, "network", "rm", f"tessera-ns-{other}", check=False)


def test_the_active_deadline_stops_the_container(stack: Stack) -> None:
    name = unique("deadline-")
    # long enough for the container to start first on a busy machine (the deadline counts from
    # the pod's start on the node: its sandbox, then its container)
    uid = stack.run(name, "sleep 60", activeDeadlineSeconds=6)
    started = time.monotonic()
    failed = until(phase(stack, name, "Failed"), what="DeadlineExceeded")
    assert failed["status"]["reason"] == "DeadlineExceeded", failed["status"]
    assert time.monotonic() - started < 20
    assert terminated(failed)["exitCode"] == 137  # killed: no grace past the deadline
    (container,) = stack.containers(uid)
    assert container["State"]["Running"] is False


def test_an_image_that_cannot_be_pulled_waits_with_the_engines_message(stack: Stack) -> None:
    name = unique("pull-")
    # a registry on this machine where nothing listens: refused at once, no lookup leaves it
    stack.run(name, "true", container={"image": "127.0.0.1:9/tessera-test/absent:1"})

    def waiting() -> dict[str, Any] | None:
        statuses = stack.pod(name)["status"].get("containerStatuses") or [{}]
        state = statuses[0].get("state", {}).get("waiting") or {}
        return state if state.get("reason") == "ErrImagePull" else None

    state = until(waiting, what="ErrImagePull")
    assert "127.0.0.1:9/tessera-test/absent:1" in state["message"], state
    assert "connection refused" in state["message"], state  # the engine's own words
    assert stack.pod(name)["status"]["phase"] == "Pending"
    stack.tenant.delete(stack.path(name))


def test_a_failing_container_restarts_after_its_back_off(stack: Stack) -> None:
    name = unique("crash-")
    uid = stack.run(name, "echo run; exit 1", restartPolicy="OnFailure")

    def backing_off() -> dict[str, Any] | None:
        statuses = stack.pod(name)["status"].get("containerStatuses") or [{}]
        waiting = statuses[0].get("state", {}).get("waiting") or {}
        return statuses[0] if waiting.get("reason") == "CrashLoopBackOff" else None

    first = until(backing_off, what="CrashLoopBackOff")
    seen = time.monotonic()
    assert first["restartCount"] == 0 and first["lastState"]["terminated"]["exitCode"] == 1
    assert "back-off 10s" in first["state"]["waiting"]["message"]
    restarted = until(
        lambda: (s := stack.pod(name)["status"]["containerStatuses"][0])["restartCount"] >= 1 and s,
        timeout=20,
        what="the restart",
    )
    assert time.monotonic() - seen > 8, "restarted before its 10 s back-off"
    assert restarted["lastState"]["terminated"]["exitCode"] == 1
    runs = stack.containers(uid)
    counts = {c["Config"]["Labels"]["tessera.io/restart-count"] for c in runs}
    assert "1" in counts, counts
    # a pod that restarts keeps its address: its runs join its sandbox's network namespace
    (sandbox,) = stack.containers(uid, sandbox=True)
    assert sandbox["HostConfig"]["NetworkMode"] == f"tessera-ns-{stack.namespace}"
    assert {c["HostConfig"]["NetworkMode"] for c in runs} == {f"container:{sandbox['Id']}"}
    assert stack.log(name, previous="true").strip() == "run"
    stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": 0})


def test_deleting_a_pod_stops_its_container_with_the_grace_period(stack: Stack) -> None:
    polite, stubborn = unique("term-"), unique("kill-")
    polite_uid = stack.run(
        polite, "trap 'echo got TERM; exit 0' TERM; echo up; while true; do sleep 0.2; done"
    )
    stubborn_uid = stack.run(stubborn, "trap '' TERM; echo up; while true; do sleep 0.2; done")
    for name in (polite, stubborn):
        until(phase(stack, name, "Running"), what="Running")
        until(lambda n=name: "up" in stack.log(n), what="its first line")
    started = time.monotonic()
    assert stack.tenant.delete(stack.path(polite), params={"gracePeriodSeconds": 30}).is_success
    until(lambda: stack.admin.get(stack.path(polite)).status_code == 404, what="polite gone")
    assert time.monotonic() - started < 8  # it exited on SIGTERM, long before its grace
    assert not stack.containers(polite_uid)
    started = time.monotonic()
    assert stack.tenant.delete(stack.path(stubborn), params={"gracePeriodSeconds": 3}).is_success
    until(lambda: stack.admin.get(stack.path(stubborn)).status_code == 404, what="killed")
    took = time.monotonic() - started
    assert 2.5 < took < 12, took  # SIGTERM ignored: SIGKILL at the end of the grace
    assert not stack.containers(stubborn_uid)


def test_a_restarted_agent_resumes_its_containers_without_running_them_again(
    stack: Stack,
) -> None:
    long, short = unique("long-"), unique("short-")
    long_uid = stack.run(long, "echo start; sleep 6; echo done; exit 7")
    stack.run(short, "echo short; sleep 2; exit 0")
    running = until(phase(stack, long, "Running"), what="Running")
    started = running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    until(phase(stack, short, "Running"), what="short Running")
    until(lambda: "start" in stack.log(long), what="the first line")
    stack.kill_agent()
    time.sleep(3)  # the short job ends while its agent is away
    stack.start_agent()
    done = until(phase(stack, short, "Succeeded"), what="the short job reported")
    ended = terminated(done)
    assert ended["exitCode"] == 0
    # its real end, not when the agent came back
    assert (at(ended["finishedAt"]) - at(ended["startedAt"])).total_seconds() < 3.5, ended
    failed = until(phase(stack, long, "Failed"), timeout=20, what="the long job ended")
    ended = terminated(failed)
    assert ended["exitCode"] == 7 and ended["startedAt"] == started, ended  # the same run
    assert failed["status"]["containerStatuses"][0]["restartCount"] == 0
    assert len(stack.containers(long_uid)) == 1
    log = until(lambda: (t := stack.log(long)) and "done" in t and t, what="the last line")
    assert log.splitlines() == ["start", "done"], log


def test_a_report_the_api_missed_is_sent_again_when_it_returns(stack: Stack) -> None:
    name = unique("outage-")
    stack.run(name, "sleep 3; exit 4")
    running = until(phase(stack, name, "Running"), what="Running")
    began = at(running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    stack.server.process.send_signal(signal.SIGKILL)
    stack.server.process.wait(timeout=10)
    time.sleep(6)  # the job ends while the API is down: its report is refused, then retried
    with (stack.server.data_dir / "serve-again.log").open("w") as log:
        stack.server.process = subprocess.Popen(
            [TESSERA, "serve"], env=stack.server.env, stdout=log, stderr=subprocess.STDOUT
        )
    back = time.monotonic()
    failed = until(lambda: _quiet(lambda: phase(stack, name, "Failed")()), what="reported")
    assert time.monotonic() - back < 20
    ended = terminated(failed)
    assert ended["exitCode"] == 4
    took = (at(ended["finishedAt"]) - began).total_seconds()
    assert 2.5 < took < 4.5, ended  # the container's own end, not the API's return


def _quiet(check: Callable[[], Any]) -> Any:
    try:
        return check()
    except httpx.HTTPError:
        return None


@pytest.fixture(scope="module")
def registry(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A local registry without credentials (docker-registry on 127.0.0.1)."""
    found = start_registry(tmp_path_factory.mktemp("registry"))
    yield found
    found.process.terminate()
    found.process.wait(timeout=10)


def waiting_state(stack: Stack, name: str, reason: str, *, init: bool = False) -> Any:
    key = "initContainerStatuses" if init else "containerStatuses"

    def check() -> dict[str, Any] | None:
        statuses = stack.pod(name)["status"].get(key) or [{}]
        state = statuses[0].get("state", {}).get("waiting") or {}
        return state if state.get("reason") == reason else None

    return until(check, what=reason)


def test_pulls_are_told_in_events_with_the_time_they_took(stack: Stack, registry: Any) -> None:
    reference = registry.push(stack.host, BUSYBOX, f"tessera-test/pulled:{unique('')}")
    pulled, present = unique("pull-"), unique("here-")
    stack.run(pulled, "echo pulled", container={"image": reference})
    stack.run(present, "true")  # IfNotPresent (a tag), and the engine has it
    until(phase(stack, pulled, "Succeeded"), what="the pulled image ran")
    until(phase(stack, present, "Succeeded"), what="the present image ran")
    events = until(lambda: (e := stack.events(pulled)) and len(e) >= 4 and e, what="events")
    reasons = [reason for reason, _ in events]
    assert reasons[:4] == ["Pulling", "Pulled", "Created", "Started"], events
    assert events[0][1] == f'Pulling image "{reference}"'
    took = re.fullmatch(
        rf'Successfully pulled image "{re.escape(reference)}" in ([0-9.]+)s '
        r"\(([0-9.]+)s including waiting\)",
        events[1][1],
    )
    assert took and 0 < float(took.group(1)) <= float(took.group(2)), events[1]
    assert events[3][1] == "Started container main"
    here = until(lambda: (e := stack.events(present)) and len(e) >= 3 and e, what="events")
    assert here[0] == ("Pulled", f'Container image "{BUSYBOX}" already present on machine')


def test_an_image_removed_after_a_pod_used_it_is_looked_up_again(stack: Stack) -> None:
    """The agent takes an image it found present as present for a few seconds (one look-up for
    a burst of pods): one removed within them fails its next pod's create, and that pod waits
    with ErrImageNeverPull as if it had been looked up."""
    image = f"tessera-test/removed:{unique('')}"
    docker(stack.host, "tag", BUSYBOX, image)
    first, second = unique("seen-"), unique("gone-")
    never = {"image": image, "imagePullPolicy": "Never"}
    stack.run(first, "true", container=never)
    until(phase(stack, first, "Succeeded"), what="the first pod of the image ran")
    docker(stack.host, "rmi", image)  # its tag alone: BUSYBOX stays
    stack.run(second, "true", container=never)
    state = waiting_state(stack, second, "ErrImageNeverPull")
    assert f'"{image}" is not present with pull policy of Never' in state["message"], state
    stack.tenant.delete(stack.path(second), params={"gracePeriodSeconds": 0})


def test_a_bad_image_reference_is_invalid_image_name(stack: Stack) -> None:
    name = unique("badref-")
    stack.run(name, "true", container={"image": "Not A/Reference::x"})
    state = waiting_state(stack, name, "InvalidImageName")
    assert "invalid reference format" in state["message"], state
    assert stack.pod(name)["status"]["phase"] == "Pending"
    events = until(lambda: (e := stack.events(name)) and len(e) >= 2 and e, what="events")
    assert [r for r, _ in events[:2]] == ["InspectFailed", "Failed"], events
    assert events[1][1] == "Error: InvalidImageName"
    stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": 0})


def test_init_containers_run_in_order_before_the_others(stack: Stack) -> None:
    name = unique("init-")
    uid = stack.run(
        name,
        "echo main",
        initContainers=[
            {"name": "first", "image": BUSYBOX, "command": ["sh", "-c", "echo first; sleep 1"]},
            {"name": "second", "image": BUSYBOX, "command": ["sh", "-c", "echo second"]},
        ],
    )
    pending = until(
        lambda: (p := stack.pod(name))["status"].get("initContainerStatuses") and p,
        what="the init containers reported",
    )
    assert pending["status"]["phase"] == "Pending"  # while its init containers run
    assert pending["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == (
        "PodInitializing"
    )
    done = until(phase(stack, name, "Succeeded"), what="Succeeded")
    first, second = done["status"]["initContainerStatuses"]
    main = terminated(done)
    for init in (first, second):
        assert init["state"]["terminated"]["reason"] == "Completed", init
        assert init["ready"] is True
    assert at(first["state"]["terminated"]["finishedAt"]) <= at(
        second["state"]["terminated"]["startedAt"]
    )
    assert at(second["state"]["terminated"]["finishedAt"]) <= at(main["startedAt"])
    assert stack.log(name, container="first").strip() == "first"
    assert stack.log(name, container="main").strip() == "main"
    # one container per init container and the main one, in the pod's sandbox
    labels = sorted(c["Config"]["Labels"]["tessera.io/container"] for c in stack.containers(uid))
    assert labels == ["first", "main", "second"]


def test_a_failing_init_container_follows_the_restart_policy(stack: Stack) -> None:
    never, again = unique("initno-"), unique("initre-")
    failing = [{"name": "setup", "image": BUSYBOX, "command": ["sh", "-c", "exit 2"]}]
    never_uid = stack.run(never, "echo never", initContainers=failing)
    stack.run(again, "echo never", initContainers=failing, restartPolicy="OnFailure")
    failed = until(phase(stack, never, "Failed"), what="Failed")
    (setup,) = failed["status"]["initContainerStatuses"]
    assert setup["state"]["terminated"]["exitCode"] == 2, setup
    assert failed["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == (
        "PodInitializing"
    )
    assert [c["Config"]["Labels"]["tessera.io/container"] for c in stack.containers(never_uid)] == [
        "setup"
    ]  # the main container never made
    waiting_state(stack, again, "CrashLoopBackOff", init=True)
    assert stack.pod(again)["status"]["phase"] == "Pending"
    stack.tenant.delete(stack.path(again), params={"gracePeriodSeconds": 0})


def test_env_from_the_pods_fields_and_resources_and_its_address(stack: Stack) -> None:
    name = unique("env-")
    refs = {
        "NAME": "metadata.name",
        "NS": "metadata.namespace",
        "UID": "metadata.uid",
        "IP": "status.podIP",
        "TEAM": "metadata.labels['team']",
        "NOTE": "metadata.annotations['note']",
    }
    env = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in refs.items()]
    env += [
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {
            "name": "MEM_MI",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        },
        {"name": "GREETING", "value": "hi $(NAME)"},
    ]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"team": "blue"}, "annotations": {"note": "n1"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "command": [
                        "sh",
                        "-c",
                        "env; pwd; ip -4 -o addr show eth0 | awk '{print \"ETH0=\" $4}'",
                    ],
                    "workingDir": "/etc",
                    "env": env,
                    "resources": {"limits": {"cpu": "1500m", "memory": "96Mi"}},
                }
            ],
            "restartPolicy": "Never",
        },
    }
    assert stack.tenant.post(stack.path(), json=manifest).status_code == 201
    assert stack.admin.post(
        f"{stack.path(name)}/binding", json={"target": {"kind": "Node", "name": stack.node}}
    ).is_success
    done = until(phase(stack, name, "Succeeded"), what="Succeeded")
    lines = until(lambda: (t := stack.log(name)) and "ETH0=" in t and t, what="its log")
    got = dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)
    ip = done["status"]["podIP"]
    assert {k: got.get(k) for k in [*refs, "CPU", "MEM_MI", "GREETING", "ETH0"]} == {
        "NAME": name,
        "NS": stack.namespace,
        "UID": done["metadata"]["uid"],
        "IP": ip,
        "TEAM": "blue",
        "NOTE": "n1",
        "CPU": "2",  # rounded up to whole CPUs, as the kubelet gives it
        "MEM_MI": "96",
        "GREETING": f"hi {name}",
        "ETH0": got["ETH0"],
    }, lines
    assert got["ETH0"].split("/")[0] == ip  # the address it has is the one reported
    assert "/etc" in lines.splitlines()


def test_security_context_is_applied_and_never_loosened(stack: Stack) -> None:
    name = unique("sec-")
    uid = stack.run(
        name,
        "id -u; id -g; touch /x 2>/dev/null && echo writable || echo read-only; "
        "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status",
        container={
            "securityContext": {
                "runAsUser": 1234,
                "runAsGroup": 2345,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
            }
        },
    )
    until(phase(stack, name, "Succeeded"), what="Succeeded")
    lines = until(lambda: (t := stack.log(name)) and "Seccomp" in t and t, what="its log")
    got = lines.split()
    assert got[:3] == ["1234", "2345", "read-only"], lines
    status = dict(zip(got[3::2], got[4::2], strict=True))
    assert status["NoNewPrivs:"] == "1" and status["Seccomp:"] == "2", status  # filtered
    assert int(status["CapEff:"], 16) == 0  # a non-root user holds no capability
    (container,) = stack.containers(uid)
    host = container["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["NET_BIND_SERVICE"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["PidsLimit"] == 4096 and "no-new-privileges" in host["SecurityOpt"]
    assert container["Config"]["User"] == "1234:2345"
    # root with the default set: NET_RAW is never among them
    root = unique("root-")
    stack.run(root, "grep CapEff /proc/self/status")
    until(phase(stack, root, "Succeeded"), what="Succeeded")
    effective = int(until(lambda: stack.log(root)).split()[1], 16)
    assert effective and not effective & (1 << 13), hex(effective)  # CAP_NET_RAW is 13


def test_probes_start_ready_and_restart_a_container(stack: Stack) -> None:
    """A startup probe (tcpSocket) holds the others back until the server listens; readiness
    (httpGet on a named port) follows /ready; liveness (exec) failing kills the container,
    which restarts (its SIGKILL is the agent's, not an OOM kill)."""
    name = unique("probe-")
    script = (
        "mkdir -p /tmp/www; touch /tmp/alive; sleep 8; echo ok > /tmp/www/ready; "
        "httpd -p 8080 -h /tmp/www; sleep 6; rm /tmp/www/ready; sleep 4; rm /tmp/alive; "
        "sleep 60"
    )
    fast = {"periodSeconds": 1, "timeoutSeconds": 1}
    stack.run(
        name,
        script,
        restartPolicy="OnFailure",
        terminationGracePeriodSeconds=1,
        container={
            "ports": [{"name": "web", "containerPort": 8080}],
            "startupProbe": {"tcpSocket": {"port": 8080}, "failureThreshold": 30, **fast},
            "readinessProbe": {
                "httpGet": {"path": "/ready", "port": "web"},
                "failureThreshold": 1,
                **fast,
            },
            "livenessProbe": {
                "exec": {"command": ["test", "-f", "/tmp/alive"]},
                "failureThreshold": 2,
                **fast,
            },
        },
    )
    seen: list[tuple[bool, bool, str]] = []  # (started, ready, the pod's Ready), as they change

    def watch() -> dict[str, Any] | None:
        pod = stack.pod(name)
        statuses = pod["status"].get("containerStatuses") or [{}]
        status = statuses[0]
        if "running" in status.get("state", {}) and status.get("restartCount", 0) == 0:
            conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            now = (bool(status.get("started")), bool(status.get("ready")), conditions["Ready"])
            if not seen or seen[-1] != now:
                seen.append(now)
        return status if status.get("restartCount", 0) >= 1 else None

    restarted = until(watch, timeout=90, what="the restart after the liveness probe failed")
    assert seen[0] == (False, False, "False"), seen  # the startup probe had not succeeded
    ready_at = seen.index((True, True, "True"))  # ready once /ready answered
    assert (True, False, "False") in seen[ready_at:], seen  # and no longer after its 404
    ended = restarted["lastState"]["terminated"]
    assert ended["exitCode"] == 137 and ended["reason"] == "Error", ended
    events = stack.events(name)
    # a repeated warning is counted on one event, its message the latest (the startup probe's
    # refused connections, the readiness probe's 404s, the liveness probe's failures)
    unhealthy = [m for reason, m in events if reason == "Unhealthy"]
    assert unhealthy and unhealthy[-1].split(":")[0].endswith("probe failed"), events
    assert ("Killing", "Container main failed liveness probe, will be restarted") in events
    stack.tenant.delete(stack.path(name), params={"gracePeriodSeconds": 0})


@pytest.fixture(scope="module")
def private_registry(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A local registry that asks for a user and password (htpasswd)."""
    found = start_registry(tmp_path_factory.mktemp("private"), user="puller", password="pw-1")
    yield found
    found.process.terminate()
    found.process.wait(timeout=10)


def test_configmaps_secrets_and_pull_secrets_reach_the_containers(
    stack: Stack, private_registry: Registry
) -> None:
    reference = private_registry.push(stack.host, BUSYBOX, f"team/app:{unique('')}")
    base = f"/api/v1/namespaces/{stack.namespace}"
    suffix = unique("")
    config, secret, pull = f"cfg{suffix}", f"sec{suffix}", f"pull{suffix}"
    docker_config = {
        "auths": {
            private_registry.address: {
                "auth": base64.b64encode(b"puller:pw-1").decode(),
            }
        }
    }
    for kind, body in (
        ("configmaps", {"metadata": {"name": config}, "data": {"mode": "fast", "b": "two"}}),
        ("secrets", {"metadata": {"name": secret}, "stringData": {"token": "s3cret"}}),
        (
            "secrets",
            {
                "metadata": {"name": pull},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": json.dumps(docker_config)},
            },
        ),
    ):
        made = stack.tenant.post(f"{base}/{kind}", json=body)
        assert made.status_code == 201, made.text
    name = unique("cfg-")
    script = (
        'echo "MODE=$MODE TOKEN=$TOKEN CFG_b=$CFG_b"; cat /etc/app/settings; echo; '
        "cat /run/token/token; echo; cat /shared/from-init; ls /etc/app; "
        "touch /etc/app/x 2>/dev/null || echo config-read-only"
    )
    stack.run(
        name,
        script,
        imagePullSecrets=[{"name": pull}],
        initContainers=[
            {
                "name": "prepare",
                "image": BUSYBOX,
                "command": ["sh", "-c", "echo made-by-init > /shared/from-init"],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            }
        ],
        volumes=[
            {"name": "shared", "emptyDir": {}},
            {
                "name": "settings",
                "configMap": {"name": config, "items": [{"key": "mode", "path": "settings"}]},
            },
            {"name": "token", "secret": {"secretName": secret}},
        ],
        container={
            "image": reference,
            "env": [
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": config, "key": "mode"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}},
            ],
            "envFrom": [{"configMapRef": {"name": config}, "prefix": "CFG_"}],
            "volumeMounts": [
                {"name": "shared", "mountPath": "/shared"},
                {"name": "settings", "mountPath": "/etc/app"},
                {"name": "token", "mountPath": "/run/token"},
            ],
        },
    )
    done = until(phase(stack, name, "Succeeded"), timeout=60, what="Succeeded")
    log = until(lambda: (t := stack.log(name)) and "config-read-only" in t and t, what="its log")
    assert log.splitlines() == [
        "MODE=fast TOKEN=s3cret CFG_b=two",
        "fast",
        "s3cret",
        "made-by-init",
        "settings",
        "config-read-only",
    ], log
    assert [r for r, _ in stack.events(name)].count("Pulled") >= 1
    # Without the pull secret the registry refuses the pull.
    refused = unique("nopull-")
    stack.run(refused, "true", container={"image": reference, "imagePullPolicy": "Always"})
    state = waiting_state(stack, refused, "ErrImagePull")
    assert "no basic auth credentials" in state["message"] or "unauthorized" in state["message"]
    # A reference to what does not exist waits, in the kubelet's words.
    missing = unique("nocfg-")
    stack.run(
        missing,
        "true",
        container={
            "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x"}}}]
        },
    )
    state = waiting_state(stack, missing, "CreateContainerConfigError")
    assert state["message"] == 'configmap "nope" not found', state
    for gone in (refused, missing, name):
        stack.tenant.delete(stack.path(gone), params={"gracePeriodSeconds": 0})
    uid = done["metadata"]["uid"]
    until(
        lambda: (
            not docker(
                stack.host, "volume", "ls", "-q", "--filter", f"label=tessera.io/pod-uid={uid}"
            ).strip()
        ),
        what="its volumes removed",
    )
