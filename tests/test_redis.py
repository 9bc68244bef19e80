"""What crosses processes through Redis: rate limits and change notifications (real Redis)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from sqlalchemy import select

from app.auth.service import Principal
from app.db import models
from app.errors import TooManyRequests
from app.ratelimit import RateLimiter
from app.settings import Settings
from app.watch.notify import CHANNEL, Notifier
from tests.conftest import REDIS_URL, Api, ThreadedServer, unavailable, unique
from tests.factories import pod


@pytest.fixture(scope="module")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        unavailable("Redis", str(exc))
    return REDIS_URL


def test_rate_limit_is_shared_by_every_process(redis_url: str) -> None:
    """Two limiters (two API processes) share one bucket per tenant through Redis: a burst of
    twice the rate at once, then the rate; the clock is the test's, so nothing sleeps."""
    tenant = Principal("tenant", 1, unique("rl"), "k")
    other = Principal("tenant", 2, unique("rl"), "k")
    t0 = 1_000_000.0

    async def scenario() -> tuple[list[bool], list[bool]]:
        first, second = RateLimiter(10, redis_url), RateLimiter(10, redis_url)

        async def allowed(at: float, n: int, who: Principal = tenant) -> list[bool]:
            out = []
            for i in range(n):
                try:
                    await (first if i % 2 else second).check(who, now=at)
                    out.append(True)
                except TooManyRequests as exc:
                    assert exc.retry_after == 1 and "10 requests per second" in exc.message
                    out.append(False)
            return out

        burst = await allowed(t0, 30)
        assert await allowed(t0, 1, other) == [True]  # another tenant has its own bucket
        later = await allowed(t0 + 0.5, 10)  # half a second refills five
        await first.close()
        await second.close()
        return burst, later

    burst, later = asyncio.run(scenario())
    assert burst == [True] * 20 + [False] * 10
    assert later == [True] * 5 + [False] * 5


@pytest.mark.parametrize("rate", [1.0, 3.0, 7.5])
def test_the_local_and_the_redis_bucket_decide_alike(redis_url: str, rate: float) -> None:
    """The same arrivals, through the in-process bucket and through Redis: the same answers."""
    import random

    chooser = random.Random(int(rate * 10))
    arrivals = []
    at = 2_000_000.0
    for _ in range(300):
        at += chooser.choice([0.0, 0.0, 0.01, 0.05, 0.2, 0.7])
        arrivals.append(at)
    key = unique("same")

    async def decide(limiter: RateLimiter) -> list[int]:
        waits = [await limiter.tenants.take(key, now=t) for t in arrivals]
        await limiter.close()
        return waits

    local = asyncio.run(decide(RateLimiter(rate, None)))
    shared = asyncio.run(decide(RateLimiter(rate, redis_url)))
    assert local == shared
    assert 0 < local.count(0) < len(arrivals)  # both allowed and refused some
    # Never more than the burst plus what the elapsed time refilled.
    span = arrivals[-1] - arrivals[0]
    assert local.count(0) <= 2 * rate + rate * span + 1


def test_admin_is_not_limited(redis_url: str) -> None:
    async def scenario() -> None:
        limiter = RateLimiter(1, redis_url)
        for _ in range(20):
            await limiter.check(Principal("admin", None, None, "k"))
        await limiter.close()

    asyncio.run(scenario())


def test_a_commit_in_one_process_wakes_watchers_in_another(redis_url: str) -> None:
    async def scenario() -> float:
        writer, watcher = Notifier(redis_url), Notifier(redis_url)
        await writer.start()
        await watcher.start()
        await asyncio.sleep(0.2)  # let the subscriptions settle
        started = time.monotonic()
        waiting = asyncio.create_task(watcher.wait(after=watcher.latest, timeout=5))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(writer.publish, 10**12)
        await waiting
        elapsed = time.monotonic() - started
        assert watcher.latest == 10**12
        await writer.stop()
        await watcher.stop()
        return elapsed

    assert asyncio.run(scenario()) < 4  # woken by the message, not by the 5 s timeout


