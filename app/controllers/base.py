"""What a controller is to the manager: the resources it watches, which of its keys an event
concerns, and `reconcile(key)`: read what is, compute what should be, write the difference.

A controller never assumes it saw every event (a restart, a relist or a missed watch all end
in `reconcile` of the keys concerned); it acts through the API only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from app.controllers.client import Client, Obj, Resource
from app.controllers.informer import Informers, text_key
from app.controllers.queue import WorkQueue


class Controller:
    name: ClassVar[str]
    # the resources it watches; the first is the one its keys name
    resources: ClassVar[tuple[Resource, ...]]
    workers: ClassVar[int] = 2

    def __init__(self) -> None:
        self.client: Client
        self.informers: Informers
        self.queue = WorkQueue()

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
