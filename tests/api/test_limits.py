"""A request cannot stall or bloat the server: HTTP limits, watch limits, dry runs.

The HTTP limits are checked with raw sockets (a well-behaved client library would never send
what an attacker does); the watch limits with real streams from a server whose limits are small
enough to observe. Runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.auth import service as auth
from app.auth import tokens
from app.pods import service as pods
from app.settings import Settings
from tests.api.test_hostile_input import store_state, writes_nothing
from tests.api.test_pod_updates import bound_pod
from tests.conftest import Api, ThreadedServer, unique
from tests.factories import pod


def connect(server: ThreadedServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, json.loads(body[:length])


def test_a_huge_content_length_is_413_before_the_body_is_read(server, tenant) -> None:
    sock = connect(server)
    sock.sendall(
        f"POST /api/v1/namespaces/{tenant.tenant}/pods HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {tenant.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {150 * 1024 * 1024}\r\n\r\n{{".encode()
    )
    status, body = read_response(sock)  # answered without the other 150 MB
    assert status == 413 and body["reason"] == "RequestEntityTooLarge"
    assert "at most 3145728 bytes" in body["message"]
    sock.close()


def _kernel_receive_buffer_max() -> int:
    """How much a peer's kernel may buffer for a socket that has stopped reading."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 32 * 1024 * 1024


def test_a_streamed_body_is_counted_and_cut_at_the_limit(server, tenant) -> None:
    # What the client gets to send before it sees the connection closed is the 3 MiB limit plus
    # whatever the kernels buffer on the way (the server's receive buffer grows to tcp_rmem's
    # maximum when the machine is busy), so the test sends well past both: a server that read
    # the whole body would never close on it.
    limit = 3 * 1024 * 1024
    budget = limit + _kernel_receive_buffer_max() + 8 * 1024 * 1024
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)  # no send-side autotuning
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(
        f"POST /api/v1/namespaces/{tenant.tenant}/pods HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {tenant.token}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b"x" * 65536
    sent = 0
    with pytest.raises(ConnectionError):  # reset or broken pipe: the server closed, not stalled
        while sent < budget:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    assert limit < sent < budget
    sock.close()


def test_oversized_headers_are_431_even_unauthenticated(server) -> None:
    sock = connect(server)
    try:
        sock.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(40):  # 2.5 MiB of one header, in pieces
            sock.sendall(b"a" * 65536)
    except OSError:
        pass  # closed by the server once the limit was passed
    status, body = read_response(sock)
    assert status == 431 and body["reason"] == "RequestHeaderFieldsTooLarge"
    sock.close()


# --- a server with limits small enough to watch them act ------------------------------------


def server_with(db, tmp_path_factory, name: str, **settings: object) -> Iterator[ThreadedServer]:
    """A test server of its own on the session's database, with these settings."""
    with ThreadedServer(
        Settings(
            data_dir=tmp_path_factory.mktemp(name),
            database_url=str(db.url.render_as_string(hide_password=False)),
            rate_limit_per_second=0,
            **settings,  # type: ignore[arg-type]
        ),
        db,
    ) as running:
        yield running


def tenant_on(server: ThreadedServer, admin: Api) -> Api:
    """A new tenant (made through the admin API, which every server of the database shares)
    and a client of `server` with its token."""
    name = unique("s")
    assert admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}}).is_success
    token = server.services.db.write(lambda s: auth.create_token(s, role="tenant", tenant=name))
    return Api(server.url, token.value, tenant=name)


@pytest.fixture(scope="module")
def strict(db, tmp_path_factory) -> Iterator[ThreadedServer]:
    yield from server_with(
        db,
        tmp_path_factory,
        "strict",
        auth_cache_seconds=0,
        header_timeout_seconds=1,
        body_timeout_seconds=1,
        watch_min_timeout_seconds=2,
        watch_max_per_tenant=3,
    )


@pytest.fixture
def strict_tenant(strict: ThreadedServer, admin) -> Api:
    return tenant_on(strict, admin)


def test_slow_headers_and_slow_bodies_are_408(strict, strict_tenant) -> None:
    silent = connect(strict)  # connects and says nothing
    status, body = read_response(silent)
    assert status == 408 and "headers" in body["message"]

    slow = connect(strict)
    slow.sendall(
        f"POST /api/v1/namespaces/{strict_tenant.tenant}/pods HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {strict_tenant.token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{".encode()
    )
    started = time.monotonic()
    status, body = read_response(slow)
    assert status == 408 and "body" in body["message"]
    assert time.monotonic() - started < 10
    # the server still serves everyone else
    assert strict_tenant.get(f"/api/v1/namespaces/{strict_tenant.tenant}/pods").status_code == 200