def test_a_watcher_in_another_process_wakes_for_its_kinds_only(redis_url: str) -> None:
    async def scenario() -> None:
        writer, watcher = Notifier(redis_url), Notifier(redis_url)
        await writer.start()
        await watcher.start()
        await asyncio.sleep(0.2)  # let the subscriptions settle
        after = watcher.latest + 10**12
        pods = asyncio.create_task(watcher.wait(after=after, timeout=10, kinds=("Pod",)))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(writer.publish, after + 1, frozenset({"Lease"}))
        deadline = time.monotonic() + 5
        while watcher.newest(("Lease",)) <= after:  # the lease's message has arrived...
            assert time.monotonic() < deadline, "no message came through Redis"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not pods.done()  # ...and did not wake the watch of pods
        await asyncio.to_thread(writer.publish, after + 2, frozenset({"Pod"}))
        await asyncio.wait_for(pods, 5)
        assert watcher.newest(("Pod",)) == after + 2
        await writer.stop()
        await watcher.stop()

    asyncio.run(scenario())


def test_publishing_never_waits_for_redis() -> None:
    """A commit hands its version to the publishing thread and goes on: a Redis that does not
    answer (here, a socket that accepts and stays silent) holds up no writer."""
    silent = socket.create_server(("127.0.0.1", 0))
    notifier = Notifier(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    writer = threading.Thread(target=lambda: [notifier.publish(v) for v in range(1, 1001)])
    writer.start()
    writer.join(timeout=10)
    try:
        assert not writer.is_alive(), "a publish waited for Redis"
    finally:
        silent.close()  # the publishing thread's connection fails now; it logs and goes on


def test_commits_are_published_newest_last_and_never_going_back(redis_url: str) -> None:
    """Commits from several threads, faster than Redis round trips: what is published rises
    strictly and ends with the newest version (a watcher needs no more than that)."""
    listener = redis.Redis.from_url(redis_url).pubsub()
    listener.subscribe(CHANNEL)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    notifier = Notifier(redis_url)
    newest = 10**13 + 4000

    def commit(first: int) -> None:
        for version in range(first, newest + 1, 4):
            notifier.publish(version)

    threads = [threading.Thread(target=commit, args=(10**13 + 1 + i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    received: list[int] = []
    deadline = time.monotonic() + 10
    while (not received or received[-1] < newest) and time.monotonic() < deadline:
        message = listener.get_message(timeout=1)
        if message and message["type"] == "message" and int(message["data"]) > 10**13:
            received.append(int(message["data"]))
    asyncio.run(notifier.stop())
    listener.close()
    assert received and received[-1] == newest
    assert received == sorted(set(received))  # strictly rising
    assert len(received) < 4000  # commits made while one message was on its way went as one


@pytest.fixture
def limited_server(db, tmp_path, redis_url: str) -> Iterator[ThreadedServer]:
    # Every test server is 127.0.0.1 to Redis: start each with no failures counted there.
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter("tessera:ratelimit:auth-failures:*"):
        client.delete(key)
    client.close()
    settings = Settings(
        data_dir=tmp_path,
        redis_url=redis_url,
        rate_limit_per_second=1,
        auth_failures_per_second=2,
        node_rate_limit_per_second=1,
    )
    with ThreadedServer(settings, db) as running:
        yield running


def new_tenant(server: ThreadedServer, prefix: str) -> tuple[str, str]:
    """A tenant and a token for it, written straight to the server's database."""
    from app.auth import service as auth

    name = unique(prefix)
    server.services.db.write(lambda s: auth.create_tenant(s, name=name))
    token = server.services.db.write(lambda s: auth.create_token(s, role="tenant", tenant=name))
    return name, token.value


def test_the_api_answers_429_with_retry_after(limited_server: ThreadedServer) -> None:
    name, token = new_tenant(limited_server, "lim")
    client = Api(limited_server.url, token).http
    codes = [
        client.post(f"/api/v1/namespaces/{name}/pods", json=pod(f"p{i}")).status_code
        for i in range(3)
    ]
    assert codes == [201, 201, 429]  # a burst of two at one request per second
    refused = client.get(f"/api/v1/namespaces/{name}/pods")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert refused.json()["reason"] == "TooManyRequests"
    assert "bursts of 2" in refused.json()["message"]
    listed = limited_server.services.db.read(
        lambda s: (
            s.execute(select(models.Pod.name).where(models.Pod.namespace == name)).scalars().all()
        )
    )
    assert sorted(listed) == ["p0", "p1"]  # the refused create wrote nothing


def test_a_node_agent_has_a_rate_of_its_own_and_waits_out_its_429s(
    limited_server: ThreadedServer,
) -> None:
    from agent.client import NodeClient
    from app.auth import service as auth
    from app.inventory import service as inventory

    db = limited_server.services.db
    node, other = unique("rl-node-"), unique("rl-node-")
    for name in (node, other):
        spec = inventory.NodeSpec(name=name, cpu_milli=8000, memory_mib=32768, gpus=[])
        db.write(lambda s, spec=spec: inventory.create_node(s, spec))
    token = db.write(lambda s: auth.create_token(s, role="node", node=node)).value
    plain = Api(limited_server.url, token).http
    codes = [plain.get(f"/api/v1/nodes/{node}").status_code for _ in range(3)]
    assert codes == [200, 200, 429]  # one request per second, a burst of two
    refused = plain.get(f"/api/v1/nodes/{node}")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert f'node "{node}" may send 1 requests per second' in refused.json()["message"]
    # Another node's agent has its own bucket.
    other_token = db.write(lambda s: auth.create_token(s, role="node", node=other)).value
    assert Api(limited_server.url, other_token).http.get(f"/api/v1/nodes/{other}").is_success

    async def agent() -> tuple[list[str], int]:
        client = NodeClient(limited_server.url, token, node, ca_cert=None)
        try:  # the bucket is empty: each read waits out a 429 and then succeeds
            names = [(await client.get_node())["metadata"]["name"] for _ in range(2)]
        finally:
            await client.close()
        return names, client.transport.waited

    names, waited = asyncio.run(agent())
    assert names == [node, node] and waited >= 1


def test_failed_authentications_are_limited_per_address(limited_server: ThreadedServer) -> None:
    name, token = new_tenant(limited_server, "guess")
    good = Api(limited_server.url, token).http
    assert good.get(f"/api/v1/namespaces/{name}/pods").status_code == 200  # now verified
    guesser = httpx.Client(base_url=limited_server.url, timeout=30)
    codes = []
    for i in range(6):
        wrong = f"tsr_{i:016x}_{'x' * 43}"
        codes.append(
            guesser.get("/api/v1/pods", headers={"Authorization": f"Bearer {wrong}"}).status_code
        )
    assert codes == [401] * 4 + [429] * 2  # two per second, a burst of four
    answer = guesser.get("/api/v1/pods")
    assert answer.status_code == 429 and int(answer.headers["Retry-After"]) >= 1
    assert "failed authentications from this address" in answer.json()["message"]
    # A token verified before still works from the same address...
    assert good.get(f"/api/v1/namespaces/{name}/pods").status_code != 401
    # ...and so does one never seen before: a limited address never locks out a valid token
    other, fresh = new_tenant(limited_server, "fresh")
    assert Api(limited_server.url, fresh).get(f"/api/v1/namespaces/{other}/pods").status_code == 200
    # while wrong ones still wait, whatever X-Forwarded-For says (no proxy is trusted here)
    for i in range(3):
        spoofed = guesser.get(
            "/api/v1/pods",
            headers={
                "Authorization": f"Bearer tsr_{i:016x}_{'y' * 43}",
                "X-Forwarded-For": f"10.9.8.{i}",
            },
        )
        assert spoofed.status_code == 429, spoofed.text


def test_x_forwarded_for_is_believed_only_from_listed_proxies() -> None:
    from app.server import uvicorn_options

    closed = uvicorn_options(Settings())
    assert closed["proxy_headers"] is False
    listed = uvicorn_options(Settings(trusted_proxies="10.0.0.0/8, 192.168.1.7"))
    assert listed["proxy_headers"] is True
    assert listed["forwarded_allow_ips"] == ["10.0.0.0/8", "192.168.1.7"]
