"""Namespaces and the tenancy check every namespaced request goes through."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from app.auth import rules
from app.auth.rules import forbidden
from app.constants import SYSTEM_NAMESPACES
from app.db.engine import next_resource_version, record_change
from app.db.models import Namespace, Pod, Tenant
from app.errors import AlreadyExists, Conflict, Invalid, NotFound, ResourceRef
from app.kube.meta import now, timestamp, validate_annotations, validate_labels, validate_name

if TYPE_CHECKING:
    from app.auth.service import Principal


class NamespaceContents(Protocol):
    """A kind a namespace holds, deleted with it through its own store (app/registry), so that
    the change log and every watcher see each deletion."""

    def delete_namespace(self, session: Session, namespace: str) -> None: ...

    def holds(self, session: Session, namespace: str) -> bool: ...


# Registered by the stores that keep namespaced kinds (the registry's, and each kind kept in a
# table of its own), on import.
CONTENTS: list[NamespaceContents] = []


@dataclass(frozen=True)
class TableContents:
    """A namespaced kind kept in a table of its own: a namespace's deletion deletes its rows one
    by one through the kind's own delete (which logs each DELETED), never by a cascade."""

    table: Table
    delete: Callable[[Session, Mapping[Any, Any]], object]

    def delete_namespace(self, session: Session, namespace: str) -> None:
        rows = session.execute(select(self.table).where(self.table.c.namespace == namespace))
        for row in rows.mappings().all():
            self.delete(session, row)

    def holds(self, session: Session, namespace: str) -> bool:
        query = select(func.count()).select_from(self.table)
        return bool(session.scalar(query.where(self.table.c.namespace == namespace)))


@dataclass(frozen=True)
class NamespaceInfo:
    name: str
    tenant_id: int | None
    terminating: bool


def exists(session: Session, name: str) -> bool:
    return session.get(Namespace, name) is not None