def watch_lines(api: Api, params: dict, read_for: float = 30) -> Iterator[dict]:
    url = f"/api/v1/namespaces/{api.tenant}/pods"
    with api.http.stream("GET", url, params={"watch": "true", **params}, timeout=read_for) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                yield json.loads(line)


def test_watches_end_within_twice_the_minimum_whatever_timeoutSeconds_asks(strict_tenant) -> None:
    started = time.monotonic()
    events = list(watch_lines(strict_tenant, {"timeoutSeconds": 3600}))
    lasted = time.monotonic() - started
    assert 1.5 <= lasted < 6, lasted
    assert events == []  # nothing in the namespace: no events, then the stream ended


def test_a_tenant_may_hold_only_so_many_watches(strict, strict_tenant) -> None:
    url = f"/api/v1/namespaces/{strict_tenant.tenant}/pods"
    clients = [
        httpx.Client(base_url=strict.url, headers=strict_tenant.http.headers) for _ in range(4)
    ]
    streams = []
    try:
        for client in clients[:3]:
            stream = client.stream("GET", url, params={"watch": "true"})
            response = stream.__enter__()
            assert response.status_code == 200
            streams.append(stream)
        refused = clients[3].get(url, params={"watch": "true"})
        assert refused.status_code == 429 and "3 watches" in refused.json()["message"]
        assert strict_tenant.get(url).status_code == 200  # lists are not watches
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    deadline = time.monotonic() + 10
    while strict.services.watches.open_watches() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert strict.services.watches.open_watches() == 0  # every slot came back
    again = httpx.Client(base_url=strict.url, headers=strict_tenant.http.headers)
    with again.stream("GET", url, params={"watch": "true", "timeoutSeconds": 1}) as response:
        assert response.status_code == 200
    again.close()


def test_a_watch_ends_when_its_token_is_revoked(strict, strict_tenant) -> None:
    key_id = strict_tenant.token.split("_")[1]
    seen: list[dict] = []

    def watch() -> None:
        seen.extend(watch_lines(strict_tenant, {"timeoutSeconds": 60}))

    thread = threading.Thread(target=watch)
    thread.start()
    time.sleep(0.5)
    strict.services.db.write(lambda s: auth.revoke_token(s, key_id=key_id))
    thread.join(timeout=10)
    assert not thread.is_alive(), "the watch outlived its token"
    assert seen and seen[-1]["type"] == "ERROR" and seen[-1]["object"]["code"] == 401


@pytest.fixture(scope="module")
def cached(db, tmp_path_factory) -> Iterator[ThreadedServer]:
    """A server that caches verified tokens for 2 s, as production does (for 10 s)."""
    yield from server_with(db, tmp_path_factory, "cached", auth_cache_seconds=2)


def test_watches_of_one_token_share_its_cached_check_and_end_once_it_is_revoked(
    cached: ThreadedServer, admin
) -> None:
    """Four watches of one token (as an agent's) check it every 2 s: one reads the database
    for all, the others take its cached answer; revoked, the token ends every watch within
    the cache's time (a cached answer is never older than that)."""
    api = tenant_on(cached, admin)
    authenticator = cached.services.authenticator
    reads: list[float] = []
    verify = authenticator.authenticate

    def counted(session, presented):  # type: ignore[no-untyped-def]
        if presented == api.token:
            reads.append(time.monotonic())
        return verify(session, presented)

    authenticator.authenticate = counted  # type: ignore[method-assign]
    seen: list[list[dict]] = [[] for _ in range(4)]

    def watch(i: int) -> None:
        seen[i].extend(watch_lines(api, {"timeoutSeconds": 60}, read_for=60))

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(4)]
    try:
        for thread in threads:  # 0.5 s apart: their checks come in turn, not at one instant
            thread.start()
            time.sleep(0.5)
        time.sleep(4)  # two rounds of checks of the four watches: eight checks
        # each round's first check reads (the cached answer has expired), the others take it
        assert 1 <= len(reads) <= 5, f"{len(reads)} reads of the token for 8 checks"
        revoked = time.monotonic()
        parts = tokens.split(api.token)
        assert parts is not None
        cached.services.db.write(lambda s: auth.revoke_token(s, key_id=parts[0]))
        for thread in threads:
            thread.join(timeout=15)
            assert not thread.is_alive(), "a watch outlived its token"
        ended = time.monotonic() - revoked
    finally:
        authenticator.authenticate = verify  # type: ignore[method-assign]
    assert all(events and events[-1]["object"]["code"] == 401 for events in seen), seen
    # not at their timeout (60 s): at a check, once the cached answer had expired
    assert ended < 10, f"the watches ended {ended:.1f} s after the revocation"


