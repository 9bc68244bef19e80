"""The console's session and gateway over plain HTTP: what a request without the session's
cookie, its CSRF value or a same-origin browser gets; no state-changing GET; no token in a log."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.ui.conftest import Dev

# One tessera dev for all of them (with pytest-xdist: on one worker).
pytestmark = pytest.mark.xdist_group("console")


def session_client(dev: Dev, token: str) -> tuple[httpx.Client, dict[str, Any]]:
    client = httpx.Client(base_url=dev.url, verify=dev.verify, timeout=20)
    answer = client.post("/ui/login", json={"token": token}, headers={"Origin": dev.url})
    assert answer.status_code == 200, answer.text
    return client, answer.json()


def test_gateway_needs_the_cookie_and_the_csrf_value(dev: Dev) -> None:
    name, token = dev.tenant()
    client, who = session_client(dev, token)
    assert who == {
        "user": f"tessera:tenant:{name}",
        "role": "tenant",
        "tenant": name,
        "csrf": who["csrf"],
    }
    path = f"/ui/api/api/v1/namespaces/{name}/pods"
    csrf = {"X-Tessera-CSRF": who["csrf"]}
    assert client.get(path, headers=csrf).status_code == 200
    assert client.get(path).status_code == 403  # no CSRF value
    assert client.get(path, headers={"X-Tessera-CSRF": "guess"}).status_code == 403
    cross = {**csrf, "Sec-Fetch-Site": "cross-site"}
    assert client.get(path, headers=cross).status_code == 403
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    assert client.post(path, json=body).status_code == 403  # nothing created
    assert dev.client(token).get(f"/api/v1/namespaces/{name}/pods/x").status_code == 404

    anonymous = httpx.Client(base_url=dev.url, verify=dev.verify, timeout=20)
    assert anonymous.get(path, headers=csrf).status_code == 401
    cookie = client.cookies["tessera_console"]
    forged = cookie[:-6] + ("AAAAAA" if not cookie.endswith("AAAAAA") else "BBBBBB")
    anonymous.cookies.set("tessera_console", forged, domain="127.0.0.1", path="/ui")
    assert anonymous.get(path, headers=csrf).status_code == 401

    # The gateway forwards to the API's paths only.
    assert client.get("/ui/api/ui/session", headers=csrf).status_code == 404
    # What the API refuses, the gateway refuses the same way.
    answer = client.get("/ui/api/api/v1/nodes/nope", headers=csrf)
    direct = dev.client(token).get("/api/v1/nodes/nope")
    assert (answer.status_code, answer.json()["message"]) == (
        direct.status_code,
        direct.json()["message"],
    )


def test_no_state_changing_get_and_login_only_from_the_console(dev: Dev) -> None:
    _, token = dev.tenant()
    client, _ = session_client(dev, token)
    assert client.get("/ui/logout").status_code == 405
    assert client.get("/ui/session").status_code == 200  # still logged in
    plain = httpx.Client(base_url=dev.url, verify=dev.verify, timeout=20)
    elsewhere = plain.post(
        "/ui/login", json={"token": token}, headers={"Origin": "https://evil.example"}
    )
    assert elsewhere.status_code == 403 and "set-cookie" not in elsewhere.headers
    assert plain.post("/ui/login", json={"token": token}).status_code == 403  # no Origin
    node = dev.admin.post(
        "/apis/tessera.io/v1/nodetokens",
        json={"apiVersion": "tessera.io/v1", "kind": "NodeToken", "node": "console-test-node"},
    )
    assert node.status_code == 201, node.text
    answer = plain.post(
        "/ui/login", json={"token": node.json()["token"]}, headers={"Origin": dev.url}
    )
    assert answer.status_code == 403
    # A logout without the CSRF value is refused; with it, the cookie is cleared.
    assert client.post("/ui/logout", headers={"Origin": dev.url}).status_code == 403
    csrf = client.get("/ui/session").json()["csrf"]
    answer = client.post("/ui/logout", headers={"Origin": dev.url, "X-Tessera-CSRF": csrf})
    assert answer.status_code == 204
    assert 'tessera_console=""' in answer.headers["set-cookie"]


def test_every_console_answer_has_the_security_headers(dev: Dev) -> None:
    _, token = dev.tenant()
    client, who = session_client(dev, token)
    for path in ("/ui/login", "/ui/pods", "/ui/pool", "/docs", "/ui/static/console.js"):
        answer = client.get(path)
        assert answer.status_code == 200, path
        csp = answer.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "unsafe-inline" not in csp, path
        assert "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp, path
        assert answer.headers["x-content-type-options"] == "nosniff"
    answer = client.get("/ui/api/api/v1/pods", headers={"X-Tessera-CSRF": who["csrf"]})
    assert answer.headers["cache-control"] == "no-store"
    assert "content-security-policy" in answer.headers


def test_the_token_is_in_no_log(dev: Dev) -> None:
    name, token = dev.tenant()
    client, who = session_client(dev, token)
    csrf = {"X-Tessera-CSRF": who["csrf"]}
    client.get(f"/ui/api/api/v1/namespaces/{name}/pods", headers=csrf)
    client.get("/ui/pods")
    bad = httpx.post(
        f"{dev.url}/ui/login",
        json={"token": token + "x"},
        headers={"Origin": dev.url},
        verify=dev.verify,
    )
    assert bad.status_code == 401
    log = dev.log.read_text()
    secret = token[len("tsr_") + 16 + 1 :]  # tsr_<16 hex key id>_<secret>
    assert len(secret) >= 20 and secret[:20] not in log
