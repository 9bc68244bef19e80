"""Wake watchers when the change log grows.

The database is the source of truth; this only says "look again". In one process an asyncio
event does it. With `TESSERA_REDIS_URL` set, every commit is also published on a Redis channel,
and every API process subscribes, so a watch served by one process sees a change made through
another within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis
import redis.asyncio as aioredis

CHANNEL = "tessera:changes"
log = logging.getLogger("tessera.watch")


class Notifier:
    def __init__(self, redis_url: str | None) -> None:
        self.redis_url = redis_url
        self.latest = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._publisher: redis.Redis | None = redis.Redis.from_url(redis_url) if redis_url else None
        self._task: asyncio.Task[None] | None = None
        # The server is stopping: open streams (watches, `logs -f`) end now, cleanly, rather
        # than hold the stop until they time out (see `end_streams`).
        self.stopping = False

    async def start(self) -> None:
        """Bind to the running event loop; subscribe to Redis when configured."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self.redis_url:
            self._task = asyncio.create_task(self._subscribe(self.redis_url))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._publisher is not None:
            self._publisher.close()

    def end_streams(self) -> None:
        """The server stops: every watch waiting here wakes and ends its stream (a client sees
        the stream end, as it does at a watch's timeout, and watches again elsewhere or
        later). Called in the event loop."""
        self.stopping = True
        if self._event is not None:
            self._event.set()

    def publish(self, resource_version: int) -> None:
        """Called after a commit (from any thread)."""
        self._wake_threadsafe(resource_version)
        if self._publisher is not None:
            try:
                self._publisher.publish(CHANNEL, str(resource_version))
            except redis.RedisError as exc:  # watchers still poll; do not fail the write
                log.warning("could not publish a change notification to Redis: %s", exc)

    async def wait(self, after: int, timeout: float) -> None:
        """Return when something newer than `after` may exist, or after `timeout` seconds."""
        if self._event is None or self.latest > after or self.stopping:
            return
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def _wake_threadsafe(self, resource_version: int) -> None:
        if self._loop is None:
            self.latest = max(self.latest, resource_version)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed (shutdown)
            self._loop.call_soon_threadsafe(self._wake, resource_version)

    def _wake(self, resource_version: int) -> None:
        self.latest = max(self.latest, resource_version)
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    async def _subscribe(self, url: str) -> None:
        while True:
            client: Any = aioredis.Redis.from_url(url)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._wake(int(message["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Redis subscription lost (%s); retrying in 1s", exc)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()
