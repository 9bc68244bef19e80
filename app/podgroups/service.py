"""Pod groups. A pod joins one with the label `tessera.io/pod-group: NAME` (same namespace);
the scheduler places a group's pending pods as one gang once `minMember` of them exist."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from app.constants import TESSERA_GROUP
from app.db.engine import insert_unless_exists, next_resource_version, record_change
from app.db.models import Pod, PodGroup, table
from app.errors import AlreadyExists, Cause, Conflict, NotFound, ResourceRef, invalid
from app.kube.meta import now, timestamp, validate_annotations, validate_labels, validate_name
from app.namespaces.service import NamespaceInfo
from app.podgroups.schemas import PodGroup as PodGroupBody

groups_t = table(PodGroup)
pods_t = table(Pod)
Row = Mapping[Any, Any]
FIELD_SELECTORS = ("metadata.name", "metadata.namespace")
API_VERSION = f"{TESSERA_GROUP}/v1"


def create(session: Session, *, namespace: NamespaceInfo, body: PodGroupBody) -> dict[str, Any]:
    name = body.metadata.name or ""
    causes = (
        validate_name(name, "metadata.name")
        + validate_labels(body.metadata.labels or {}, "metadata.labels")
        + validate_annotations(body.metadata.annotations or {}, "metadata.annotations")
    )
    causes += _topology_causes(body)
    if causes:
        raise invalid("PodGroup", name, causes, group=TESSERA_GROUP)
    values = {
        "uid": str(uuid.uuid4()),
        "namespace": namespace.name,
        "name": name,
        "tenant_id": namespace.tenant_id,
        "resource_version": next_resource_version(session),
        "created_at": now(),
        "labels": dict(body.metadata.labels or {}),
        "annotations": dict(body.metadata.annotations or {}),
        "min_member": body.spec.min_member,
        "required_topology": body.spec.topology.required,
        "preferred_topology": body.spec.topology.preferred,
    }
    if not insert_unless_exists(session, groups_t, values):
        raise AlreadyExists(
            f'podgroups.{TESSERA_GROUP} "{name}" already exists',
            ref=ResourceRef("podgroups", name, TESSERA_GROUP),
        )
    obj = to_api(values, _members(session, namespace.name, [name]))
    _log(session, values, obj, "ADDED")
    return obj


def get_row(session: Session, namespace: str, name: str) -> Row:
    row = (
        session.execute(
            select(groups_t).where(groups_t.c.namespace == namespace, groups_t.c.name == name)
        )
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(
            f'podgroups.{TESSERA_GROUP} "{name}" not found',
            ref=ResourceRef("podgroups", name, TESSERA_GROUP),
        )
    return row


def exists(session: Session, namespace: str, name: str) -> bool:
    query = select(groups_t.c.uid).where(groups_t.c.namespace == namespace, groups_t.c.name == name)
    return session.execute(query).first() is not None


def get(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    row = get_row(session, namespace, name)
    return to_api(row, _members(session, namespace, [name]))


def list_groups(
    session: Session, *, tenant_id: int | None, namespace: str | None
) -> list[dict[str, Any]]:
    query = select(groups_t).order_by(groups_t.c.namespace, groups_t.c.name)
    if tenant_id is not None:
        query = query.where(groups_t.c.tenant_id == tenant_id)
    if namespace is not None:
        query = query.where(groups_t.c.namespace == namespace)
    rows = list(session.execute(query).mappings())
    counts = _member_counts(session, tenant_id=tenant_id, namespace=namespace)
    return [to_api(r, counts.get((r["namespace"], r["name"]), {})) for r in rows]


def update_group(
    session: Session, *, namespace: str, name: str, body: PodGroupBody
) -> dict[str, Any]:
    """Labels, annotations and the spec may change; the spec applies to pods not yet placed.
    The name and namespace may not (422, as Kubernetes answers)."""
    row = get_row(session, namespace, name)
    identity = [
        Cause(path, f'Invalid value: "{value}": field is immutable', "FieldValueInvalid")
        for path, value, current in (
            ("metadata.name", body.metadata.name, name),
            ("metadata.namespace", body.metadata.namespace, namespace),
        )
        if value not in (None, current)
    ]
    if identity:
        raise invalid("PodGroup", name, identity, group=TESSERA_GROUP)
    wanted_rv = body.metadata.resource_version
    if wanted_rv and wanted_rv != str(row["resource_version"]):
        raise Conflict(
            f'Operation cannot be fulfilled on podgroups.{TESSERA_GROUP} "{name}": the object has been modified; please apply your changes to the latest version and try again',
            ref=ResourceRef("podgroups", name, TESSERA_GROUP),
        )
    causes = (
        validate_labels(body.metadata.labels or {}, "metadata.labels")
        + validate_annotations(body.metadata.annotations or {}, "metadata.annotations")
        + _topology_causes(body)
    )
    if causes:
        raise invalid("PodGroup", name, causes, group=TESSERA_GROUP)
    changes = {
        "labels": dict(body.metadata.labels or {}),
        "annotations": dict(body.metadata.annotations or {}),
        "min_member": body.spec.min_member,
        "required_topology": body.spec.topology.required,
        "preferred_topology": body.spec.topology.preferred,
    }
    members = _members(session, namespace, [name])
    if all(row[k] == v for k, v in changes.items()):
        return to_api(row, members)
    changes["resource_version"] = next_resource_version(session)
    session.execute(update(groups_t).where(groups_t.c.uid == row["uid"]).values(**changes))
    updated = {**row, **changes}
    obj = to_api(updated, members)
    _log(session, updated, obj, "MODIFIED", before=to_api(row, members))
    return obj


def delete_group(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    row = get_row(session, namespace, name)
    members = _members(session, namespace, [name])
    if members.get("members"):
        raise Conflict(
            f'podgroups.{TESSERA_GROUP} "{name}" still has {members["members"]} pod(s): delete them first '
            f"(kubectl delete pods -l tessera.io/pod-group={name})",
            ref=ResourceRef("podgroups", name, TESSERA_GROUP),
        )
    session.execute(delete(groups_t).where(groups_t.c.uid == row["uid"]))
    gone = {**row, "resource_version": next_resource_version(session)}
    obj = to_api(gone, members)
    _log(session, gone, obj, "DELETED")
    return obj


def to_api(row: Row, members: Mapping[str, int]) -> dict[str, Any]:
    topology = {
        k: v
        for k, v in (
            ("required", row["required_topology"]),
            ("preferred", row["preferred_topology"]),
        )
        if v
    }
    total, scheduled, running = (
        members.get("members", 0),
        members.get("scheduled", 0),
        members.get("running", 0),
    )
    if total < row["min_member"]:
        phase = "Pending"
    elif scheduled < total:
        phase = "Waiting"
    elif running < total:
        phase = "Scheduled"
    else:
        phase = "Running"
    metadata: dict[str, Any] = {
        "name": row["name"],
        "namespace": row["namespace"],
        "uid": row["uid"],
        "resourceVersion": str(row["resource_version"]),
        "creationTimestamp": timestamp(row["created_at"]),
    }
    if row["labels"]:
        metadata["labels"] = row["labels"]
    if row["annotations"]:
        metadata["annotations"] = row["annotations"]
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": {"minMember": row["min_member"], "topology": topology},
        "status": {"phase": phase, "members": total, "scheduled": scheduled, "running": running},
    }


def _topology_causes(body: PodGroupBody) -> list[Cause]:
    order = ["nvlink", "node", "rack", "zone"]
    required, preferred = body.spec.topology.required, body.spec.topology.preferred
    if required and preferred and order.index(preferred) > order.index(required):
        return [
            Cause(
                "spec.topology.preferred",
                f'Invalid value: "{preferred}": wider than the required level "{required}"; a preference must be as tight or tighter',
            )
        ]
    return []


def _members(session: Session, namespace: str, names: list[str]) -> dict[str, int]:
    counts = _member_counts(session, tenant_id=None, namespace=namespace, names=names)
    return counts.get((namespace, names[0]), {}) if names else {}


def _member_counts(
    session: Session,
    *,
    tenant_id: int | None,
    namespace: str | None,
    names: list[str] | None = None,
) -> dict[tuple[str, str], dict[str, int]]:
    """Per (namespace, group): member pods, how many are placed, how many run."""
    query = (
        select(
            pods_t.c.namespace,
            pods_t.c.pod_group,
            func.count().label("members"),
            func.count(pods_t.c.node_name).label("scheduled"),
            func.sum(case((pods_t.c.phase == "Running", 1), else_=0)).label("running"),
        )
        .where(pods_t.c.pod_group.is_not(None))
        .group_by(pods_t.c.namespace, pods_t.c.pod_group)
    )
    if tenant_id is not None:
        query = query.where(pods_t.c.tenant_id == tenant_id)
    if namespace is not None:
        query = query.where(pods_t.c.namespace == namespace)
    if names is not None:
        query = query.where(pods_t.c.pod_group.in_(names))
    return {
        (r.namespace, r.pod_group): {
            "members": int(r.members),
            "scheduled": int(r.scheduled),
            "running": int(r.running or 0),
        }
        for r in session.execute(query)
    }


def _log(
    session: Session,
    row: Row,
    obj: dict[str, Any],
    event_type: str,
    *,
    before: dict[str, Any] | None = None,
) -> None:
    record_change(
        session,
        {
            "resource_version": row["resource_version"],
            "kind": "PodGroup",
            "namespace": row["namespace"],
            "name": row["name"],
            "tenant_id": row["tenant_id"],
            "type": event_type,
            "object": obj,
        },
        before=before,
        selectable=FIELD_SELECTORS,
    )
