"""A work queue of keys, as client-go's: a key is queued once however often it is added, is
never handed to two workers at once (added while processed, it is queued again when done),
can be added after a delay, and is retried with a per-key exponential backoff.

Bounded: at most `limit` distinct keys wait; a key added beyond that is dropped and counted
(`dropped`), and the manager resyncs every informer's keys so that nothing stays forgotten.

Fair between namespaces: the keys of each namespace (what a key names before its last `/`)
wait in a line of their own, and the workers take from the lines in turn, so a tenant that
makes a thousand objects at once delays another's next object by at most one key of each
other namespace waiting, not by its thousand.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque


class WorkQueue:
    def __init__(
        self, *, limit: int = 100_000, base_delay: float = 0.05, max_delay: float = 30.0
    ) -> None:
        self.limit = limit
        self.base_delay = base_delay
        self.max_delay = max_delay
        # the keys waiting (each once: `_dirty`), a FIFO per namespace, and the namespaces
        # with keys waiting, in turn
        self._queues: dict[str, deque[str]] = {}
        self._turns: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._later: list[tuple[float, int, str]] = []  # (when, seq, key)
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: str) -> None:
        if self._closed or key in self._dirty:
            return
        if len(self._dirty) >= self.limit:
            self.dropped += 1
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._push(key)
            self._wake.set()

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
            if self._turns:
                key = self._pop()
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._push(key)
            self._wake.set()

    def _push(self, key: str) -> None:
        namespace = key.rpartition("/")[0]
        line = self._queues.get(namespace)
        if line is None:
            line = self._queues[namespace] = deque()
            self._turns.append(namespace)
        line.append(key)

    def _pop(self) -> str:
        """The first key of the namespace whose turn it is (it goes to the back of the turns
        if it has more)."""
        namespace = self._turns.popleft()
        line = self._queues[namespace]
        key = line.popleft()
        if line:
            self._turns.append(namespace)
        else:
            del self._queues[namespace]
        return key

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._wake.set()

    def _release_due(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            _, _, key = heapq.heappop(self._later)
            self.add(key)
        self._arm()

    def _arm(self) -> None:
        """A timer that wakes `get` when the earliest delayed key is due."""
        if not self._later or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: armed at the next get
            loop = asyncio.get_running_loop()
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_later(
                max(0.0, self._later[0][0] - time.monotonic()), self._fire
            )

    def _fire(self) -> None:
        self._timer = None
        self._wake.set()
