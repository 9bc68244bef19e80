"""The garbage collector: what ownerReferences mean when an owner is deleted, as Kubernetes'
garbage collector does it, through the API only.

An object names its owners in `metadata.ownerReferences` (a ReplicaSet its Deployment, a pod
its ReplicaSet or Job). Deleting an owner decides its dependents' fate by the deletion's
`propagationPolicy` (app/registry/store.py):

- **Background** (the default): the owner goes at once; here, every dependent whose owners are
  all gone is deleted (a dependent with another owner still there stays).
- **Foreground**: the owner stays, marked with the `foregroundDeletion` finalizer, while its
  dependents are deleted (Foreground too, so that their own dependents go first); once none is
  left, the finalizer is removed and the owner goes.
- **Orphan**: the owner stays, marked with the `orphan` finalizer, until its reference is
  taken off every dependent; then the finalizer is removed and the owner goes. The dependents
  stay, on their own.

Before a dependent is deleted for a missing owner, the owner is read from the API (not from the
cache, which may lag behind a create), and the deletion carries the dependent's uid as a
precondition: an object made again under the same name is never deleted for its predecessor.
So does its resourceVersion: the caches of owners and dependents come from separate watches, and
a dependent whose reference an Orphan deletion took off may still name its owner here after the
owner is gone; only the version judged abandoned is deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.controllers.base import Controller
from app.controllers.client import ApiError, Obj, Resource
from app.controllers.informer import key_of

log = logging.getLogger("tessera.controllers.gc")

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
FOREGROUND_AGAIN_SECONDS = 1.0  # how soon a waiting owner looks at its dependents again


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


class GarbageCollector(Controller):
    """Keys are `<resource index>|<namespace>/<name>`: one queue for every resource watched."""

    name = "garbage-collector"
    workers = 2

    def __init__(self, owners: Mapping[Resource, str], dependents: Sequence[Resource]) -> None:
        """`owners`: the resources whose objects own others, with their kinds (as
        ownerReferences name them); `dependents`: the resources whose objects are owned."""
        super().__init__()
        # every resource watched, owners first; an index into it names a key's resource
        watched: list[Resource] = list(owners)
        watched += [r for r in dependents if r not in watched]
        self.watched = tuple(watched)
        self.resources = self.watched  # type: ignore[misc]
        self.owner_kinds = {(r.api_version, kind): r for r, kind in owners.items()}
        # every event of every watched resource asks these: looked up, not searched
        self._positions = {r: i for i, r in enumerate(self.watched)}
        self._owner_resources = frozenset(owners)
        self.dependent_resources = tuple(r for r in self.watched if r in dependents)

    # --- keys -----------------------------------------------------------------------------

    def _key(self, resource: Resource, obj: Obj) -> str:
        namespace, name = key_of(obj)
        return f"{self._positions[resource]}|{namespace}/{name}"

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        keys = [self._key(resource, obj)]
        if resource in self._owner_resources:
            # an owner that changed (marked, or gone): its dependents have something to do
            keys += [self._key(r, d) for r, d in self._dependents_of(_meta(obj).get("uid", ""))]
        return keys

    def _parse(self, key: str) -> tuple[Resource, str, str]:
        index, _, rest = key.partition("|")
        namespace, _, name = rest.rpartition("/")
        return self.watched[int(index)], namespace, name

    # --- the caches -------------------------------------------------------------------------

    def _dependents_of(self, uid: str) -> list[tuple[Resource, Obj]]:
        if not uid:
            return []
        return [
            (resource, obj)
            for resource in self.dependent_resources
            for obj in self.informers[resource].referencing(uid)
        ]

    def _owner_resource(self, ref: dict[str, Any]) -> Resource | None:
        return self.owner_kinds.get((str(ref.get("apiVersion")), str(ref.get("kind"))))

    def _cached_owner(self, namespace: str, ref: dict[str, Any]) -> Obj | None:
        resource = self._owner_resource(ref)
        if resource is None:
            return None
        owner = self.informers[resource].get(namespace if resource.namespaced else "", ref["name"])
        return owner if owner is not None and _meta(owner).get("uid") == ref.get("uid") else None

    # --- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        resource, namespace, name = self._parse(key)
        obj = self.informers[resource].get(namespace, name)
        if obj is None:
            return None
        meta = _meta(obj)
        if meta.get("deletionTimestamp"):
            finalizers = meta.get("finalizers") or []
            if ORPHAN in finalizers:
                await self._orphan(resource, obj)
                return None
            if FOREGROUND in finalizers:
                return await self._foreground(resource, obj)
        await self._collect_if_abandoned(resource, obj)
        return None

    async def _orphan(self, resource: Resource, owner: Obj) -> None:
        uid = _meta(owner)["uid"]
        for dep_resource, dependent in self._dependents_of(uid):
            dmeta = _meta(dependent)
            kept = [r for r in dmeta.get("ownerReferences") or [] if r.get("uid") != uid]
            await self._tolerate_gone(
                self.client.patch(
                    dep_resource,
                    dmeta.get("namespace"),
                    dmeta["name"],
                    {
                        "metadata": {
                            "ownerReferences": kept or None,
                            "resourceVersion": dmeta.get("resourceVersion"),
                        }
                    },
                )
            )
        await self._release(resource, owner, ORPHAN)

    async def _foreground(self, resource: Resource, owner: Obj) -> float | None:
        dependents = self._dependents_of(_meta(owner)["uid"])
        if not dependents:
            await self._release(resource, owner, FOREGROUND)
            return None
        for dep_resource, dependent in dependents:
            dmeta = _meta(dependent)
            if dmeta.get("deletionTimestamp"):
                continue  # on its way: wait for it to go
            await self.client.delete(
                dep_resource,
                dmeta.get("namespace"),
                dmeta["name"],
                uid=dmeta.get("uid"),
                propagation="Foreground" if dep_resource in self.owner_kinds.values() else None,
            )
        return FOREGROUND_AGAIN_SECONDS  # their DELETED events bring the owner back sooner

    async def _release(self, resource: Resource, owner: Obj, finalizer: str) -> None:
        meta = _meta(owner)
        rest = [f for f in meta.get("finalizers") or [] if f != finalizer]
        await self._tolerate_gone(
            self.client.patch(
                resource,
                meta.get("namespace"),
                meta["name"],
                {
                    "metadata": {
                        "finalizers": rest or None,
                        "resourceVersion": meta.get("resourceVersion"),
                    }
                },
            )
        )

    async def _collect_if_abandoned(self, resource: Resource, obj: Obj) -> None:
        """Delete `obj` when every owner it names is gone (read from the API to be sure)."""
        meta = _meta(obj)
        refs = meta.get("ownerReferences") or []
        if not refs or meta.get("deletionTimestamp"):
            return
        namespace = str(meta.get("namespace") or "")
        for ref in refs:
            if self._cached_owner(namespace, ref) is not None:
                return  # an owner is there
            owner_resource = self._owner_resource(ref)
            if owner_resource is None:
                return  # an owner of a kind not watched here: never judged gone
            try:
                live = await self.client.get(
                    owner_resource, namespace if owner_resource.namespaced else None, ref["name"]
                )
            except ApiError as exc:
                if not exc.not_found:
                    raise
                continue
            if _meta(live).get("uid") == ref.get("uid"):
                return  # there after all: the cache lags behind
        log.info("deleting %s %s/%s: its owners are gone", resource, namespace, meta.get("name"))
        try:
            await self.client.delete(
                resource,
                namespace or None,
                meta["name"],
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
                propagation="Background",
            )
        except ApiError as exc:
            if not exc.conflict:
                raise
            # changed since it was judged (its references taken off by an Orphan deletion,
            # perhaps): its newer version comes through the watch and is judged again

    @staticmethod
    async def _tolerate_gone(call: Any) -> None:
        try:
            await call
        except ApiError as exc:
            if not exc.not_found:
                raise
