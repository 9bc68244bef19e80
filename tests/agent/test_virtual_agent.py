"""The node protocol end to end: a real `tessera serve`, the control plane's node loop
(`tessera agent`) and a real virtual node agent (`tessera agent --virtual`) that speaks only
the public API with node tokens made by `tessera token create --node`.

Short settings make a lease last 2 s and a lost node's grace 8 s, so each life below takes
seconds; the grace leaves a killed agent's successor the time a loaded machine takes to start it."""

from __future__ import annotations

import ipaddress
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, select

from agent.runtime import VIRTUAL_POD_NETWORK, virtual_pod_ip
from app import kubeconfig
from app.auth import service as auth
from app.db.engine import Database
from app.db.models import UsageEvent
from tests.conftest import unique
from tests.e2e.conftest import KUBECTL, TESSERA, Process, start_server, stop_server
from tests.factories import cpu_node, pod

TIMING = {
    "TESSERA_NODE_LEASE_SECONDS": "2",
    "TESSERA_NODE_LOST_GRACE_SECONDS": "8",
    "TESSERA_AGENT_HEARTBEAT_SECONDS": "0.3",
    "TESSERA_AGENT_START_DELAY_SECONDS": "0.2",
    "TESSERA_AGENT_STOP_SECONDS": "0.5",
    "TESSERA_WATCH_POLL_SECONDS": "0.2",
    "TESSERA_AGENT_LOG_STEP_SECONDS": "0.4",
    "TESSERA_POD_LOG_MAX_LINES": "50",
}


