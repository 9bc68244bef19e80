"""exec, attach and port-forward as the API serves them: the checks every pod subresource makes,
the WebSocket subprotocols, and the relay between the user's session and the node's agent (a
test plays the agent: its control connection, then one connection per session), with the
bounds (sessions per tenant, frame size) and the ends (token revoked, pod deleted, no agent).
Real HTTP and real WebSockets, SQLite and PostgreSQL. tests/agent/test_sessions.py runs them
against real containers with kubectl and the Python client."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from app.auth import service as auth
from app.auth import tokens
from tests.api.test_pod_updates import bound_pod
from tests.conftest import Api
from tests.factories import pod

SUBRESOURCES = ("exec", "attach", "portforward")
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"


def ws_url(api: Api, path: str) -> str:
    return str(api.base_url).replace("http://", "ws://") + path


def upgrade(api: Api, path: str, token: str | None = None, **kwargs: Any) -> tuple[int, dict]:
    """Open a WebSocket as kubectl does; returns the refusing answer's code and Status."""
    headers = {"Authorization": f"Bearer {token or api.token}"}
    with (
        pytest.raises(InvalidStatus) as refused,
        connect(ws_url(api, path), additional_headers=headers, open_timeout=30, **kwargs),
    ):
        pass
    response = refused.value.response
    return response.status_code, json.loads(response.body)


def open_ws(api: Api, path: str, *, token: str | None = None, **kwargs: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token or api.token}"}
    return connect(ws_url(api, path), additional_headers=headers, open_timeout=30, **kwargs)


def frames_until_close(ws: ClientConnection, timeout: float = 20) -> list[bytes]:
    got = []
    try:
        with contextlib.suppress(ConnectionClosed):
            while True:
                got.append(ws.recv(timeout=timeout))
    finally:
        ws.close()
    return got


def status_of(frames: list[bytes]) -> dict:
    (status,) = [json.loads(f[1:]) for f in frames if f[:1] == b"\x03"]
    return status


@pytest.fixture
def node_pod(tenant: Api, admin: Api, make_node_agent) -> Iterator[tuple[str, str, Api]]:
    """A pod bound to a fresh node, and that node's agent (its token)."""
    made = bound_pod(tenant, admin, "shell")
    node = made["spec"]["nodeName"]
    yield "shell", node, make_node_agent(node)


@contextlib.contextmanager
def agent_control(agent: Api, node: str) -> Iterator[ClientConnection]:
    with open_ws(agent, f"/api/v1/nodes/{node}/sessions") as control:
        yield control


def exec_path(tenant: Api, name: str, query: str = "command=cat&stdin=true&stdout=true") -> str:
    return f"/api/v1/namespaces/{tenant.tenant}/pods/{name}/exec?{query}"


def test_a_session_is_relayed_between_the_user_and_the_nodes_agent(tenant, node_pod) -> None:
    name, node, agent = node_pod
    with agent_control(agent, node) as control:
        path = exec_path(tenant, name, "command=sh&command=-c&command=cat&stdin=true&stdout=true")
        with open_ws(tenant, path, subprotocols=[V5, V4]) as user:
            assert user.subprotocol == V5
            offer = json.loads(control.recv(timeout=10))
            assert offer["kind"] == "exec" and offer["command"] == ["sh", "-c", "cat"]
            assert offer["container"] == "main" and offer["stdin"] and offer["stdout"]
            assert offer["namespace"] == tenant.tenant and offer["pod"] == name
            with open_ws(agent, f"/api/v1/nodes/{node}/sessions/{offer['id']}") as carrier:
                user.send(b"\x00hello")
                assert carrier.recv(timeout=10) == b"\x00hello"
                user.send(b"\xff\x00")  # v5: stdin closed
                assert carrier.recv(timeout=10) == b"\xff\x00"
                carrier.send(b"\x01HELLO")
                assert user.recv(timeout=10) == b"\x01HELLO"
                carrier.send(b'\x03{"metadata":{},"status":"Success"}')
                carrier.close()
            frames = frames_until_close(user)
    assert status_of(frames)["status"] == "Success"


