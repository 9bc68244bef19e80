"""A work queue of keys, as client-go's: a key is queued once however often it is added, is
never handed to two workers at once (added while processed, it is queued again when done),
can be added after a delay, and is retried with a per-key exponential backoff.

Bounded: at most `limit` distinct keys wait; a key added beyond that is dropped and counted
(`dropped`), and the manager resyncs every informer's keys so that nothing stays forgotten.

Fair between namespaces: the keys of each namespace (what a key names before its last `/`)
wait in a line of their own, and the workers take from the lines in turn, so a tenant that
makes a thousand objects at once delays another's next object by at most one key of each
other namespace waiting, not by its thousand.

Fair between objects: a controller that did one step of a longer piece of work (one batch of
a slow start) queues its key again with `add_behind`, and such keys wait behind every key
added by a change (`add`). A burst of objects is so worked breadth-first: each object's first
step before any object's next, and an object created during a burst waits for the other new
objects, not for the steps of those that already have their first pods. (The keys behind are
taken as soon as no changed key waits; a change to a key already waiting behind leaves it
there: it will be looked at in any case.)

A key added wakes one waiting worker, not all of them (as asyncio.Queue): a controller has
up to a hundred workers, and waking them all at every add made each key cost the event loop
about a hundred task switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque


class _Line:
    """Keys in a FIFO per namespace, the namespaces in turn."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[str]] = {}
        self.turns: deque[str] = deque()

    def __bool__(self) -> bool:
        return bool(self.turns)

    def push(self, key: str) -> None:
        namespace = key.rpartition("/")[0]
        line = self.queues.get(namespace)
        if line is None:
            line = self.queues[namespace] = deque()
            self.turns.append(namespace)
        line.append(key)

    def pop(self) -> str:
        """The first key of the namespace whose turn it is (it goes to the back of the turns
        if it has more)."""
        namespace = self.turns.popleft()
        line = self.queues[namespace]
        key = line.popleft()
        if line:
            self.turns.append(namespace)
        else:
            del self.queues[namespace]
        return key


class WorkQueue:
    def __init__(
        self, *, limit: int = 100_000, base_delay: float = 0.05, max_delay: float = 30.0
    ) -> None:
        self.limit = limit
        self.base_delay = base_delay
        self.max_delay = max_delay
        # the keys waiting (each once: `_dirty`): those added by a change, and behind them
        # those a worker asked to come back to (`_behind`: which of them, while processed)
        self._changed = _Line()
        self._again = _Line()
        self._dirty: set[str] = set()
        self._behind: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._later: list[tuple[float, int, str]] = []  # (when, seq, key)
        self._seq = itertools.count()
        self._waiters: deque[asyncio.Future[None]] = deque()  # workers waiting in `get`
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0  # when the timer fires
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: str) -> None:
        self._add(key, behind=False)

    def add_behind(self, key: str) -> None:
        """`key` has more to do: queued again (once done, if it is being processed) behind
        every key added by `add`."""
        self._add(key, behind=True)

    def _add(self, key: str, *, behind: bool) -> None:
        if self._closed:
            return
        if key in self._dirty:
            if behind and key in self._processing:
                self._behind.add(key)
            return
        if len(self._dirty) >= self.limit:
            self.dropped += 1
            return
        self._dirty.add(key)
        if behind:
            self._behind.add(key)
        if key not in self._processing:
            self._push(key)

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        heapq.heappush(self._later, (time.monotonic() + delay, next(self._seq), key))
        self._arm()

    def add_rate_limited(self, key: str) -> float:
        """Add `key` again after its backoff (doubling at each failure); the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * (2**failures), self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """`key` succeeded: its backoff starts over."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str | None:
        """The next key (marked as processing until `done`); None once the queue is closed."""
        while True:
            self._release_due()
            if self._changed or self._again:
                key = (self._changed or self._again).pop()
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            if self._closed:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # woken then cancelled: the key it was woken for goes to another worker
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._push(key)

    def _push(self, key: str) -> None:
        if key in self._behind:
            self._behind.discard(key)
            self._again.push(key)
        else:
            self._changed.push(key)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        while self._waiters:
            self._wake_one()

    def _release_due(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            _, _, key = heapq.heappop(self._later)
            self.add(key)
        self._arm()

    def _arm(self) -> None:
        """A timer that wakes a worker when the earliest delayed key is due (set again only
        when that time changed)."""
        if not self._later or self._closed:
            return
        when = self._later[0][0]
        if self._timer is not None and self._timer_when == when:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: armed at the next get
            loop = asyncio.get_running_loop()
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_later(max(0.0, when - time.monotonic()), self._fire)
            self._timer_when = when

    def _fire(self) -> None:
        self._timer = None
        if self._waiters:
            self._wake_one()
        # no worker waits: the next to come to `get` releases the due keys