@dataclass
class Stack:
    server: Process
    admin: httpx.Client
    admin_token: str
    tenant: httpx.Client
    namespace: str
    nodes: list[str]
    inventory: Path
    database_url: str
    agent: subprocess.Popen[bytes] | None = None

    def start_agent(self) -> None:
        with (self.server.data_dir / f"virtual-{unique('')}.log").open("w") as log:
            self.agent = subprocess.Popen(
                [TESSERA, "agent", "--virtual", "--nodes", str(self.inventory)],
                env=self.server.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill_agent(self) -> None:
        assert self.agent is not None
        self.agent.send_signal(signal.SIGKILL)  # as a node that vanishes: no goodbye
        self.agent.wait(timeout=10)
        self.agent = None

    def pod(self, name: str) -> dict[str, Any]:
        response = self.admin.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        response.raise_for_status()
        return dict(response.json())

    def run(self, name: str, node: str, **spec: Any) -> None:
        annotations = spec.pop("annotations", {})
        manifest = pod(name, cpu="1", **spec)
        manifest["metadata"]["annotations"] = annotations
        created = self.tenant.post(f"/api/v1/namespaces/{self.namespace}/pods", json=manifest)
        assert created.status_code == 201, created.text
        self.bind(name, node)

    def bind(self, name: str, node: str) -> httpx.Response:
        return self.admin.post(
            f"/api/v1/namespaces/{self.namespace}/pods/{name}/binding",
            json={"target": {"kind": "Node", "name": node}},
        )


def until(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    """Poll until `check` returns something truthy (the state is read over the API)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("agent")
    env = {**TIMING, "PYTHONPATH": os.environ.get("PYTHONPATH", ".")}
    server = start_server(data_dir, database_url, **env)
    control = subprocess.Popen(
        [TESSERA, "agent", "--interval", "0.1"],
        env=server.env,
        stdout=(data_dir / "control.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    db = Database(database_url)
    try:
        admin_token = db.write(lambda s: auth.create_token(s, role="admin")).value
        verify = ssl.create_default_context(cafile=str(server.ca))
        admin = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {admin_token}"}, verify=verify
        )
        tenant_name = unique("ag")
        assert admin.post(
            "/apis/tessera.io/v1/tenants", json={"metadata": {"name": tenant_name}}
        ).is_success
        tenant_token = db.write(
            lambda s: auth.create_token(s, role="tenant", tenant=tenant_name)
        ).value
        nodes = [unique("vn-") for _ in range(2)]
        entries = []
        for i, name in enumerate(nodes):
            assert admin.post(
                "/api/v1/nodes", json=cpu_node(name, cpu="8", memory="32Gi")
            ).is_success
            if i == 0:  # as an operator makes it
                token = server.cli("token", "create", "--node", name)
            else:
                token = db.write(lambda s, n=name: auth.create_token(s, role="node", node=n)).value
            entries.append({"name": name, "token": token})
    finally:
        db.dispose()
    tenant = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {tenant_token}"}, verify=verify
    )
    inventory = data_dir / "nodes.yaml"
    inventory.write_text(
        yaml.safe_dump({"server": server.url, "caCert": str(server.ca), "nodes": entries})
    )
    stack = Stack(server, admin, admin_token, tenant, tenant_name, nodes, inventory, database_url)
    stack.start_agent()
    for name in nodes:  # each node's agent has taken its lease
        until(
            lambda n=name: (
                admin.get(
                    f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n}"
                ).status_code
                == 200
            ),
            what=f"the lease of {name}",
        )
    yield stack
    if stack.agent is not None:
        stack.agent.terminate()
        stack.agent.wait(timeout=10)
    control.terminate()
    control.wait(timeout=10)
    stop_server(server)


def _phase(stack: Stack, name: str, phase: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        got = stack.pod(name)
        return got if got["status"]["phase"] == phase else None

    return check


def test_a_pod_runs_and_succeeds_or_fails_with_its_exit_code(stack: Stack) -> None:
    node = stack.nodes[0]
    ok, bad = unique("ok-"), unique("bad-")
    stack.run(ok, node, annotations={"tessera.io/run-seconds": "0.5"}, restartPolicy="Never")
    stack.run(
        bad,
        node,
        annotations={"tessera.io/run-seconds": "0.3", "tessera.io/exit-code": "3"},
        restartPolicy="Never",
    )
    assert stack.pod(ok)["status"]["phase"] in ("Pending", "Running")
    running = until(_phase(stack, ok, "Running"), what="Running")
    assert running["status"]["startTime"]
    assert "running" in running["status"]["containerStatuses"][0]["state"]
    # an address, as KWOK gives its pods, the same for the pod's every report
    assert running["status"]["podIP"] == virtual_pod_ip(running["metadata"]["uid"])
    assert ipaddress.ip_address(running["status"]["podIP"]) in VIRTUAL_POD_NETWORK
    done = until(_phase(stack, ok, "Succeeded"), what="Succeeded")
    ended = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert ended["exitCode"] == 0 and ended["reason"] == "Completed"
    failed = until(_phase(stack, bad, "Failed"), what="Failed")
    ended = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert ended["exitCode"] == 3 and ended["reason"] == "Error"
    # The agent removes an ended pod when it is deleted, at once.
    started = time.monotonic()
    assert stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{ok}").is_success
    until(
        lambda: (
            stack.admin.get(f"/api/v1/namespaces/{stack.namespace}/pods/{ok}").status_code == 404
        )
    )
    assert time.monotonic() - started < 3


def test_restarts_and_the_active_deadline(stack: Stack) -> None:
    node = stack.nodes[0]
    flaky, slow = unique("flaky-"), unique("slow-")
    stack.run(
        flaky,
        node,
        annotations={"tessera.io/run-seconds": "0.2", "tessera.io/exit-code": "1"},
        restartPolicy="OnFailure",
    )
    stack.run(slow, node, activeDeadlineSeconds=1, restartPolicy="Never")
    restarted = until(
        lambda: (
            (s := stack.pod(flaky)["status"]).get("containerStatuses")
            and s["containerStatuses"][0]["restartCount"] >= 2
            and s
        ),
        what="two restarts",
    )
    assert restarted["phase"] == "Running"
    last = restarted["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 1 and last["reason"] == "Error"
    deadline = until(_phase(stack, slow, "Failed"), what="DeadlineExceeded")
    assert deadline["status"]["reason"] == "DeadlineExceeded"
    stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{flaky}")


def test_deleting_a_running_pod_honours_its_grace_period_in_about_a_second(stack: Stack) -> None:
    name = unique("long-")
    stack.run(name, stack.nodes[0])  # no run-seconds, no deadline: runs until deleted
    until(_phase(stack, name, "Running"), what="Running")
    started = time.monotonic()
    response = stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{name}")
    assert response.is_success
    assert response.json()["metadata"]["deletionGracePeriodSeconds"] == 30
    until(
        lambda: (
            stack.admin.get(f"/api/v1/namespaces/{stack.namespace}/pods/{name}").status_code == 404
        ),
        what="the pod removed",
    )
    took = time.monotonic() - started
    assert 0.4 < took < 15.0, took  # the container's stop (0.5 s), not the 30 s grace


def test_a_lost_node_goes_not_ready_then_its_pods_fail_billed_to_its_last_heartbeat(
    stack: Stack,
) -> None:
    node = stack.nodes[1]
    name = unique("lost-")
    stack.run(name, node)
    uid = until(_phase(stack, name, "Running"), what="Running")["metadata"]["uid"]
    stack.kill_agent()
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"

    def not_ready() -> dict[str, Any] | None:
        got = stack.admin.get(f"/api/v1/nodes/{node}").json()
        ready = got["status"]["conditions"][0]
        return ready if ready["status"] == "Unknown" else None

    ready = until(not_ready, what="NotReady")
    assert ready["reason"] == "NodeStatusUnknown" and "Lease" in ready["message"]
    last_renew = stack.admin.get(lease_path).json()["spec"]["renewTime"]
    # Nothing new is placed on it.
    waiting = unique("wait-")
    created = stack.tenant.post(
        f"/api/v1/namespaces/{stack.namespace}/pods", json=pod(waiting, cpu="1")
    )
    assert created.status_code == 201
    refused = stack.bind(waiting, node)
    assert refused.status_code == 409 and "not ready" in refused.json()["message"]
    lost = until(_phase(stack, name, "Failed"), timeout=40, what="NodeLost")
    assert lost["status"]["reason"] == "NodeLost"
    # Billing ended at the last heartbeat (the lease's renewTime), by the ledger's clock.
    engine = create_engine(stack.database_url)
    try:
        with engine.connect() as conn:
            stops = conn.execute(
                select(UsageEvent.at, UsageEvent.reason).where(
                    UsageEvent.pod_uid == uid, UsageEvent.kind == "stop"
                )
            ).all()
    finally:
        engine.dispose()
    renew = datetime.fromisoformat(last_renew.replace("Z", "+00:00"))
    assert len(stops) == 1 and stops[0].reason == "node-lost", stops
    stopped_at = stops[0].at.replace(tzinfo=UTC) if stops[0].at.tzinfo is None else stops[0].at
    assert abs((stopped_at - renew).total_seconds()) < 1.0, (stopped_at, renew)
    # Its agent coming back makes it Ready again; the lost pod's capacity is free for another.
    stack.start_agent()
    until(
        lambda: (
            stack.admin.get(f"/api/v1/nodes/{node}").json()["status"]["conditions"][0]["status"]
            == "True"
        ),
        what="Ready again",
    )
    assert stack.bind(waiting, node).status_code == 201
    until(_phase(stack, waiting, "Running"), what="the waiting pod running")
    assert stack.pod(name)["status"]["phase"] == "Failed"  # a lost pod stays lost


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_gets_the_node_leases_and_describes_a_node_with_its_lease(
    stack: Stack, tmp_path: Path
) -> None:
    config = tmp_path / "admin.kubeconfig"
    kubeconfig.write(
        config,
        kubeconfig.build(
            server=stack.server.url,
            ca_cert=stack.server.ca,
            user="admin",
            token=stack.admin_token,
            namespace="default",
        ),
    )

    def kubectl(*args: str) -> str:
        done = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    node = stack.nodes[0]
    until(
        lambda: (
            stack.admin.get(f"/api/v1/nodes/{node}").json()["status"]["conditions"][0]["status"]
            == "True"
        ),
        what="the node Ready",
    )
    listed = kubectl("get", "lease", "-n", "kube-node-lease")
    assert "HOLDER" in listed.splitlines()[0]
    assert any(line.split()[:2] == [node, node] for line in listed.splitlines()[1:]), listed
    described = kubectl("describe", "node", node)
    lease = described[described.index("Lease:") :]
    assert f"HolderIdentity:  {node}" in lease and "RenewTime:" in lease, described
    assert "<unset>" not in lease.split("\n")[3], described
    as_json = kubectl("get", "lease", node, "-n", "kube-node-lease", "-o", "json")
    assert '"leaseDurationSeconds": 2' in as_json
    # kubectl delete waits until the pod is gone: the agent's graceful stop, not the 30 s grace
    name = unique("kd-")
    stack.run(name, node)
    until(_phase(stack, name, "Running"), what="Running")
    started = time.monotonic()
    assert f'pod "{name}" deleted' in kubectl("delete", "pod", name, "-n", stack.namespace)
    took = time.monotonic() - started
    assert took < 10, took
    assert stack.admin.get(f"/api/v1/namespaces/{stack.namespace}/pods/{name}").status_code == 404


def test_a_restarted_agent_resumes_its_virtual_pods_from_their_reported_start(
    stack: Stack,
) -> None:
    """Killed while its pods run, the agent comes back and ends each run when it would have
    ended (one that ended meanwhile is reported with that end), never running it again."""
    node = stack.nodes[0]
    long, short = unique("resume-"), unique("ended-")
    stack.run(long, node, annotations={"tessera.io/run-seconds": "4"}, restartPolicy="Never")
    stack.run(short, node, annotations={"tessera.io/run-seconds": "0.5"}, restartPolicy="Never")
    begun = {}
    for name in (long, short):
        running = until(_phase(stack, name, "Running"), what="Running")
        begun[name] = running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    # The short run ends while its agent is away: the new one takes a second or more to start
    # (and no more than the lease's 2 s and the lost grace's 8 s, or its pods would be lost).
    stack.kill_agent()
    stack.start_agent()
    for name, seconds in ((short, 0.5), (long, 4)):
        done = until(
            lambda n=name: (
                stack.pod(n)["status"]["phase"] in ("Succeeded", "Failed") and stack.pod(n)
            ),
            what=f"{name} ended",
        )
        assert done["status"]["phase"] == "Succeeded", (
            done["status"].get("reason"),
            done["status"].get("message"),
            done["status"].get("containerStatuses"),
        )
        status = done["status"]["containerStatuses"][0]
        ended = status["state"]["terminated"]
        assert ended["startedAt"] == begun[name] and status["restartCount"] == 0, status
        took = datetime.fromisoformat(ended["finishedAt"].replace("Z", "+00:00")) - (
            datetime.fromisoformat(ended["startedAt"].replace("Z", "+00:00"))
        )
        assert abs(took.total_seconds() - seconds) <= 1, (name, ended)  # second resolution
