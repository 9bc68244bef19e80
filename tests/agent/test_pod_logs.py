"""Pod logs that the node agent holds: a real `tessera serve`, a real virtual agent writing each
container run's lines, and real kubectl reading them (`logs`, `-f`, `--tail`, `--timestamps`,
`--previous`). The stack (and its short timings) is tests/agent/test_virtual_agent.py's."""

from __future__ import annotations

import re
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, func, select

from app import kubeconfig
from app.auth import service as auth
from app.db.engine import Database
from app.db.models import PodLogLine
from tests.agent.test_virtual_agent import Stack, _phase, stack, until
from tests.conftest import unique
from tests.e2e.conftest import KUBECTL
from tests.factories import pod

__all__ = ["stack"]  # the module's fixture

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def _kubectl(stack: Stack, tmp_path: Path) -> Any:
    token = stack.tenant.headers["Authorization"].removeprefix("Bearer ")
    config = kubeconfig.write(
        tmp_path / "tenant.kubeconfig",
        kubeconfig.build(
            server=stack.server.url,
            ca_cert=stack.server.ca,
            user=stack.namespace,
            token=token,
            namespace=stack.namespace,
        ),
    )

    def kubectl(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode == 0) is ok, (args, done.stdout, done.stderr)
        return done

    return kubectl


def _node_client(stack: Stack, node: str) -> httpx.Client:
    entries = yaml.safe_load(stack.inventory.read_text())["nodes"]
    token = next(e["token"] for e in entries if e["name"] == node)
    return httpx.Client(
        base_url=stack.server.url,
        headers={"Authorization": f"Bearer {token}"},
        verify=ssl.create_default_context(cafile=str(stack.server.ca)),
    )


def _stored(stack: Stack, uid: str) -> int:
    engine = create_engine(stack.database_url)
    try:
        with engine.connect() as conn:
            query = select(func.count()).select_from(PodLogLine).where(PodLogLine.pod_uid == uid)
            return int(conn.scalar(query) or 0)
    finally:
        engine.dispose()


def test_a_pods_log_through_its_life_with_kubectl(stack: Stack, tmp_path: Path) -> None:
    kubectl = _kubectl(stack, tmp_path)
    node, name = stack.nodes[0], unique("lg-")
    manifest = pod(name, cpu="1", restartPolicy="Never")
    manifest["metadata"]["annotations"] = {"tessera.io/run-seconds": "2"}
    manifest["spec"]["containers"][0]["command"] = ["python"]
    manifest["spec"]["containers"][0]["args"] = ["-c", "print(42)"]
    created = stack.tenant.post(f"/api/v1/namespaces/{stack.namespace}/pods", json=manifest)
    assert created.status_code == 201, created.text
    # Before it is placed: the answer says why, in words (not "pod not found").
    waiting = kubectl("logs", name, ok=False).stderr
    assert "waiting to start" in waiting and "not placed the pod on a node" in waiting
    assert "not found" not in waiting
    assert stack.bind(name, node).status_code == 201
    until(_phase(stack, name, "Running"), what="Running")
    # -f follows the running container and ends when it exits.
    started = time.monotonic()
    followed = kubectl("logs", "-f", name).stdout.splitlines()
    assert time.monotonic() - started > 0.5  # it waited for the run to end
    assert followed[0] == (
        "tessera-runtime: started container main from image registry.example/app:1.0"
    ), followed
    assert followed[1] == 'tessera-runtime: command ["python"], args ["-c", "print(42)"]'
    assert any(re.fullmatch(r"tessera-runtime: container \S+ running \(.+s\)", x) for x in followed)
    assert followed[-1].endswith("exited with code 0 (Completed)"), followed
    until(_phase(stack, name, "Succeeded"), what="Succeeded")
    assert kubectl("logs", name).stdout.splitlines() == followed
    assert kubectl("logs", name, "--tail=1").stdout.splitlines() == followed[-1:]
    stamped = kubectl("logs", name, "--timestamps", "--tail=2").stdout.splitlines()
    assert len(stamped) == 2
    for line, plain in zip(stamped, followed[-2:], strict=True):
        stamp, _, text = line.partition(" ")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", stamp) and text == plain
    assert "previous terminated container" in kubectl("logs", name, "--previous", ok=False).stderr
    # Deleting the pod deletes its log.
    uid = stack.pod(name)["metadata"]["uid"]
    assert _stored(stack, uid) == len(followed)
    kubectl("delete", "pod", name)
    assert _stored(stack, uid) == 0


def test_a_restarted_pods_previous_log_shows_the_earlier_runs_exit(
    stack: Stack, tmp_path: Path
) -> None:
    kubectl = _kubectl(stack, tmp_path)
    name = unique("rs-")
    stack.run(
        name,
        stack.nodes[0],
        annotations={"tessera.io/run-seconds": "0.6", "tessera.io/exit-code": "3"},
        restartPolicy="OnFailure",
    )
    until(
        lambda: (
            (s := stack.pod(name)["status"]).get("containerStatuses")
            and s["containerStatuses"][0]["restartCount"] >= 1
        ),
        what="a restart",
    )
    previous = kubectl("logs", name, "--previous").stdout.splitlines()
    assert previous[0].startswith("tessera-runtime: started container")
    assert previous[-1].endswith("exited with code 3 (Error)"), previous
    current = kubectl("logs", name).stdout.splitlines()
    assert current[0].startswith("tessera-runtime: started container"), current
    stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{name}")


