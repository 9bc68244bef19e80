"""Wake watchers when the change log grows.

The database is the source of truth; this only says "look again". In one process an asyncio
event does it. With `TESSERA_REDIS_URL` set, commits are also published on a Redis channel, and
every API process subscribes, so a watch served by one process sees a change made through
another within milliseconds. Publishing is a thread's of its own: a commit only hands it the
newest resourceVersion (the writer does not wait for a Redis round trip), and commits made
while a message is on its way go out as one message, the newest version (all a watcher needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
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
        self._committed = 0  # the newest version committed in this process
        self._sent = 0  # the newest version published
        self._closed = False
        self._outbox = threading.Condition()
        self._sender: threading.Thread | None = None
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
        if self._sender is not None:
            with self._outbox:
                self._closed = True
                self._outbox.notify()
            await asyncio.to_thread(self._sender.join, 5)
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
        if self._publisher is None:
            return
        with self._outbox:
            self._committed = max(self._committed, resource_version)
            if self._sender is None and not self._closed:
                self._sender = threading.Thread(
                    target=self._send_forever, name="tessera-notify", daemon=True
                )
                self._sender.start()
            self._outbox.notify()

    def _send_forever(self) -> None:
        """Publish the newest version committed, until `stop` (what is unsent then goes too).
        Versions go out increasing: one committed below what was sent is not sent."""
        assert self._publisher is not None
        while True:
            with self._outbox:
                while self._committed <= self._sent and not self._closed:
                    self._outbox.wait()
                version = self._committed if self._committed > self._sent else 0
                self._sent = max(self._sent, version)
                closed = self._closed
            if version:
                try:
                    self._publisher.publish(CHANNEL, str(version))
                except redis.RedisError as exc:  # watchers still poll; the write stands
                    log.warning("could not publish a change notification to Redis: %s", exc)
            if closed:
                return

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
