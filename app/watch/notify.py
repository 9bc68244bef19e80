"""Wake watchers when the change log grows.

The database is the source of truth; this only says "look again", and of which kinds: a commit
is announced with its newest resourceVersion and the kinds it changed (Pod, Lease, Event...),
and a waiter waits for the kinds it serves, so a watch of pods is not woken by every node's
lease renewal. In one process that is a future per waiter. With `TESSERA_REDIS_URL` set,
commits are also published on a Redis channel (`"<version> <Kind>,<Kind>"`; a bare version
means any kind), and every process that waits subscribes, so a watch served by one process sees
a change made through another within milliseconds. Publishing is a thread's of its own: a commit
only hands it the version and kinds (the writer does not wait for a Redis round trip), and
commits made while a message is on its way go out as one message: the newest version with
every kind changed since the last (all a watcher needs: it reads the log from where it was).

A commit this process was not told of (another process's, with no Redis, or a message lost
while the subscription reconnected) is found by one task per process (`follow_log`): while
anything waits, it reads the kinds changed since its last look, every `watch_poll_seconds`,
and wakes the waiters of those kinds. Each watch no longer polls the log itself: an idle watch
costs nothing, where a hundred idle watches (the nodes of `tessera dev`) read the database a
hundred times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import redis
import redis.asyncio as aioredis

CHANNEL = "tessera:changes"
# A watch told of a change above the store's horizon: how soon the horizon is read again
# (doubling from the first figure to the second while watches wait).
HORIZON_POLL_FIRST = 0.005
HORIZON_POLL_MAX = 0.1
log = logging.getLogger("tessera.watch")

Kinds = frozenset[str] | None  # the kinds a commit changed; None: not said (any kind)


class Notifier:
    def __init__(self, redis_url: str | None) -> None:
        self.redis_url = redis_url
        self.latest = 0  # the newest version announced, of any kind
        self._latest: dict[str, int] = {}  # by kind
        self._unsaid = 0  # the newest version announced without its kinds
        self._loop: asyncio.AbstractEventLoop | None = None
        # what is waited for, by kind (None: any kind) -> the waiters' futures
        self._waiting: dict[str | None, set[asyncio.Future[None]]] = {}
        self._publisher: redis.Redis | None = redis.Redis.from_url(redis_url) if redis_url else None
        self._task: asyncio.Task[None] | None = None
        # The publishing thread's outbox: the newest version committed in this process and the
        # kinds changed since the last message (None: some commit did not say), and what the
        # last message said.
        self._committed = 0
        self._unsent: set[str] | None = set()
        self._pending = False
        self._sent = 0
        self._said: frozenset[str] | None = frozenset()
        self._closed = False
        self._outbox = threading.Condition()
        self._sender: threading.Thread | None = None
        # The server is stopping: open streams (watches, `logs -f`) end now, cleanly, rather
        # than hold the stop until they time out (see `end_streams`).
        self.stopping = False
        # The store's horizon as last read, and the watches waiting for it to pass a version
        # (`past_horizon`).
        self.horizon = 0
        self._horizon_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._horizon_task: asyncio.Task[None] | None = None
        # The log's follower (`follow_log`): how it reads, how often, the waiters' versions,
        # and the versions it has looked through, (from, to], every change of which has been
        # announced since.
        self._log_read: Callable[[int], Awaitable[tuple[int, dict[str, int]]]] | None = None
        self._log_every = 1.0
        self._afters: dict[asyncio.Future[None], int] = {}
        self._followed: tuple[int, int] | None = None
        self._follow_task: asyncio.Task[None] | None = None

    def follow_log(
        self, read: Callable[[int], Awaitable[tuple[int, dict[str, int]]]], every: float
    ) -> None:
        """While anything waits, look through the log every `every` seconds for changes no
        notification told of. `read(after)` gives the store's version and the newest change
        of each kind above `after` and at or below it (app/watch/log.py, `newest_after`)."""
        self._log_read, self._log_every = read, every

    @property
    def follows_log(self) -> bool:
        """Whether a waiter can wait for as long as it likes: what no notification says, the
        log's follower finds within `every` seconds."""
        return self._log_read is not None

    async def start(self) -> None:
        """Bind to the running event loop; subscribe to Redis when configured."""
        self._loop = asyncio.get_running_loop()
        if self.redis_url:
            self._task = asyncio.create_task(self._subscribe(self.redis_url))

    async def stop(self) -> None:
        for task in (self._task, self._follow_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
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
        self._wake(self.latest, None)

    def publish(self, resource_version: int, kinds: Kinds = None) -> None:
        """Called after a commit (from any thread) with its newest version and the kinds it
        changed."""
        self._wake_threadsafe(resource_version, kinds)
        if self._publisher is None:
            return
        with self._outbox:
            if resource_version <= self._sent and (
                self._said is None or (kinds is not None and kinds <= self._said)
            ):
                return  # a message at or after it already said as much
            self._committed = max(self._committed, resource_version)
            if self._unsent is not None:
                self._unsent = None if kinds is None else self._unsent | kinds
            self._pending = True
            if self._sender is None and not self._closed:
                self._sender = threading.Thread(
                    target=self._send_forever, name="tessera-notify", daemon=True
                )
                self._sender.start()
            self._outbox.notify()

    def _send_forever(self) -> None:
        """Publish what was committed since the last message, until `stop` (what is unsent
        then goes too). Versions never go back: a commit announced late (its thread was slower
        than a later one's) goes out at the newest version, which only wakes more."""
        assert self._publisher is not None
        while True:
            with self._outbox:
                while not self._pending and not self._closed:
                    self._outbox.wait()
                pending, closed = self._pending, self._closed
                version, kinds = max(self._committed, self._sent), self._unsent
                self._pending, self._unsent, self._sent = False, set(), version
                self._said = frozenset(kinds) if kinds is not None else None
            if pending:
                message = str(version) if kinds is None else f"{version} {','.join(sorted(kinds))}"
                try:
                    self._publisher.publish(CHANNEL, message)
                except redis.RedisError as exc:  # watchers still poll; the write stands
                    log.warning("could not publish a change notification to Redis: %s", exc)
            if closed:
                return

    def newest(self, kinds: Collection[str] | None = None) -> int:
        """The newest version announced of any of `kinds` (None: of any kind)."""
        if kinds is None:
            return self.latest
        return max([self._unsaid, *(self._latest.get(kind, 0) for kind in kinds)])

    async def wait(self, after: int, timeout: float, kinds: Collection[str] | None = None) -> None:
        """Return when something of `kinds` (None: of any kind) newer than `after` may exist,
        or after `timeout` seconds."""
        if self._loop is None or self.stopping or self.newest(kinds) > after:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        keys: Collection[str | None] = [None] if kinds is None else kinds
        for key in keys:
            self._waiting.setdefault(key, set()).add(future)
        self._afters[future] = after
        if self._log_read is not None and (self._follow_task is None or self._follow_task.done()):
            self._follow_task = asyncio.create_task(self._follow_log(self._log_read))
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await future
        finally:
            del self._afters[future]
            for key in keys:
                self._waiting.get(key, set()).discard(future)

    async def _follow_log(
        self, read: Callable[[int], Awaitable[tuple[int, dict[str, int]]]]
    ) -> None:
        """While anything waits: look through the log from where the last look ended (or from
        the oldest version a waiter has, if older: what lies before it was never looked
        through), and wake the waiters of each kind changed there that no notification told
        of."""
        while self._afters and not self.stopping:
            await asyncio.sleep(self._log_every)
            if not self._afters:
                return
            oldest = min(self._afters.values())
            followed = self._followed
            after = oldest if followed is None or oldest < followed[0] else followed[1]
            try:
                upto, newest = await read(after)
            except Exception:  # the store is unreachable a moment: look again later
                log.warning("could not read the change log's newest versions", exc_info=True)
                continue
            if upto > after:
                start = after if followed is None else min(after, followed[0])
                self._followed = (start, upto)
            for kind, version in newest.items():
                if version > self._latest.get(kind, 0):
                    self._wake(version, frozenset((kind,)))

    async def past_horizon(
        self, after: int, read: Callable[[], Awaitable[int]], timeout: float
    ) -> None:
        """Return once the store's horizon (`current_resource_version`) is above `after`, or
        after `timeout` seconds: for a watch told of a change it cannot read yet (a write
        transaction that began earlier still runs). One task per process reads the horizon
        for every such watch, 5 ms after the last read at first, doubling to 100 ms, so that
        many watches waiting cost one read at a time, not one each."""
        if self.horizon > after or self._loop is None or self.stopping:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._horizon_waiters.append((after, future))
        if self._horizon_task is None or self._horizon_task.done():
            self._horizon_task = asyncio.create_task(self._follow_horizon(read))
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.shield(future)
        finally:
            if not future.done():
                future.cancel()

    async def _follow_horizon(self, read: Callable[[], Awaitable[int]]) -> None:
        delay = HORIZON_POLL_FIRST
        while self._horizon_waiters and not self.stopping:
            try:
                self.horizon = max(self.horizon, await read())
            except Exception:  # the store is unreachable a moment: the waiters time out
                log.warning("could not read the store's horizon", exc_info=True)
            waiting = []
            for after, future in self._horizon_waiters:
                if future.done():
                    continue
                if self.horizon > after:
                    future.set_result(None)
                else:
                    waiting.append((after, future))
            self._horizon_waiters = waiting
            if waiting:
                await asyncio.sleep(delay)
                delay = min(2 * delay, HORIZON_POLL_MAX)

    def _wake_threadsafe(self, resource_version: int, kinds: Kinds) -> None:
        if self._loop is None:
            self._note(resource_version, kinds)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed (shutdown)
            self._loop.call_soon_threadsafe(self._wake, resource_version, kinds)

    def _note(self, resource_version: int, kinds: Kinds) -> None:
        self.latest = max(self.latest, resource_version)
        if kinds is None:
            self._unsaid = max(self._unsaid, resource_version)
            return
        for kind in kinds:
            if self._latest.get(kind, 0) < resource_version:
                self._latest[kind] = resource_version

    def _wake(self, resource_version: int, kinds: Kinds) -> None:
        self._note(resource_version, kinds)
        keys = list(self._waiting) if kinds is None else [None, *kinds]
        for key in keys:
            for future in self._waiting.pop(key, ()):
                if not future.done():
                    future.set_result(None)

    async def _subscribe(self, url: str) -> None:
        while True:
            client: Any = aioredis.Redis.from_url(url)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        version, kinds = parse(message["data"])
                    except ValueError:
                        continue  # not a Tessera process's: nothing to wake for
                    self._wake(version, kinds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Redis subscription lost (%s); retrying in 1s", exc)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()


MAX_MESSAGE_BYTES = 4096


def parse(data: bytes | str) -> tuple[int, Kinds]:
    """A message of the channel: `"<version>"` or `"<version> <Kind>,<Kind>"`."""
    text = data.decode() if isinstance(data, bytes) else data
    if len(text) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a change notification of {len(text)} bytes")
    version, _, kinds = text.partition(" ")
    return int(version), (frozenset(kinds.split(",")) if kinds else None)