def running_pod(strict: ThreadedServer, api: Api, name: str) -> str:
    """A pod Running on a fresh node of the strict server (no agent: its log is derived from
    its status, and a follow streams until the pod ends); returns its log's URL."""
    token = strict.services.db.write(lambda s: auth.create_token(s, role="admin"))
    admin = Api(strict.url, token.value)
    bound = bound_pod(api, admin, name)
    strict.services.db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))
    return f"/api/v1/namespaces/{api.tenant}/pods/{name}/log"


def test_log_follows_count_with_watches(strict, strict_tenant) -> None:
    """A tenant's open streams are bounded together: follows cannot crowd the API as 200
    `logs -f` from one tenant once slowed another's requests twentyfold."""
    log_url = running_pod(strict, strict_tenant, "followed")
    watch_url = f"/api/v1/namespaces/{strict_tenant.tenant}/pods"
    clients = [
        httpx.Client(base_url=strict.url, headers=strict_tenant.http.headers) for _ in range(5)
    ]
    streams = []
    try:
        for client, (url, params) in zip(
            clients,
            [
                (log_url, {"follow": "true"}),
                (log_url, {"follow": "true"}),
                (watch_url, {"watch": "1"}),
            ],
            strict=False,
        ):
            stream = client.stream("GET", url, params=params)
            assert stream.__enter__().status_code == 200
            streams.append(stream)
        for refused, params in ((clients[3], {"follow": "true"}),):
            response = refused.get(log_url, params=params)
            assert response.status_code == 429, response.text
            assert "log follows" in response.json()["message"]
        refused_watch = clients[4].get(watch_url, params={"watch": "1"})
        assert refused_watch.status_code == 429
        # a plain read of the log is not a stream
        assert strict_tenant.get(log_url).status_code == 200
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    deadline = time.monotonic() + 10
    while strict.services.watches.open_watches() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert strict.services.watches.open_watches() == 0


def test_a_log_follow_ends_when_its_token_is_revoked(server, admin, make_tenant) -> None:
    """On the shared server (streams last 30 minutes; tokens checked every second)."""
    api = make_tenant("r")
    bound = bound_pod(api, admin, "revoked")
    server.services.db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))
    url = f"/api/v1/namespaces/{api.tenant}/pods/revoked/log"
    got: list[str] = []

    def follow() -> None:
        with api.http.stream("GET", url, params={"follow": "true"}, timeout=60) as response:
            assert response.status_code == 200
            got.extend(line for line in response.iter_lines() if line)

    thread = threading.Thread(target=follow)
    thread.start()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got, "the follow sent nothing"
    server.services.db.write(lambda s: auth.revoke_token(s, key_id=api.token.split("_")[1]))
    thread.join(timeout=10)
    assert not thread.is_alive(), "the log follow outlived its token"


def test_dry_runs_write_nothing_not_even_to_the_wal(server, tenant, database_url) -> None:
    big = pod("dry", cpu="1", memory="2Gi")
    big["spec"]["containers"][0]["args"] = ["x" * 1000] * 2500  # 2.5 MB
    sqlite = database_url.startswith("sqlite")
    wal = Path(database_url.removeprefix("sqlite:///") + "-wal")
    if sqlite:  # start from an empty WAL, so that any page a dry run writes shows
        with server.services.db.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    before = wal.stat().st_size if sqlite else 0
    with writes_nothing(server):
        for _ in range(10):
            response = tenant.post(
                f"/api/v1/namespaces/{tenant.tenant}/pods", json=big, params={"dryRun": "All"}
            )
            assert response.status_code == 201, response.text[:300]
    if sqlite:
        assert wal.stat().st_size - before < 256 * 1024, (before, wal.stat().st_size)
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/dry").status_code == 404
    assert store_state(server)  # the store still answers