def test_only_the_pods_node_writes_its_log_and_only_its_tenant_reads_it(stack: Stack) -> None:
    name = unique("own-")
    stack.run(name, stack.nodes[0])  # runs until deleted
    until(_phase(stack, name, "Running"), what="Running")
    path = f"/api/v1/namespaces/{stack.namespace}/pods/{name}/log"
    uid = stack.pod(name)["metadata"]["uid"]
    line = {"restartCount": 0, "lines": [{"time": "2026-12-04T10:00:00Z", "text": "forged"}]}
    db = Database(stack.database_url)
    try:
        other = unique("ot")
        assert stack.admin.post(
            "/apis/tessera.io/v1/tenants", json={"metadata": {"name": other}}
        ).is_success
        other_token = db.write(lambda s: auth.create_token(s, role="tenant", tenant=other)).value
    finally:
        db.dispose()
    intruder = httpx.Client(
        base_url=stack.server.url,
        headers={"Authorization": f"Bearer {other_token}"},
        verify=ssl.create_default_context(cafile=str(stack.server.ca)),
    )
    with intruder, _node_client(stack, stack.nodes[1]) as other_node:
        assert intruder.get(path).status_code == 403
        assert intruder.post(path, json=line).status_code == 403
        assert other_node.post(path, json=line).status_code == 403
        assert other_node.get(path).status_code == 403
    refused = stack.tenant.post(path, json=line)
    assert refused.status_code == 403, refused.text
    assert "only the node running a pod writes them" in refused.json()["message"]
    assert "forged" not in stack.tenant.get(path).text
    stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{name}")
    until(lambda: _stored(stack, uid) == 0, what="the log deleted with the pod")


def test_the_store_keeps_the_newest_lines_of_a_run_and_refuses_unbounded_batches(
    stack: Stack,
) -> None:
    node, name = stack.nodes[0], unique("fl-")
    stack.run(name, node, annotations={"tessera.io/run-seconds": "0.2"}, restartPolicy="Never")
    until(_phase(stack, name, "Succeeded"), what="Succeeded")
    path = f"/api/v1/namespaces/{stack.namespace}/pods/{name}/log"
    uid = stack.pod(name)["metadata"]["uid"]
    before = _stored(stack, uid)

    def batch(first: int, count: int) -> dict[str, Any]:
        lines = [
            {"time": "2026-12-04T10:00:00Z", "text": f"flood {i}"}
            for i in range(first, first + count)
        ]
        return {"restartCount": 1, "lines": lines}

    with _node_client(stack, node) as agent:
        # Refused batches write nothing.
        invented = agent.post(path, json={**batch(0, 1), "restartCount": 7})
        assert invented.status_code == 409 and "restarted 0 time(s)" in invented.text
        too_many = agent.post(path, json={"restartCount": 1, "lines": batch(0, 1001)["lines"]})
        assert too_many.status_code == 422, too_many.text
        too_long = agent.post(
            path, json={"lines": [{"time": "2026-12-04T10:00:00Z", "text": "x" * 20000}]}
        )
        assert too_long.status_code == 422
        bad_time = agent.post(path, json={"lines": [{"time": "yesterday", "text": "x"}]})
        assert bad_time.status_code == 422 and "lines[0].time" in bad_time.text
        wrong = agent.post(path, params={"container": "nope"}, json=batch(0, 1))
        assert wrong.status_code == 400 and "not valid for pod" in wrong.json()["message"]
        assert _stored(stack, uid) == before
        # A flood keeps the newest 50 (TESSERA_POD_LOG_MAX_LINES) of the run.
        for first in range(0, 120, 40):
            assert agent.post(path, json=batch(first, 40)).status_code == 201
    shown = stack.tenant.get(path).text.splitlines()
    assert shown == [f"flood {i}" for i in range(70, 120)]
    # The stored lines honour the query as the derived ones do.
    assert stack.tenant.get(path, params={"limitBytes": 12}).text == "flood 70\nflo"
    assert stack.tenant.get(path, params={"sinceTime": "2026-12-04T11:00:00Z"}).text == ""
    assert (
        stack.tenant.get(path, params={"sinceTime": "2026-12-04T09:00:00Z"}).text.count("\n") == 50
    )
    assert stack.tenant.get(path, params={"tailLines": 2}).text == "flood 118\nflood 119\n"
    # The run before it (the agent's run 0) is the previous one: kept with it, and no more
    # runs than those two whatever order batches come in.
    assert _stored(stack, uid) == 50 + before
    with _node_client(stack, node) as agent:
        assert agent.post(path, json={**batch(0, 1), "restartCount": 0}).status_code == 201
    assert _stored(stack, uid) == 50 + before + 1
    stack.tenant.delete(f"/api/v1/namespaces/{stack.namespace}/pods/{name}")
