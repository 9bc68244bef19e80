"""How a session's bytes cross API processes.

A user's session lands on one API process, the agent's connection for it on any (several
workers share one port; several replicas share one address). The two meet on named channels of
a broker: Redis pub/sub when `TESSERA_REDIS_URL` is set (the API's processes already share it
for watches), else this process's memory (one process: `tessera dev`, `tessera serve` with one
worker). Channels:

- `tessera:node-sessions:<node>`: the sessions offered to a node's agent (JSON), read by the
  API process that holds the agent's control connection;
- `tessera:session:<node>:<id>:in` / `:out`: the session's frames toward the agent / toward the user.

A frame is the Kubernetes channel framing (one byte of channel, then data), or one of the two
relay markers below. Publishing answers how many subscribers got the message: an offer that
reaches nobody means the node's agent is not connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import redis.asyncio as aioredis

from app.errors import TooManyRequests

log = logging.getLogger("tessera.sessions")

READY = b"\xf0"  # from the agent's side: it listens; the user's frames may flow
END = b"\xf1"  # either side is gone
QUEUE_FRAMES = 1024  # frames a subscriber holds unread before it is cut off


def node_channel(node: str) -> str:
    return f"tessera:node-sessions:{node}"


def session_channel(node: str, session_id: str, direction: str) -> str:
    """A session's channel: only the agent of `node` can reach it (the id is a secret too)."""
    return f"tessera:session:{node}:{session_id}:{direction}"


class Overflow(Exception):
    """A subscriber fell more than QUEUE_FRAMES frames behind."""


class Subscription(Protocol):
    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def get(self, timeout: float | None = None) -> bytes | None:
        """The next frame; None after `timeout` seconds without one."""


class Broker(Protocol):
    async def publish(self, channel: str, data: bytes) -> int: ...

    async def listeners(self, channel: str) -> int:
        """How many subscribe to `channel` now."""

    def subscribe(self, channel: str) -> contextlib.AbstractAsyncContextManager[Subscription]: ...

    async def close(self) -> None: ...


class _Queue:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_FRAMES)
        self.overflowed = False

    def put(self, data: bytes) -> None:
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            self.overflowed = True

    async def get(self, timeout: float | None = None) -> bytes | None:
        if self.overflowed and self.queue.empty():
            raise Overflow()
        try:
            async with asyncio.timeout(timeout):
                return await self.queue.get()
        except TimeoutError:
            return None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            data = await self.get()
            if data is not None:
                yield data


class LocalBroker:
    """Channels in this process's memory."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[_Queue]] = {}

    async def publish(self, channel: str, data: bytes) -> int:
        subscribers = self._subscribers.get(channel, set())
        for queue in subscribers:
            queue.put(data)
        return len(subscribers)

    async def listeners(self, channel: str) -> int:
        return len(self._subscribers.get(channel, ()))

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        queue = _Queue()
        self._subscribers.setdefault(channel, set()).add(queue)
        try:
            yield queue
        finally:
            subscribers = self._subscribers.get(channel, set())
            subscribers.discard(queue)
            if not subscribers:
                self._subscribers.pop(channel, None)

    async def close(self) -> None:
        self._subscribers.clear()


class RedisBroker:
    """Channels of Redis pub/sub: one connection to publish (pooled), one per subscription."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Any = aioredis.Redis.from_url(url)

    async def publish(self, channel: str, data: bytes) -> int:
        return int(await self._client.publish(channel, data))

    async def listeners(self, channel: str) -> int:
        counts = await self._client.pubsub_numsub(channel)
        return int(counts[0][1]) if counts else 0

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        pubsub = self._client.pubsub()
        queue = _Queue()
        await pubsub.subscribe(channel)  # subscribed on return: nothing published later is lost

        async def pump() -> None:
            try:
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                    if message is not None and message.get("type") == "message":
                        queue.put(bytes(message["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection to Redis broke: the session ends
                log.warning("session channel %s lost: %s", channel, exc)
                queue.put(END)

        task = asyncio.create_task(pump())
        try:
            yield queue
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(Exception):
                await pubsub.unsubscribe(channel)
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()


def broker_for(redis_url: str | None) -> Broker:
    return RedisBroker(redis_url) if redis_url else LocalBroker()


class SessionLimits:
    """Open sessions of each tenant on this API process."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def acquire(self, owner: str, limit: int) -> Callable[[], None]:
        if self.open.get(owner, 0) >= limit:
            raise TooManyRequests(
                f"{owner} has {limit} exec, attach and port-forward sessions open on this API "
                "server, the most it may; end one (or raise TESSERA_SESSION_MAX_PER_TENANT)",
                retry_after=5,
            )
        self.open[owner] = self.open.get(owner, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open[owner] -= 1
                if not self.open[owner]:
                    del self.open[owner]

        return release
