"""What a controller is to the manager: the resources it watches, which of its keys an event
concerns, and `reconcile(key)`: read what is, compute what should be, write the difference.

A controller never assumes it saw every event (a restart, a relist or a missed watch all end
in `reconcile` of the keys concerned); it acts through the API only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import ClassVar

from app.controllers.client import Client, Obj, Resource
from app.controllers.informer import Informers, text_key
from app.controllers.queue import WorkQueue

log = logging.getLogger("tessera.controllers")
MAX_EVENTS_IN_FLIGHT = 1000  # events being sent per controller; more are dropped (best effort)


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
        reconcile, as kube-controller-manager's recorder does: `kubectl describe` shows it, and
        the API counts a repeat of the same event on it."""
        kind = kind or obj.get("kind")
        api_version = api_version or obj.get("apiVersion")
        if not kind or not api_version or len(self._events) >= MAX_EVENTS_IN_FLIGHT:
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
