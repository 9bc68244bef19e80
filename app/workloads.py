"""A pod's workload: the top of its chain of controllers (a ReplicaSet's Deployment, a Job's
CronJob or JobSet), as `Kind/name`, which billing records with the pod's usage so that usage can
be reported by workload (`groupBy=workload`) after the workload itself is gone.

The chain is followed through each object's controller reference (the ownerReference with
`controller: true`) while the owner is an object the registry keeps in the owner's namespace
with the uid the reference names; it ends at an object with no controller, at an owner Tessera
does not keep (the reference itself is then the top) or after `MAX_DEPTH` steps. A pod no
controller owns has no workload (None).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import StoredObject, table
from app.registry.kinds import KINDS

objects_t = table(StoredObject)
MAX_DEPTH = 8  # owners followed up from a pod's controller (Pod -> Job -> CronJob is 2)
MAX_LENGTH = 320  # a kind (63) and a name (253) and the slash between them

# (API group, kind) -> the registry's resource, for the kinds kept in the objects table
_KEPT = {(k.group, k.kind): k.resource for k in KINDS if k.table is None and k.namespaced}

Ref = Mapping[str, Any]


def controller_of(refs: Sequence[Ref] | None) -> Ref | None:
    """The ownerReference marked `controller: true`, if any (Kubernetes allows one)."""
    for ref in refs or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def key(ref: Ref) -> tuple[str, str, str, str]:
    """What identifies an owner: its apiVersion, kind, name and uid."""
    return (
        str(ref.get("apiVersion") or ""),
        str(ref.get("kind") or ""),
        str(ref.get("name") or ""),
        str(ref.get("uid") or ""),
    )


def name_of(ref: Ref) -> str:
    return f"{ref.get('kind')}/{ref.get('name')}"[:MAX_LENGTH]


def top(session: Session, namespace: str, refs: Sequence[Ref] | None) -> str | None:
    """The workload of an object of `namespace` whose ownerReferences are `refs`."""
    ref = controller_of(refs)
    if ref is None:
        return None
    for _ in range(MAX_DEPTH):
        api_version = str(ref.get("apiVersion") or "")
        group = api_version.rpartition("/")[0]
        resource = _KEPT.get((group, str(ref.get("kind") or "")))
        if resource is None:
            break
        body = session.scalar(
            select(objects_t.c.body).where(
                objects_t.c.api_group == group,
                objects_t.c.resource == resource,
                objects_t.c.namespace == namespace,
                objects_t.c.name == str(ref.get("name") or ""),
                objects_t.c.uid == str(ref.get("uid") or ""),
            )
        )
        owner = controller_of(((body or {}).get("metadata") or {}).get("ownerReferences"))
        if owner is None:
            break
        ref = owner
    return name_of(ref)


OwnerKey = tuple[str, str, str, str, str]  # namespace, and the owner's `key`


class Cache:
    """Workloads read lately, by the namespace and controller reference they were read for, so
    that the pods of one owner, created in many requests (a ReplicaSet's slow start), cost one
    read. Bounded per tenant: each tenant's `per_tenant` entries at most (its oldest go first,
    never another tenant's), each kept `ttl` seconds (an owner adopted or orphaned meanwhile
    counts for the pods created after that). Used from one event loop: no lock."""

    def __init__(
        self,
        *,
        per_tenant: int = 1024,
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_tenant = per_tenant
        self.ttl = ttl
        self._clock = clock
        self._tenants: dict[int | None, OrderedDict[OwnerKey, tuple[str | None, float]]] = {}

    def get(self, tenant: int | None, key: OwnerKey) -> tuple[bool, str | None]:
        """(True, the workload) when it was read less than `ttl` ago; (False, None) if not."""
        entries = self._tenants.get(tenant)
        found = entries.get(key) if entries is not None else None
        if found is None:
            return False, None
        assert entries is not None
        value, expires = found
        if expires <= self._clock():
            del entries[key]
            if not entries:
                del self._tenants[tenant]
            return False, None
        return True, value

    def put(self, tenant: int | None, key: OwnerKey, value: str | None) -> None:
        entries = self._tenants.setdefault(tenant, OrderedDict())
        entries[key] = (value, self._clock() + self.ttl)
        entries.move_to_end(key)
        while len(entries) > self.per_tenant:
            entries.popitem(last=False)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._tenants.values())