def create(
    session: Session,
    *,
    name: str,
    tenant_id: int | None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Namespace:
    causes = (
        validate_name(name, "metadata.name", label=True)
        + validate_labels(labels or {}, "metadata.labels")
        + validate_annotations(annotations or {}, "metadata.annotations")
    )
    if causes:
        raise Invalid(f'Namespace "{name}" is invalid: {causes[0].message}', causes=causes)
    if session.get(Namespace, name) is not None:
        raise AlreadyExists(
            f'namespaces "{name}" already exists', ref=ResourceRef("namespaces", name)
        )
    row = Namespace(
        name=name,
        uid=str(uuid.uuid4()),
        tenant_id=tenant_id,
        resource_version=next_resource_version(session),
        created_at=now(),
        labels={"kubernetes.io/metadata.name": name, **(labels or {})},
        annotations=annotations or {},
    )
    session.add(row)
    session.flush()
    _record(session, row, "ADDED")
    return row


def create_for(
    session: Session,
    principal: Principal,
    *,
    name: str,
    labels: dict[str, str] | None,
    annotations: dict[str, str] | None,
) -> Namespace:
    """A tenant creates `<tenant>` or `<tenant>-<suffix>`; the admin creates system namespaces."""
    rules.require(principal, verb="create", resource="namespaces", name=name)
    tenant_id = None if principal.is_admin else principal.tenant_id
    return create(session, name=name, tenant_id=tenant_id, labels=labels, annotations=annotations)


def apply(
    session: Session,
    principal: Principal,
    name: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> tuple[Namespace, bool]:
    """Server-side apply: create the namespace, or add the applied labels and annotations to
    it. Returns the namespace and whether it was created."""
    row = session.get(Namespace, name)
    if row is None:
        return create_for(
            session, principal, name=name, labels=labels, annotations=annotations
        ), True
    current = get(session, principal, name, verb="patch")
    updated = update_metadata(
        session,
        principal,
        name,
        labels={**current.labels, **labels},
        annotations={**current.annotations, **annotations},
    )
    return updated, False


def ensure_system_namespaces(session: Session) -> None:
    for name in SYSTEM_NAMESPACES:
        if session.get(Namespace, name) is None:
            create(session, name=name, tenant_id=None)


def get(session: Session, principal: Principal, name: str, verb: str = "get") -> Namespace:
    """The namespace, when the caller may see it. A tenant asking for a name it may create
    (`<tenant>` or `<tenant>-<suffix>`) that does not exist gets 404, as `kubectl apply` expects
    before it creates one; any other name is 403 whether or not it exists."""
    row = session.get(Namespace, name)
    info = (
        None
        if row is None
        else NamespaceInfo(row.name, row.tenant_id, row.deletion_timestamp is not None)
    )
    decision = rules.decide(principal, rules.Attributes(verb, "namespaces", name=name), info)
    if not decision.allowed:
        raise forbidden(principal, verb, "namespaces", None, name, reason=decision.reason)
    if row is None:
        raise NotFound(f'namespaces "{name}" not found', ref=ResourceRef("namespaces", name))
    return row


def update_metadata(
    session: Session,
    principal: Principal,
    name: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
    resource_version: str | None = None,
) -> Namespace:
    """Set a namespace's labels and annotations (what `kubectl label ns`, `annotate ns` and
    `apply` change). `kubernetes.io/metadata.name` stays the namespace's name, as in Kubernetes."""
    row = get(session, principal, name, verb="patch")
    if resource_version not in (None, "") and str(resource_version) != str(row.resource_version):
        raise Conflict(
            f'Operation cannot be fulfilled on namespaces "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            ref=ResourceRef("namespaces", name),
        )
    labels = {**labels, "kubernetes.io/metadata.name": name}
    causes = validate_labels(labels, "metadata.labels")
    if causes:
        raise Invalid(f'Namespace "{name}" is invalid: {causes[0].message}', causes=causes)
    if labels == row.labels and annotations == row.annotations:
        return row
    row.labels = labels
    row.annotations = annotations
    row.resource_version = next_resource_version(session)
    session.flush()
    _record(session, row, "MODIFIED")
    return row


def list_visible(session: Session, principal: Principal) -> list[Namespace]:
    query = select(Namespace).order_by(Namespace.name)
    if not principal.is_admin:
        query = query.where(Namespace.tenant_id == principal.tenant_id)
    return list(session.scalars(query))


def delete(session: Session, principal: Principal, name: str) -> Namespace:
    """Delete a namespace as Kubernetes does: an empty one goes at once; one that holds pods is
    marked Terminating, what it holds is deleted, each kind through its own delete (`CONTENTS`:
    pods gracefully, running ones getting their grace period; objects with finalizers are only
    marked), and the namespace is removed with the last of it (see `remove_if_emptied`). Nothing
    new can be created in a Terminating namespace."""
    row = get(session, principal, name, verb="delete")  # the rules keep system namespaces
    if row.deletion_timestamp is None:
        row.deletion_timestamp = now()
        row.resource_version = next_resource_version(session)
        session.flush()
        _record(session, row, "MODIFIED")
    for contents in CONTENTS:
        contents.delete_namespace(session, name)
    remove_if_emptied(session, name)
    return row


def remove_if_emptied(session: Session, name: str) -> None:
    """A pod of namespace `name` was removed: remove the namespace if it is Terminating and that
    was its last pod."""
    row = session.get(Namespace, name)
    if row is not None and row.deletion_timestamp is not None and not _holds_pods(session, name):
        _record(session, row, "DELETED")
        session.delete(row)
        session.flush()


def _holds_pods(session: Session, name: str) -> bool:
    """Whether the namespace still holds pods or objects of another kind (finalizers can keep
    an object after its deletion)."""
    count = session.scalar(select(func.count()).select_from(Pod).where(Pod.namespace == name))
    return bool(count) or any(contents.holds(session, name) for contents in CONTENTS)


def to_api(row: Namespace) -> dict[str, Any]:
    deleting = row.deletion_timestamp
    metadata: dict[str, Any] = {
        "name": row.name,
        "uid": row.uid,
        "resourceVersion": str(row.resource_version),
        "creationTimestamp": timestamp(row.created_at),
        "labels": row.labels,
    }
    if deleting is not None:
        metadata["deletionTimestamp"] = timestamp(deleting)
        metadata["deletionGracePeriodSeconds"] = 0
    if row.annotations:
        metadata["annotations"] = row.annotations
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": metadata,
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Terminating" if deleting else "Active"},
    }


def _record(session: Session, row: Namespace, event_type: str) -> None:
    record_change(
        session,
        {
            "resource_version": row.resource_version
            if event_type != "DELETED"
            else next_resource_version(session),
            "kind": "Namespace",
            "namespace": None,
            "name": row.name,
            "tenant_id": row.tenant_id,
            "type": event_type,
            "object": to_api(row),
        },
    )


class NamespaceDirectory:
    """Who owns which namespace, cached for `ttl` seconds (namespaces change rarely).

    The tenancy check on the hot path (every namespaced request) then costs no query.
    """

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._cache: dict[str, tuple[NamespaceInfo | None, float]] = {}
        self._lock = threading.Lock()

    def lookup_cached(self, name: str) -> tuple[bool, NamespaceInfo | None]:
        entry = self._cache.get(name)
        if entry is None or entry[1] < time.monotonic():
            return False, None
        return True, entry[0]

    def lookup(self, session: Session, name: str) -> NamespaceInfo | None:
        hit, info = self.lookup_cached(name)
        if hit:
            return info
        row = session.execute(
            select(Namespace.name, Namespace.tenant_id, Namespace.deletion_timestamp).where(
                Namespace.name == name
            )
        ).first()
        info = (
            None
            if row is None
            else NamespaceInfo(row.name, row.tenant_id, row.deletion_timestamp is not None)
        )
        with self._lock:
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[name] = (info, time.monotonic() + self.ttl)
        return info

    def forget(self, name: str) -> None:
        with self._lock:
            self._cache.pop(name, None)


def authorize(
    principal: Principal,
    info: NamespaceInfo | None,
    *,
    verb: str,
    resource: str,
    namespace: str,
    name: str = "",
    group: str = "",
    object_node: str | None = None,
) -> NamespaceInfo:
    """Allow the request or raise: 403 for a tenant whatever exists; 404 for the admin."""
    attrs = rules.Attributes(verb, "", group, namespace=namespace, name=name).with_resource(
        resource
    )
    decision = rules.decide(principal, attrs, info, object_node=object_node)
    if not decision.allowed:
        raise forbidden(principal, verb, resource, namespace, name, group, decision.reason)
    if info is None:
        raise NotFound(
            f'namespaces "{namespace}" not found', ref=ResourceRef("namespaces", namespace)
        )
    return info


def tenant_name(session: Session, tenant_id: int | None) -> str | None:
    if tenant_id is None:
        return None
    return session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))
