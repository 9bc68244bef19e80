"""What crosses processes through Redis: rate limits and change notifications (real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from app.auth.service import Principal
from app.errors import TooManyRequests
from app.ratelimit import RateLimiter
from app.settings import Settings
from app.watch.notify import Notifier
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
    """Two limiters (two API processes) share one budget per tenant through Redis."""
    tenant = Principal("tenant", 1, unique("rl"), "k")
    other = Principal("tenant", 2, unique("rl"), "k")

    async def scenario() -> tuple[int, int]:
        first, second = RateLimiter(10, redis_url), RateLimiter(10, redis_url)
        # Start at the beginning of a one-second window so the budget cannot reset mid-test.
        await asyncio.sleep(1 - (time.time() % 1) + 0.01)
        allowed = refused = 0
        for i in range(30):
            try:
                await (first if i % 2 else second).check(tenant)
                allowed += 1
            except TooManyRequests as exc:
                refused += 1
                assert exc.retry_after == 1 and "10 requests per second" in exc.message
        await first.check(other)  # another tenant has its own budget
        await first.close()
        await second.close()
        return allowed, refused

    assert asyncio.run(scenario()) == (10, 20)


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


@pytest.fixture
def limited_server(db, tmp_path, redis_url: str) -> Iterator[ThreadedServer]:
    settings = Settings(
        data_dir=tmp_path, redis_url=redis_url, rate_limit_per_second=3, auth_cache_seconds=0
    )
    with ThreadedServer(settings, db) as running:
        yield running


def test_the_api_answers_429_with_retry_after(limited_server: ThreadedServer) -> None:
    from app.auth import service as auth

    name = unique("lim")
    limited_server.services.db.write(lambda s: auth.create_tenant(s, name=name))
    token = limited_server.services.db.write(
        lambda s: auth.create_token(s, role="tenant", tenant=name)
    ).value
    client = Api(limited_server.url, token).http
    time.sleep(1 - (time.time() % 1) + 0.01)
    codes = [
        client.post(f"/api/v1/namespaces/{name}/pods", json=pod(f"p{i}")).status_code
        for i in range(6)
    ]
    assert codes[:3] == [201, 201, 201] and set(codes[3:]) == {429}
    refused = client.get(f"/api/v1/namespaces/{name}/pods")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert refused.json()["reason"] == "TooManyRequests"
