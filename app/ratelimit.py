"""Per-tenant request rate limits (the admin is not limited).

A token bucket per tenant in each process; with Redis configured, a one-second window counted in
Redis so that the limit holds across every API process. When Redis cannot be reached the limit
falls back to the local bucket rather than refusing requests.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from app.errors import TooManyRequests

if TYPE_CHECKING:
    from app.auth.service import Principal

log = logging.getLogger("tessera.ratelimit")


class RateLimiter:
    def __init__(self, per_second: float, redis_url: str | None) -> None:
        self.per_second = per_second
        self.burst = max(1.0, 2 * per_second)
        self._buckets: dict[int, tuple[float, float]] = {}
        self._redis = aioredis.Redis.from_url(redis_url) if redis_url and per_second > 0 else None

    async def check(self, principal: Principal) -> None:
        if self.per_second <= 0 or principal.is_admin or principal.tenant_id is None:
            return
        if self._redis is not None:
            try:
                await self._check_redis(principal.tenant_name or str(principal.tenant_id))
                return
            except RedisError as exc:
                log.warning("rate limit via Redis failed (%s); using the local bucket", exc)
        self._check_local(principal.tenant_id)

    def _check_local(self, tenant_id: int) -> None:
        now = time.monotonic()
        tokens, last = self._buckets.get(tenant_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.per_second)
        if tokens < 1:
            wait = math.ceil((1 - tokens) / self.per_second)
            raise _limited(self.per_second, wait)
        self._buckets[tenant_id] = (tokens - 1, now)

    async def _check_redis(self, tenant: str) -> None:
        assert self._redis is not None
        window = int(time.time())
        key = f"tessera:ratelimit:{tenant}:{window}"
        pipe = self._redis.pipeline()
        pipe.incr(key)
        pipe.expire(key, 2)
        count, _ = await pipe.execute()
        if count > self.per_second:
            raise _limited(self.per_second, 1)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


def _limited(rate: float, wait: int) -> TooManyRequests:
    return TooManyRequests(
        f"too many requests: this tenant may send {rate:g} requests per second; "
        f"retry after {wait}s",
        retry_after=wait,
    )
