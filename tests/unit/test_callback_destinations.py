"""Where callbacks may point: https or loopback URLs on create, and at every attempt only public
addresses or those the operator allows, checked on the address connected to (no DNS rebinding);
never the control plane's own loopback unless allowed, never an IPv4 address in disguise."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.callbacks.delivery import Claimed, DeliveryConfig, backoff_seconds, fair_share, send
from app.callbacks.destinations import Allowed, Refused, check_url, resolve_allowed
from app.callbacks.signing import verify
from app.tls import ensure_tls
from tests.receiver import Receiver


def claimed(url: str) -> Claimed:
    return Claimed(
        tenant_id=1,
        uid="d1",
        event_id="e1",
        type="PodFinished",
        subject="namespaces/a/pods/b",
        at=datetime(2026, 1, 1, tzinfo=UTC),
        data={"phase": "Succeeded"},
        attempts=0,
        url=url,
        secret="whsec_x",
        lease_until=datetime(2026, 1, 1, tzinfo=UTC),
    )


LOOPBACK = Allowed("127.0.0.0/8,::1/128,localhost")
CONFIG = DeliveryConfig(source="https://tessera.example", timeout_seconds=2, allowed=LOOPBACK)
SERVE = DeliveryConfig(source="https://tessera.example", timeout_seconds=2)  # allows nothing


@pytest.mark.parametrize(
    "addresses",
    [
        ["10.0.0.7"],
        ["8.8.8.8", "192.168.1.1"],
        ["169.254.169.254"],
        ["::ffff:10.0.0.1"],
        ["fe80::1"],
        ["0.0.0.0"],
        [],
    ],
)
def test_a_name_resolving_to_any_private_address_is_refused(addresses: list[str]) -> None:
    with pytest.raises(Refused):
        resolve_allowed("hooks.example.test", 443, lambda host, port: addresses)
    outcome = send(claimed("https://hooks.example.test/x"), CONFIG, resolve=lambda h, p: addresses)
    assert not outcome.ok and outcome.error and outcome.error.startswith("refused destination")
    assert outcome.response_code is None


def test_public_addresses_are_allowed_and_loopback_only_when_the_operator_allows_it() -> None:
    assert resolve_allowed("h", 443, lambda h, p: ["8.8.8.8", "2001:4860:4860::8888"]) == [
        "8.8.8.8",
        "2001:4860:4860::8888",
    ]
    assert resolve_allowed("127.0.0.1", 80, allowed=LOOPBACK) == ["127.0.0.1"]
    assert resolve_allowed("localhost", 80, allowed=LOOPBACK)  # the system's resolver
    for host in ("127.0.0.1", "localhost", "[::1]"):
        with pytest.raises(Refused, match="TESSERA_CALLBACK_ALLOWED_DESTINATIONS"):
            resolve_allowed(host, 80)
    # a name in /etc/hosts (or any DNS name) that resolves to loopback: the same
    with pytest.raises(Refused, match="loopback"):
        resolve_allowed("tessera-api.internal", 80, lambda h, p: ["127.0.0.1"])
    internal = Allowed("10.1.0.0/16,hooks.corp")
    assert resolve_allowed("h", 443, lambda h, p: ["10.1.2.3"], internal) == ["10.1.2.3"]
    assert resolve_allowed("hooks.corp", 443, lambda h, p: ["10.9.9.9"], internal)
    with pytest.raises(Refused):
        resolve_allowed("h", 443, lambda h, p: ["10.2.0.1"], internal)


@pytest.mark.parametrize(
    "host",
    [
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "[64:ff9b::a9fe:a9fe]",
        "[64:ff9b::7f00:1]",
        "[2002:a9fe:a9fe::]",
        "[::ffff:0:a9fe:a9fe]",
        "[::ffff:127.0.0.1]",
        "[::127.0.0.1]",
        "[2001:0:4136:e378:8000:63bf:3fff:fdd2]",
    ],
)
def test_ipv4_addresses_in_disguise_are_refused_everywhere(host: str) -> None:
    with pytest.raises(Refused):
        check_url(f"https://{host}/x")
    with pytest.raises(Refused):
        resolve_allowed(host.strip("[]"), 443, allowed=LOOPBACK)
    # and a name resolving to one of them
    if host.startswith("["):
        with pytest.raises(Refused):
            resolve_allowed("hooks.example.test", 443, lambda h, p: [host.strip("[]")])


def test_a_delivery_to_loopback_is_refused_on_a_server_that_allows_nothing() -> None:
    with Receiver() as receiver:
        outcome = send(claimed(f"http://127.0.0.1:{receiver.port}/x"), SERVE)
        assert not outcome.ok and "refused destination" in (outcome.error or "")
        assert receiver.requests == []


def test_failed_answers_and_connections_tell_nothing_of_the_receiver() -> None:
    """The record shows the status code only (not the reason text), and a connection failure
    the same words whatever the system said: no port scanning through the delivery records."""
    with Receiver() as receiver:
        receiver.plan(("answer", 418, "Open sesame: redis 7.2 on port 6379"))
        outcome = send(claimed(f"http://127.0.0.1:{receiver.port}/x"), CONFIG)
    assert outcome.response_code == 418 and outcome.error == "the receiver answered 418"
    closed = send(claimed(f"http://127.0.0.1:{receiver.port}/x"), CONFIG)
    assert closed.error == "the connection failed or closed before an answer"


def test_senders_are_shared_round_robin_across_tenants_with_a_cap_each() -> None:
    due = [(f"a{i}", 1) for i in range(40)] + [("b0", 2), ("b1", 2), ("c0", None)]
    assert fair_share(due, 8, 2, {}) == ["a0", "b0", "c0", "a1", "b1"]
    # a tenant already holding its share gets nothing more this pass
    assert fair_share(due, 8, 2, {1: 2}) == ["b0", "c0", "b1"]
    assert fair_share(due, 2, 8, {}) == ["a0", "b0"]


def test_plain_http_to_a_name_that_resolves_publicly_is_refused_at_send() -> None:
    outcome = send(claimed("http://localhost:9/x"), CONFIG, resolve=lambda h, p: ["8.8.8.8"])
    assert not outcome.ok and "plain http is refused" in (outcome.error or "")


def test_the_connection_goes_to_the_vetted_address_only() -> None:
    """The host name is resolved once, by the check, and the request goes to that address with
    the name as Host: a second resolution (a rebinding) never happens."""
    with Receiver() as receiver:
        calls: list[str] = []

        def resolve(host: str, port: int) -> list[str]:
            calls.append(host)
            return ["127.0.0.1"]

        outcome = send(
            claimed(f"http://hooks.example.test:{receiver.port}/in?x=1"), CONFIG, resolve=resolve
        )
        assert outcome.ok and outcome.response_code == 200, outcome
        (got,) = receiver.wait_for(1)
        assert calls == ["hooks.example.test"]
        assert got.path == "/in?x=1"
        assert got.headers["host"] == f"hooks.example.test:{receiver.port}"
        verify("whsec_x", got.body, got.headers["tessera-signature"])
        assert got.event["id"] == "e1" and got.event["time"] == "2026-01-01T00:00:00Z"


def test_an_unreachable_receiver_is_a_failed_attempt_not_an_error() -> None:
    with Receiver() as receiver:
        port = receiver.port
    outcome = send(claimed(f"http://127.0.0.1:{port}/x"), CONFIG)
    assert not outcome.ok and "connection failed" in (outcome.error or "")


@pytest.mark.parametrize(
    "url",
    ["https://hooks.example.com/", "http://127.0.0.1/", "http://[::1]/", "http://LOCALHOST:1/"],
)
def test_urls_accepted(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/",
        "http://10.0.0.1/",
        "https://[::ffff:192.168.0.1]/",
        "https://100.64.0.1/",
        "https://224.0.0.1/",
        "https://h:0/",
        "https://h:99999/",
        "https://h/ x",
        "file:///etc/passwd",
        "//h/x",
    ],
)
def test_urls_refused(url: str) -> None:
    with pytest.raises(Refused):
        check_url(url)


@given(
    attempts=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.01, max_value=3600),
    cap=st.floats(min_value=0.01, max_value=86400),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_doubles_up_to_its_bound_with_jitter(
    attempts: int, base: float, cap: float, seed: int
) -> None:
    config = DeliveryConfig(source="s", retry_base_seconds=base, retry_max_seconds=cap)
    ceiling = min(cap, base * 2 ** (attempts - 1))
    wait = backoff_seconds(attempts, config, random.Random(seed))
    assert ceiling / 2 <= wait <= ceiling


def test_https_receivers_are_verified_against_trusted_cas(tmp_path) -> None:
    """TLS to the vetted address, with the URL's name for SNI and the certificate check: a
    receiver whose CA is trusted (TESSERA_CALLBACK_CA_FILE) is delivered to, one whose CA is not
    is a failed attempt."""
    tls = ensure_tls(tmp_path / "tls", ["localhost", "127.0.0.1"])
    with Receiver(tls) as receiver:
        trusted = DeliveryConfig(
            source="s", timeout_seconds=2, ca_file=tls.ca_cert, allowed=LOOPBACK
        )
        outcome = send(claimed(receiver.url(host="localhost")), trusted)
        assert outcome.ok and outcome.response_code == 200, outcome
        (got,) = receiver.wait_for(1)
        assert got.headers["host"] == f"localhost:{receiver.port}"
        untrusted = send(claimed(receiver.url(host="localhost")), CONFIG)
        assert not untrusted.ok and "TLS failed" in (untrusted.error or ""), untrusted
        assert "CERTIFICATE_VERIFY_FAILED" in (untrusted.error or "")
