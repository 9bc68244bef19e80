"""What a controller is to the manager: the resources it watches, which of its keys an event
concerns, and `reconcile(key)`: read what is, compute what should be, write the difference.

A controller never assumes it saw every event (a restart, a relist or a missed watch all end
in `reconcile` of the keys concerned); it acts through the API only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import ClassVar

from app.controllers.client import Client, Obj, Resource
from app.controllers.informer import Informers, text_key
from app.controllers.queue import WorkQueue

log = logging.getLogger("tessera.controllers")
MAX_EVENTS_IN_FLIGHT = 1000  # events being sent per controller; more are dropped (best effort)
# client-go's spam filter (EventSourceObjectSpamFilter): each object may have 25 events at once
# from a controller, then one every 5 minutes; the rest are dropped. A ReplicaSet or Job tells
# its creates one event per slow-start step (`names_message`): 50 pods are 7 events.
SPAM_BURST, SPAM_REFILL_SECONDS = 25.0, 300.0
SPAM_OBJECTS = 4096  # objects whose budget is remembered (the least recent forgotten)
MESSAGE_BYTES = 1024  # an Event's message at most (as Kubernetes')
# The ReplicaSet, Deployment and Job controllers' workers. A worker waits out its step's
# PodBatch (or its ReplicaSet's create) before it takes another key, so the new objects of a
# burst wait in the queue for a free worker, not at the API: with 16 workers, 300 objects
# created at once got their first pods 2.6-4.7 s after them at the median (5.5-8.5 s at the
# p99), with 128 1.2 s (2.0 s). A worker also waits out its status write, and those have
# few slots of their own (client.py, STATUSES_AT_ONCE): 512 workers, more than a burst's
# objects, so that a new object finds a worker while others wait to write their status (first
# pod p99 0.50-0.78 s in four runs, against 1.16-1.68 s with 128 workers and status writes in
# the common slots; the README's workload section). Workers are coroutines; the API's load stays bounded by the client's requests, status
# writes and pods in flight (client.py), not by them.
BURST_WORKERS = 512


def names_message(action: str, noun: str, names: Sequence[str]) -> str:
    """One event's message for the objects a sync made (or deleted) together, as Kubernetes
    says it of one (`Created pod: web-x1`) and listing several (`Created pods: web-x1, web-x2`):
    the names while the message stays within MESSAGE_BYTES, then how many more
    (`Created pods: web-x1, web-x2 and 40 more`)."""
    head = f"{action} {noun}: " if len(names) == 1 else f"{action} {noun}s: "
    whole = head + ", ".join(names)
    if len(whole.encode()) <= MESSAGE_BYTES:
        return whole
    listed: list[str] = []
    size = len(head.encode())
    for name in names:
        more = len(names) - len(listed) - 1  # those after this one
        add = len(name.encode()) + (2 if listed else 0)
        if size + add + len(f" and {more} more") > MESSAGE_BYTES:
            break
        listed.append(name)
        size += add
    rest = f"{len(names) - len(listed)} more"
    return head + (f"{', '.join(listed)} and {rest}" if listed else rest)


class SlowStart:
    """Kubernetes' slow start of pod creates (1, 2, 4, ... at once, back to 1 after a failure,
    so that a template the API refuses costs one refused create, not fifty), taken one step per
    sync: a sync makes one batch and queues its object again behind the others
    (`WorkQueue.add_behind`). Under a burst of objects each gets its first pod before any gets
    its next batch, instead of each object's pods all made before the next object's first.

    Remembers the next batch of each object (its key) that has pods left to make, and no
    other: `made` a step with more to make, `done` when none is left or a create failed."""

    def __init__(self, most: int) -> None:
        self.most = most  # the largest batch
        self._next: dict[str, int] = {}

    def batch(self, key: str, wanted: int) -> int:
        """How many of the `wanted` pods this sync makes."""
        return max(0, min(wanted, self._next.get(key, 1), self.most))

    def made(self, key: str, size: int) -> None:
        self._next[key] = min(2 * size, self.most)

    def done(self, key: str) -> None:
        self._next.pop(key, None)


class Controller:
    name: ClassVar[str]
    # the resources it watches; the first is the one its keys name
    resources: ClassVar[tuple[Resource, ...]]
    workers: ClassVar[int] = 2

    def __init__(self) -> None:
        self.client: Client
        self.informers: Informers
        self.queue = WorkQueue()
        self._events: set[asyncio.Task[None]] = set()
        self._budgets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def _may_tell(self, uid: str) -> bool:
        """Take one of the object's event tokens (SPAM_BURST, refilled one per
        SPAM_REFILL_SECONDS); False when it has none."""
        at = time.monotonic()
        tokens, then = self._budgets.pop(uid, (SPAM_BURST, at))
        tokens = min(SPAM_BURST, tokens + (at - then) / SPAM_REFILL_SECONDS)
        self._budgets[uid] = (tokens - 1, at) if tokens >= 1 else (tokens, at)
        while len(self._budgets) > SPAM_OBJECTS:
            self._budgets.popitem(last=False)
        return tokens >= 1

    def bind(self, client: Client, informers: Informers) -> None:
        self.client = client
        self.informers = informers

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        """The keys of this controller an object of `resource` concerns (default: the object
        itself when it is of the primary resource)."""
        if resource == self.resources[0]:
            return (text_key(obj),)
        return ()

    async def reconcile(self, key: str) -> float | None:
        """Make `key`'s object as it should be; a number: look again after that many seconds.
        Raising queues the key again with backoff."""
        raise NotImplementedError

    def event(
        self,
        obj: Obj,
        event_type: str,
        reason: str,
        message: str,
        *,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        """Record an Event about `obj` (its kind and apiVersion unless given), sent beside the
        reconcile, as kube-controller-manager's recorder does: `kubectl describe` shows it, the
        API counts a repeat of the same event on it, and an object past its budget of events
        (SPAM_BURST) is told no more until it refills. It goes behind the client's pod creates,
        waiting a couple of seconds at most (`Client.record_event`); waiting, it counts as in
        flight (MAX_EVENTS_IN_FLIGHT)."""
        kind = kind or obj.get("kind")
        api_version = api_version or obj.get("apiVersion")
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if (
            not kind
            or not api_version
            or len(self._events) >= MAX_EVENTS_IN_FLIGHT
            or not self._may_tell(uid)
        ):
            log.debug("event %s not sent", reason)
            return
        task = asyncio.get_running_loop().create_task(
            self.client.record_event(
                obj,
                kind=kind,
                api_version=api_version,
                event_type=event_type,
                reason=reason,
                message=message,
                component=f"{self.name}-controller",
            )
        )
        self._events.add(task)
        task.add_done_callback(self._events.discard)
