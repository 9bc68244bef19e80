"""Request rate limits: per tenant, and per client address for failed authentication.

Both are token buckets of `rate` requests per second that hold a burst of twice that, kept as a
GCRA ("generic cell rate algorithm"): one number per key, the theoretical arrival time (TAT) of the
next request; a request is allowed while the TAT is at most `burst / rate` seconds ahead of now,
and each allowed request moves it on by `1 / rate`. In one process the TATs live in a dict; with
Redis configured they live in Redis, updated by one Lua script, so the limit holds across every API
process. When Redis cannot be reached the limit falls back to the local bucket rather than
refusing requests.

- Tenants: every request of a tenant's token counts (the admin is not limited).
- Nodes: every request of a node agent's token counts against its node, at a rate of its own.
- Failed authentication: each `401` counts against the client's address (the connection's, or
  X-Forwarded-For from a proxy listed in `trusted_proxies` only); once its bucket is empty,
  requests from that address with a malformed token are answered `429` unread, and a well-formed
  one is looked up (one indexed read) and served if it verifies, `429` if not: guessing costs
  the guesser, and never locks out a token that verifies.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from app.errors import TooManyRequests

if TYPE_CHECKING:
    from app.auth.service import Principal

log = logging.getLogger("tessera.ratelimit")

# KEYS[1]: the bucket; ARGV: now (s), interval = 1/rate (s), tolerance = burst/rate (s),
# take (1 to take a request, 0 to only look). Returns 0 when allowed, else the seconds to wait
# (as a string, Lua numbers are truncated to integers on the way back).
_GCRA = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + interval
if next_tat - now > tolerance then
  return tostring(next_tat - now - tolerance)
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[1], tostring(next_tat), 'PX', math.ceil(tolerance * 1000) + 1000)
end
return '0'
"""
MAX_LOCAL_KEYS = 100_000  # addresses remembered in one process; the oldest are forgotten first


class Bucket:
    """A GCRA token bucket per key: `rate` per second, `burst` at once."""

    def __init__(self, name: str, rate: float, redis: aioredis.Redis | None) -> None:
        self.name = name
        self.rate = rate
        self.burst = max(1.0, 2 * rate)
        self._interval = 1 / rate if rate > 0 else 0.0
        self._tolerance = self.burst / rate if rate > 0 else 0.0
        self._local: OrderedDict[str, float] = OrderedDict()
        self._redis = redis
        self._script = redis.register_script(_GCRA) if redis is not None else None

    async def take(
        self, key: str, *, now: float | None = None, look: bool = False, cost: int = 1
    ) -> int:
        """0 when a request for `key` is allowed (and, unless `look`, counted), else the
        whole seconds to wait before the next one would be. `cost`: it counts as that many
        requests (at most a whole burst, so that it can pass)."""
        if self.rate <= 0:
            return 0
        now = time.time() if now is None else now
        interval = self._interval * max(1.0, min(float(cost), self.burst))
        if self._script is not None:
            try:
                wait = float(
                    await self._script(
                        keys=[f"tessera:ratelimit:{self.name}:{key}"],
                        args=[
                            repr(now),
                            repr(interval),
                            repr(self._tolerance),
                            0 if look else 1,
                        ],
                    )
                )
                return math.ceil(wait) if wait > 0 else 0
            except RedisError as exc:
                log.warning("rate limit via Redis failed (%s); using the local bucket", exc)
        return self._take_local(key, now, look, interval)

    def _take_local(self, key: str, now: float, look: bool, interval: float) -> int:
        tat = max(self._local.get(key, now), now)
        wait = tat + interval - now - self._tolerance
        if wait > 1e-9:
            return math.ceil(wait)
        if not look:
            self._local[key] = tat + interval
            self._local.move_to_end(key)
            while len(self._local) > MAX_LOCAL_KEYS:
                self._local.popitem(last=False)
        return 0


class RateLimiter:
    def __init__(
        self,
        per_second: float,
        redis_url: str | None,
        *,
        auth_failures_per_second: float = 0.0,
        node_per_second: float = 0.0,
    ) -> None:
        self.per_second = per_second
        rates = (per_second, auth_failures_per_second, node_per_second)
        use_redis = redis_url and any(rate > 0 for rate in rates)
        self._redis = aioredis.Redis.from_url(redis_url) if use_redis and redis_url else None
        self.tenants = Bucket("tenant", per_second, self._redis)
        self.failures = Bucket("auth-failures", auth_failures_per_second, self._redis)
        self.nodes = Bucket("node", node_per_second, self._redis)
        self.burst = self.tenants.burst

    async def check(self, principal: Principal, *, now: float | None = None, cost: int = 1) -> None:
        """Count a request of an authenticated caller (`cost`: as that many, the pods of a
        batch create); `429` when its tenant (or, for a node agent's token, its node) is over
        the rate."""
        if principal.role == "node" and principal.node_name:
            bucket, who = self.nodes, f'node "{principal.node_name}"'
            key = principal.node_name
        elif principal.role == "tenant" and principal.tenant_id is not None:
            bucket, who = self.tenants, "this tenant"
            key = principal.tenant_name or str(principal.tenant_id)
        else:
            return
        wait = await bucket.take(key, now=now, cost=cost)
        if wait:
            raise TooManyRequests(
                f"too many requests: {who} may send {bucket.rate:g} requests per second "
                f"(bursts of {bucket.burst:g}); retry after {wait}s",
                retry_after=wait,
            )

    async def address_limited(self, address: str, *, now: float | None = None) -> int:
        """Before a token is looked up: the seconds `address` must wait, having failed too
        often lately (0: not limited)."""
        return int(await self.failures.take(address, now=now, look=True) or 0)

    async def failed(self, address: str, *, now: float | None = None) -> None:
        """Count a failed authentication from `address`."""
        await self.failures.take(address, now=now)

    def too_many_failures(self, wait: int) -> TooManyRequests:
        return TooManyRequests(
            f"too many failed authentications from this address: at most "
            f"{self.failures.rate:g} per second (bursts of {self.failures.burst:g}) are "
            f"answered; retry after {wait}s with a valid token",
            retry_after=wait,
        )

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
