"""Namespaces and the tenancy check every namespaced request goes through."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.engine import next_resource_version, record_change
from app.db.models import Namespace, Pod, Tenant
from app.errors import AlreadyExists, Conflict, Forbidden, Invalid, NotFound, ResourceRef
from app.kube.meta import now, timestamp, validate_annotations, validate_labels, validate_name

if TYPE_CHECKING:
    from app.auth.service import Principal

SYSTEM_NAMESPACES = ("default", "tessera-system")


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
    if principal.is_admin:
        return create(session, name=name, tenant_id=None, labels=labels, annotations=annotations)
    tenant = principal.tenant_name or ""
    if name != tenant and not name.startswith(tenant + "-"):
        raise Forbidden(
            f'namespaces "{name}" is forbidden: tenant "{tenant}" may create namespaces named '
            f'"{tenant}" or "{tenant}-<suffix>"',
            ref=ResourceRef("namespaces", name),
        )
    return create(
        session, name=name, tenant_id=principal.tenant_id, labels=labels, annotations=annotations
    )


def ensure_system_namespaces(session: Session) -> None:
    for name in SYSTEM_NAMESPACES:
        if session.get(Namespace, name) is None:
            create(session, name=name, tenant_id=None)


def get(session: Session, principal: Principal, name: str) -> Namespace:
    row = session.get(Namespace, name)
    if row is None or not _visible(principal, row.tenant_id):
        if principal.is_admin:
            raise NotFound(f'namespaces "{name}" not found', ref=ResourceRef("namespaces", name))
        raise forbidden(principal, "get", "namespaces", None, name)
    return row


def list_visible(session: Session, principal: Principal) -> list[Namespace]:
    query = select(Namespace).order_by(Namespace.name)
    if not principal.is_admin:
        query = query.where(Namespace.tenant_id == principal.tenant_id)
    return list(session.scalars(query))


def delete(session: Session, principal: Principal, name: str) -> Namespace:
    """Delete an empty namespace. Pods must be deleted first (kubectl delete pods --all -n NS)."""
    row = get(session, principal, name)
    if name in SYSTEM_NAMESPACES:
        raise Forbidden(f'namespaces "{name}" is forbidden: a system namespace cannot be deleted')
    pods = session.scalar(select(func.count()).select_from(Pod).where(Pod.namespace == name)) or 0
    if pods:
        raise Conflict(
            f'namespaces "{name}" still holds {pods} pod(s): delete them first '
            f"(kubectl delete pods --all -n {name})",
            ref=ResourceRef("namespaces", name),
        )
    _record(session, row, "DELETED")
    session.delete(row)
    return row


def to_api(row: Namespace, deleting: datetime | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": row.name,
        "uid": row.uid,
        "resourceVersion": str(row.resource_version),
        "creationTimestamp": timestamp(row.created_at),
        "labels": row.labels,
    }
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


def _visible(principal: Principal, tenant_id: int | None) -> bool:
    return principal.is_admin or (tenant_id is not None and tenant_id == principal.tenant_id)


def forbidden(
    principal: Principal,
    verb: str,
    resource: str,
    namespace: str | None,
    name: str = "",
    group: str = "",
) -> Forbidden:
    """Kubernetes' RBAC wording; identical whether or not the object exists."""
    what = f"{resource}.{group}" if group else resource
    target = f' "{name}"' if name else ""
    scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return Forbidden(
        f'{what}{target} is forbidden: User "{principal.username}" cannot {verb} resource '
        f'"{resource}" in API group "{group}"{scope}',
        ref=ResourceRef(resource, name, group),
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
) -> NamespaceInfo:
    """Allow the request or raise: 403 for a tenant whatever exists; 404 for the admin."""
    if info is not None and _visible(principal, info.tenant_id):
        return info
    if principal.is_admin:
        raise NotFound(
            f'namespaces "{namespace}" not found', ref=ResourceRef("namespaces", namespace)
        )
    raise forbidden(principal, verb, resource, namespace, name, group)


def tenant_name(session: Session, tenant_id: int | None) -> str | None:
    if tenant_id is None:
        return None
    return session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))
