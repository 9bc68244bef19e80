"""A shared informer per resource: list, then watch from the list's version, keeping a cache
of the objects by namespace/name and calling its handlers on each add, update and delete.

One informer per resource serves every controller of the manager (`Informers.get`). A watch
that ends is started again from the last version seen; a 410 (the version is too old) or any
error lists again, and the difference from the cache is handed to the handlers as the events
that were missed, so handlers never need to have seen every event (level-triggered).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from app.controllers.client import ApiError, Client, Gone, Obj, Resource

log = logging.getLogger("tessera.controllers")

# (event type: ADDED | MODIFIED | DELETED, the object before (None when added), the object)
Handler = Callable[[str, Obj | None, Obj], None]
Key = tuple[str, str]


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def text_key(obj: Obj) -> str:
    """`namespace/name` (or `name` for a cluster-scoped object): a work queue's key."""
    namespace, name = key_of(obj)
    return f"{namespace}/{name}" if namespace else name


def controller_of(obj: Obj) -> Obj | None:
    """The ownerReference with controller=true, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


class Informer:
    def __init__(self, client: Client, resource: Resource, *, params: dict[str, str] | None = None):
        self.client = client
        self.resource = resource
        self.params = dict(params or {})
        self.cache: dict[Key, Obj] = {}
        self._by_owner: dict[str, set[Key]] = {}  # controller owner uid -> keys of dependents
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self.resource_version = "0"
        self.relists = 0
        self._tombstones: dict[Key, int] = {}  # deleted keys and the version of their deletion

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    # --- reading the cache ------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.cache.get((namespace, name))

    def objects(self, namespace: str | None = None) -> list[Obj]:
        if namespace is None:
            return list(self.cache.values())
        return [obj for (ns, _), obj in self.cache.items() if ns == namespace]

    def owned_by(self, uid: str) -> list[Obj]:
        """The cached objects whose controller ownerReference is `uid`."""
        return [self.cache[k] for k in self._by_owner.get(uid, ()) if k in self.cache]

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self.cache.values()))

    # --- keeping it ---------------------------------------------------------------------------

    def _index(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            ref = controller_of(obj)
            if ref is None or not ref.get("uid"):
                continue
            keys = self._by_owner.setdefault(ref["uid"], set())
            if add:
                keys.add(key)
            else:
                keys.discard(key)
                if not keys:
                    del self._by_owner[ref["uid"]]

    def _notify(self, event: str, old: Obj | None, new: Obj) -> None:
        for handler in self.handlers:
            try:
                handler(event, old, new)
            except Exception:  # a handler's bug must not stop the informer
                log.exception("handler of %s failed on %s", self.resource, event)

    def apply(self, event: str, obj: Obj) -> None:
        """One event of the watch (or of a relist's difference, or a controller's own write)
        into the cache. An object older than the cached one (or than its deletion) is ignored:
        a controller's writes are in the cache before the watch brings them back, and the
        watch's older events of the same object cannot undo them."""
        key = key_of(obj)
        old = self.cache.get(key)
        version = _version(obj)
        if version is not None:
            if old is not None and (_version(old) or 0) > version:
                return
            if event != "DELETED" and self._tombstones.get(key, -1) >= version:
                return
        if event == "DELETED":
            if version is not None:
                self._tombstones[key] = version
            if old is None:
                return
            del self.cache[key]
            self._index(key, old, None)
            self._notify("DELETED", old, obj)
            return
        self._tombstones.pop(key, None)
        self.cache[key] = obj
        self._index(key, old, obj)
        self._notify("ADDED" if old is None else "MODIFIED", old, obj)

    def wrote(self, obj: Obj | None) -> None:
        """A controller wrote `obj` (the API's answer): the cache has it at once."""
        if obj is not None:
            self.apply("MODIFIED", obj)

    def removed(self, obj: Obj) -> None:
        """A controller deleted `obj` (gone at once, or marked for a graceful end)."""
        meta = obj.get("metadata") or {}
        self.apply("MODIFIED" if meta.get("deletionTimestamp") else "DELETED", obj)

    def _prune_tombstones(self) -> None:
        """Tombstones older than the watch's version can no longer be undone by an event."""
        current = int(self.resource_version) if self.resource_version.isdigit() else None
        if current is None or len(self._tombstones) < 1024:
            return
        self._tombstones = {k: v for k, v in self._tombstones.items() if v > current}

    def _replace(self, items: list[Obj]) -> None:
        """A list's answer: the cache becomes it; the difference goes to the handlers."""
        self._tombstones.clear()
        fresh = {key_of(obj): obj for obj in items}
        for key in [k for k in self.cache if k not in fresh]:
            self.apply("DELETED", self.cache[key])
        for key, obj in fresh.items():
            old = self.cache.get(key)
            same = old is not None and (old.get("metadata") or {}).get("resourceVersion") == (
                obj.get("metadata") or {}
            ).get("resourceVersion")
            if not same:
                if old is not None:  # the list is the truth, even older than a write seen
                    del self.cache[key]
                    self._index(key, old, None)
                self.cache[key] = obj
                self._index(key, None, obj)
                self._notify("ADDED" if old is None else "MODIFIED", old, obj)

    def resync(self) -> None:
        """Hand every cached object to the handlers again (as MODIFIED, unchanged)."""
        for obj in list(self.cache.values()):
            self._notify("MODIFIED", obj, obj)

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = 0.2
        listed = False
        while True:
            try:
                if not listed:
                    items, rv = await self.client.list(self.resource, **self.params)
                    self._replace(items)
                    self.resource_version = rv
                    self.relists += 1
                    listed = True
                    self.synced.set()
                timeout = random.randint(240, 480)  # spreads the watches' ends
                async for event, obj in self.client.watch(
                    self.resource,
                    self.resource_version,
                    timeout_seconds=timeout,
                    **self.params,
                ):
                    if event != "BOOKMARK":
                        self.apply(event, obj)
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resource_version = str(version)
                        self._prune_tombstones()
                backoff = 0.2
            except Gone:
                log.info(
                    "watch of %s: version %s is gone, listing again",
                    self.resource,
                    self.resource_version,
                )
                listed = False
            except (httpx.HTTPError, ApiError, ValueError) as exc:
                log.warning(
                    "watch of %s failed (%s); listing again in %.1fs", self.resource, exc, backoff
                )
                listed = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)


def _version(obj: Obj) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


class Informers:
    """The manager's informers, one per resource, shared by every controller."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.by_resource: dict[Resource, Informer] = {}

    def get(self, resource: Resource) -> Informer:
        informer = self.by_resource.get(resource)
        if informer is None:
            informer = self.by_resource[resource] = Informer(self.client, resource)
        return informer

    def __getitem__(self, resource: Resource) -> Informer:
        return self.by_resource[resource]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.by_resource.values()))

    def resync(self) -> None:
        for informer in self.by_resource.values():
            informer.resync()

    def values(self) -> Any:
        return self.by_resource.values()
