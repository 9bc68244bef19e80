"""exec, attach and port-forward: not offered, and said so in words, over HTTP and WebSocket
(real HTTP and real WebSocket upgrades, SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.api.test_pod_updates import bound_pod
from tests.conftest import Api
from tests.factories import pod

SUBRESOURCES = ("exec", "attach", "portforward")


def upgrade(api: Api, path: str, token: str | None = None) -> tuple[int, dict]:
    """Open a WebSocket as kubectl does; returns the refusing answer's code and Status."""
    url = str(api.base_url).replace("http://", "ws://") + path
    headers = {"Authorization": f"Bearer {token or api.token}"}
    with (
        pytest.raises(InvalidStatus) as refused,
        connect(url, additional_headers=headers, open_timeout=10),
    ):
        pass
    response = refused.value.response
    return response.status_code, json.loads(response.body)


@pytest.mark.parametrize("bound", [False, True], ids=["pending", "bound"])
def test_each_interactive_subresource_says_it_is_not_offered(tenant, admin, bound) -> None:
    ns = tenant.tenant
    if bound:
        bound_pod(tenant, admin, "shell")
    else:
        assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("shell")).status_code == 201
    for sub in SUBRESOURCES:
        path = f"/api/v1/namespaces/{ns}/pods/shell/{sub}"
        for method in ("GET", "POST"):
            answer = tenant.request(method, path, params={"command": "ls", "stdout": "true"})
            status = answer.json()
            assert answer.status_code == 400, answer.text
            assert status["kind"] == "Status" and status["reason"] == "BadRequest"
            assert "not offered" in status["message"] and "without interactive" in status["message"]
        code, status = upgrade(tenant, path + "?command=ls&stdout=true")
        assert code == 400 and "not offered" in status["message"], status
    # the pod is untouched by any of it
    after = tenant.get(f"/api/v1/namespaces/{ns}/pods/shell").json()
    assert after["status"]["phase"] == "Pending"
    assert bool(after["spec"].get("nodeName")) is bound


def test_the_usual_answers_come_first_over_http_and_websocket(tenant, make_tenant) -> None:
    ns = tenant.tenant
    other = make_tenant()
    assert (
        other.post(f"/api/v1/namespaces/{other.tenant}/pods", json=pod("theirs")).status_code == 201
    )
    missing = f"/api/v1/namespaces/{ns}/pods/nothing/exec?command=ls"
    assert tenant.post(missing).status_code == 404
    assert upgrade(tenant, missing)[0] == 404
    foreign = f"/api/v1/namespaces/{other.tenant}/pods/theirs/exec?command=ls"
    assert tenant.post(foreign).status_code == 403
    code, status = upgrade(tenant, foreign)
    assert code == 403 and status["reason"] == "Forbidden"
    code, status = upgrade(tenant, missing, token="tsr_0000000000000000_nope")
    assert code == 401 and status["kind"] == "Status"


def test_a_websocket_to_any_other_path_is_refused_at_once(tenant) -> None:
    ns = tenant.tenant
    started = time.monotonic()
    # a watch would stream for ever over HTTP; over a WebSocket it is refused at once
    code, status = upgrade(tenant, f"/api/v1/namespaces/{ns}/pods?watch=true")
    assert code == 400 and "plain HTTP only" in status["message"]
    assert time.monotonic() - started < 10
    code, status = upgrade(tenant, "/api/v1/no/such/path")
    assert code == 404 and status["kind"] == "Status"
