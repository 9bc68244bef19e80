"""Pod queries. Rows are plain mappings (SQLAlchemy Core): the hot paths never build ORM objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session

from app.db.engine import insert_unique, insert_unless_exists
from app.db.models import GPUAllocation, Pod, table
from app.pods.references import referenced

pods = table(Pod)

Row = Mapping[Any, Any]

# Field selectors that map to columns.
FIELD_COLUMNS = {
    "metadata.name": pods.c.name,
    "metadata.namespace": pods.c.namespace,
    "spec.nodeName": pods.c.node_name,
    "status.phase": pods.c.phase,
}


def insert_pod(session: Session, values: dict[str, Any]) -> bool:
    """Insert a pod; False (and nothing written) when its namespace already has that name."""
    return insert_unless_exists(session, pods, values)


def add_pod(
    session: Session, values: dict[str, Any], *, conflict: Callable[[], BaseException]
) -> None:
    """Insert a new pod with the transaction's other new pods, just before it commits; when its
    namespace already has that name, the write fails with `conflict()` (see `insert_unique`)."""
    insert_unique(session, pods, values, conflict=conflict)


def get(session: Session, namespace: str, name: str, *, for_update: bool = False) -> Row | None:
    query = select(pods).where(pods.c.namespace == namespace, pods.c.name == name)
    if for_update:
        query = query.with_for_update()
    return session.execute(query).mappings().first()


def get_by_uid(session: Session, uid: str, *, for_update: bool = False) -> Row | None:
    query = select(pods).where(pods.c.uid == uid)
    if for_update:
        query = query.with_for_update()
    return session.execute(query).mappings().first()


def name_taken(session: Session, namespace: str, name: str) -> bool:
    query = select(pods.c.uid).where(pods.c.namespace == namespace, pods.c.name == name)
    return session.execute(query).first() is not None


def page(
    session: Session,
    *,
    tenant_id: int | None,
    namespace: str | None,
    fields: Sequence[tuple[str, str, bool]],
    after: tuple[str, str] | None,
    size: int,
) -> list[Row]:
    """Up to `size` pods ordered by (namespace, name), strictly after `after`.

    `tenant_id=None` means every tenant (the admin's view). `fields` are (field, value, negate).
    """
    query = select(pods).order_by(pods.c.namespace, pods.c.name).limit(size)
    if tenant_id is not None:
        query = query.where(pods.c.tenant_id == tenant_id)
    if namespace is not None:
        query = query.where(pods.c.namespace == namespace)
    for field, value, negate in fields:
        column = FIELD_COLUMNS[field]
        if field == "spec.nodeName" and value == "":
            query = query.where(column.is_not(None) if negate else column.is_(None))
        elif negate:
            query = query.where(or_(column.is_(None), column != value))
        else:
            query = query.where(column == value)
    if after is not None:
        ns, name = after
        query = query.where(
            or_(pods.c.namespace > ns, and_(pods.c.namespace == ns, pods.c.name > name))
        )
    return list(session.execute(query).mappings())


def update_pod(
    session: Session, uid: str, values: dict[str, Any], *, expected_rv: int | None = None
) -> bool:
    """Update one pod; with `expected_rv`, only if it is still at that resourceVersion."""
    query = update(pods).where(pods.c.uid == uid)
    if expected_rv is not None:
        query = query.where(pods.c.resource_version == expected_rv)
    result = session.execute(query.values(**values))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def delete_pod(session: Session, uid: str) -> None:
    session.execute(delete(GPUAllocation).where(GPUAllocation.pod_uid == uid))
    session.execute(delete(pods).where(pods.c.uid == uid))


def allocations(session: Session, pod_uids: Sequence[str]) -> dict[str, list[Row]]:
    if not pod_uids:
        return {}
    rows = session.execute(
        select(GPUAllocation.__table__)
        .where(GPUAllocation.pod_uid.in_(pod_uids))
        .order_by(GPUAllocation.gpu_name)
    ).mappings()
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row["pod_uid"], []).append(row)
    return out


def group_members(session: Session, namespace: str, group: str) -> list[Row]:
    """The pods of a pod group, by name."""
    return list(
        session.execute(
            select(pods)
            .where(pods.c.namespace == namespace, pods.c.pod_group == group)
            .order_by(pods.c.name)
        ).mappings()
    )


def holders_of(session: Session, gpu_name: str) -> list[str]:
    """The uids of the pods holding a fragment of a GPU, oldest allocation first."""
    return list(
        session.scalars(
            select(GPUAllocation.pod_uid)
            .where(GPUAllocation.gpu_name == gpu_name)
            .order_by(GPUAllocation.id)
        )
    )


def node_using(
    session: Session, *, namespace: str, node: str, resource: str, name: str
) -> str | None:
    """`node` when a pod of the namespace bound to it uses the ConfigMap or Secret `name`
    (`resource`: configmaps or secrets), else None."""
    query = select(pods.c.spec).where(pods.c.namespace == namespace, pods.c.node_name == node)
    for spec in session.scalars(query):
        if (resource, name) in referenced(spec):
            return node
    return None


def uid_of(session: Session, *, namespace: str, name: str) -> str | None:
    query = select(pods.c.uid).where(pods.c.namespace == namespace, pods.c.name == name)
    return session.scalar(query)


def node_of(session: Session, *, namespace: str, name: str) -> str | None:
    """The node a pod is bound to (None when it is not bound, or does not exist)."""
    query = select(pods.c.node_name).where(pods.c.namespace == namespace, pods.c.name == name)
    return session.scalar(query)