def test_an_older_client_gets_v4_and_a_client_of_no_known_protocol_a_status(
    tenant, node_pod
) -> None:
    name, node, agent = node_pod
    with (
        agent_control(agent, node),
        open_ws(tenant, exec_path(tenant, name), subprotocols=[V4]) as user,
    ):
        assert user.subprotocol == V4
    code, status = upgrade(tenant, exec_path(tenant, name), subprotocols=["base64.channel.k8s.io"])
    assert code == 400 and V5 in status["message"] and V4 in status["message"]


def test_the_agent_of_another_node_or_a_tenant_cannot_take_sessions(
    tenant, node_pod, make_node_agent
) -> None:
    _name, node, _agent = node_pod
    stranger = make_node_agent("another-node")
    for who in (stranger, tenant):
        code, status = upgrade(who, f"/api/v1/nodes/{node}/sessions")
        assert code == 403 and f'agent of node "{node}"' in status["message"]
        code, _ = upgrade(who, f"/api/v1/nodes/{node}/sessions/some-id")
        assert code == 403


def test_without_its_agent_a_session_says_so(tenant, node_pod) -> None:
    name, node, _agent = node_pod
    with open_ws(tenant, exec_path(tenant, name), subprotocols=[V5]) as user:
        status = status_of(frames_until_close(user))
    assert status["code"] == 503 and f'agent of node "{node}" is not connected' in status["message"]


def test_a_session_ends_when_its_token_is_revoked_or_its_pod_is_deleted(
    server, tenant, admin, node_pod, make_tenant
) -> None:
    name, node, agent = node_pod
    settings = server.services.settings
    settings.session_check_seconds, before = 0.1, settings.session_check_seconds
    try:
        user_token = server.services.db.write(
            lambda s: auth.create_token(s, role="tenant", tenant=tenant.tenant)
        ).value
        with agent_control(agent, node) as control:
            with open_ws(
                tenant, exec_path(tenant, name), token=user_token, subprotocols=[V5]
            ) as user:
                offer = json.loads(control.recv(timeout=10))
                with open_ws(agent, f"/api/v1/nodes/{node}/sessions/{offer['id']}") as carrier:
                    key = tokens.split(user_token)[0]  # type: ignore[index]
                    server.services.db.write(lambda s: auth.revoke_token(s, key_id=key))
                    status = status_of(frames_until_close(user))
                    assert status["code"] == 401 and "revoked" in status["message"]
                    with pytest.raises(ConnectionClosed):  # the agent's side ends too
                        while True:
                            carrier.recv(timeout=10)
            with open_ws(tenant, exec_path(tenant, name), subprotocols=[V5]) as user:
                offer = json.loads(control.recv(timeout=10))
                with open_ws(agent, f"/api/v1/nodes/{node}/sessions/{offer['id']}"):
                    deleted = admin.delete(
                        f"/api/v1/namespaces/{tenant.tenant}/pods/{name}",
                        params={"gracePeriodSeconds": 0},
                    )
                    assert deleted.status_code == 200, deleted.text
                    status = status_of(frames_until_close(user))
                    assert status["code"] == 404 and "deleted" in status["message"]
    finally:
        settings.session_check_seconds = before


def test_sessions_are_bounded_per_tenant_and_in_frame_size(server, tenant, node_pod) -> None:
    name, node, agent = node_pod
    settings = server.services.settings
    saved = settings.session_max_per_tenant, settings.session_max_frame_bytes
    settings.session_max_per_tenant, settings.session_max_frame_bytes = 1, 1024
    try:
        with agent_control(agent, node) as control:
            with open_ws(tenant, exec_path(tenant, name), subprotocols=[V5]) as user:
                code, status = upgrade(tenant, exec_path(tenant, name), subprotocols=[V5])
                assert code == 429 and "TESSERA_SESSION_MAX_PER_TENANT" in status["message"]
                offer = json.loads(control.recv(timeout=10))
                with open_ws(agent, f"/api/v1/nodes/{node}/sessions/{offer['id']}"):
                    user.send(b"\x00" + b"x" * 2048)
                    status = status_of(frames_until_close(user))
                    assert status["code"] == 413 and "at most 1024 bytes" in status["message"]
            # the session ended: its place is free again
            deadline = time.monotonic() + 10
            while True:
                try:
                    with open_ws(tenant, exec_path(tenant, name), subprotocols=[V5]):
                        break
                except InvalidStatus:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
    finally:
        settings.session_max_per_tenant, settings.session_max_frame_bytes = saved


def test_an_idle_session_ends(server, tenant, node_pod) -> None:
    name, node, agent = node_pod
    settings = server.services.settings
    saved = settings.session_idle_seconds, settings.session_check_seconds
    settings.session_idle_seconds, settings.session_check_seconds = 0.5, 0.1
    try:
        with (
            agent_control(agent, node) as control,
            open_ws(tenant, exec_path(tenant, name), subprotocols=[V5]) as user,
        ):
            offer = json.loads(control.recv(timeout=10))
            with open_ws(agent, f"/api/v1/nodes/{node}/sessions/{offer['id']}"):
                status = status_of(frames_until_close(user))
        assert status["code"] == 408 and "idle for 0.5s" in status["message"]
    finally:
        settings.session_idle_seconds, settings.session_check_seconds = saved


def test_the_usual_answers_come_first_over_http_and_websocket(tenant, make_tenant) -> None:
    ns = tenant.tenant
    other = make_tenant()
    assert (
        other.post(f"/api/v1/namespaces/{other.tenant}/pods", json=pod("theirs")).status_code == 201
    )
    missing = f"/api/v1/namespaces/{ns}/pods/nothing/exec?command=ls&stdout=true"
    assert tenant.post(missing).status_code == 404
    assert upgrade(tenant, missing, subprotocols=[V5])[0] == 404
    foreign = f"/api/v1/namespaces/{other.tenant}/pods/theirs/exec?command=ls&stdout=true"
    assert tenant.post(foreign).status_code == 403
    code, status = upgrade(tenant, foreign, subprotocols=[V5])
    assert code == 403 and status["reason"] == "Forbidden"
    code, status = upgrade(tenant, missing, token="tsr_0000000000000000_nope")
    assert code == 401 and status["kind"] == "Status"
    # a pod not yet on a node has nothing to run a session
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("waiting")).status_code == 201
    for sub in SUBRESOURCES:
        path = f"/api/v1/namespaces/{ns}/pods/waiting/{sub}?command=ls&stdout=true&ports=80"
        code, status = upgrade(tenant, path, subprotocols=[V5, V4])
        assert code == 400 and "does not have a host assigned" in status["message"], status


def test_plain_http_and_bad_parameters_are_answered_in_words(tenant, node_pod) -> None:
    name, _node, _agent = node_pod
    base = f"/api/v1/namespaces/{tenant.tenant}/pods/{name}"
    for sub in SUBRESOURCES:
        answer = tenant.post(
            f"{base}/{sub}", params={"command": "ls", "stdout": "true", "ports": "80"}
        )
        if sub == "portforward":  # kubectl's fallback: why its WebSocket was refused
            assert answer.status_code == 503, answer.text
            assert "is not connected: it cannot run port-forward" in answer.json()["message"]
            continue
        assert answer.status_code == 400 and "WebSocket only" in answer.json()["message"]
    cases = {
        "exec?stdout=true": "at least 1 command",
        "exec?command=ls": "at least one of stdin, stdout, stderr",
        "exec?command=ls&stdout=true&container=nope": "container nope is not valid",
        "portforward": "at least one port",
        "portforward?ports=99999": "between 1 and 65535",
    }
    for query, words in cases.items():
        code, status = upgrade(tenant, f"{base}/{query}", subprotocols=[V5, V4])
        assert code == 400 and words in status["message"], (query, status)


def test_a_websocket_to_any_other_path_is_refused_at_once(tenant) -> None:
    ns = tenant.tenant
    started = time.monotonic()
    # a watch would stream for ever over HTTP; over a WebSocket it is refused at once
    code, status = upgrade(tenant, f"/api/v1/namespaces/{ns}/pods?watch=true")
    assert code == 400 and "plain HTTP only" in status["message"]
    assert time.monotonic() - started < 10
    code, status = upgrade(tenant, "/api/v1/no/such/path")
    assert code == 404 and status["kind"] == "Status"
