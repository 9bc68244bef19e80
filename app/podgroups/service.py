"""Pod groups. A pod joins one with the label `tessera.io/pod-group: NAME` (same namespace);
the scheduler places a group's pending pods as one gang once `minMember` of them exist.

Two API groups declare them: `tessera.io/v1` and scheduler-plugins' coscheduling
`scheduling.x-k8s.io/v1alpha1` (pods labelled `scheduling.x-k8s.io/pod-group: NAME`). They are
separate kinds stored in one table, told apart by `api_group`: each group's endpoints read and
write only their own rows, the scheduler reads both the same way. A pod's gang is named by
name alone (pods.pod_group), so a name is unique per namespace across both groups."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from app.constants import (
    ANNOTATION_TOPOLOGY_PREFERRED,
    ANNOTATION_TOPOLOGY_REQUIRED,
    LABEL_COSCHEDULING_POD_GROUP,
    LABEL_POD_GROUP,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    TESSERA_GROUP,
)
from app.db.engine import insert_unless_exists, next_resource_version, record_change
from app.db.models import Pod, PodGroup, table
from app.errors import AlreadyExists, Cause, Conflict, NotFound, ResourceRef, invalid
from app.kube.meta import (
    ObjectMeta,
    now,
    timestamp,
    validate_annotations,
    validate_labels,
    validate_name,
)
from app.kube.quantity import QuantityError, parse_quantity
from app.namespaces.service import CONTENTS, NamespaceInfo, TableContents
from app.podgroups.schemas import CoschedulingPodGroup
from app.podgroups.schemas import PodGroup as PodGroupBody

groups_t = table(PodGroup)
pods_t = table(Pod)
Row = Mapping[Any, Any]
FIELD_SELECTORS = ("metadata.name", "metadata.namespace")
API_VERSION = f"{TESSERA_GROUP}/v1"
COSCHEDULING_API_VERSION = f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}"
# The change log's kind per group: a watch of one group never sees the other's objects.
CHANGE_KIND = {TESSERA_GROUP: "PodGroup", SCHEDULING_GROUP: f"PodGroup.{SCHEDULING_GROUP}"}
MEMBER_LABEL = {TESSERA_GROUP: LABEL_POD_GROUP, SCHEDULING_GROUP: LABEL_COSCHEDULING_POD_GROUP}
GROUP_OF_LABEL = {label: group for group, label in MEMBER_LABEL.items()}
API_VERSIONS = {TESSERA_GROUP: API_VERSION, SCHEDULING_GROUP: COSCHEDULING_API_VERSION}
LEVELS = ("nvlink", "node", "rack", "zone")  # tightest first


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
    return _insert(session, namespace, body.metadata, _tessera_spec(body), TESSERA_GROUP)


def create_coscheduling(
    session: Session, *, namespace: NamespaceInfo, body: CoschedulingPodGroup
) -> dict[str, Any]:
    """A scheduling.x-k8s.io/v1alpha1 PodGroup: the same gang, its topology in annotations."""
    name = body.metadata.name or ""
    spec, causes = _coscheduling_spec(body)
    causes = validate_name(name, "metadata.name") + causes
    if causes:
        raise invalid("PodGroup", name, causes, group=SCHEDULING_GROUP)
    return _insert(session, namespace, body.metadata, spec, SCHEDULING_GROUP)


def _owners(meta: ObjectMeta) -> list[dict[str, Any]] | None:
    """metadata.ownerReferences as stored (None when there are none)."""
    refs = [r.model_dump(by_alias=True, exclude_none=True) for r in meta.owner_references or []]
    return refs or None


def _tessera_spec(body: PodGroupBody) -> dict[str, Any]:
    return {
        "labels": dict(body.metadata.labels or {}),
        "annotations": dict(body.metadata.annotations or {}),
        "owner_references": _owners(body.metadata),
        "min_member": body.spec.min_member,
        "required_topology": body.spec.topology.required,
        "preferred_topology": body.spec.topology.preferred,
    }


def _coscheduling_spec(body: CoschedulingPodGroup) -> tuple[dict[str, Any], list[Cause]]:
    annotations = dict(body.metadata.annotations or {})
    causes = validate_labels(body.metadata.labels or {}, "metadata.labels")
    causes += validate_annotations(annotations, "metadata.annotations")
    levels: dict[str, str | None] = {}
    for key in (ANNOTATION_TOPOLOGY_REQUIRED, ANNOTATION_TOPOLOGY_PREFERRED):
        value = annotations.get(key)
        if value is not None and value not in LEVELS:
            causes.append(
                Cause(
                    f"metadata.annotations[{key}]",
                    f'Unsupported value: "{value}": supported values: "nvlink", "node", '
                    '"rack", "zone" (the topology level every member must or should share)',
                    "FieldValueNotSupported",
                )
            )
            value = None
        levels[key] = value
    required, preferred = (
        levels[ANNOTATION_TOPOLOGY_REQUIRED],
        levels[ANNOTATION_TOPOLOGY_PREFERRED],
    )
    if required and preferred and LEVELS.index(preferred) > LEVELS.index(required):
        causes.append(
            Cause(
                f"metadata.annotations[{ANNOTATION_TOPOLOGY_PREFERRED}]",
                f'Invalid value: "{preferred}": wider than the required level "{required}"; '
                "a preference must be as tight or tighter",
            )
        )
    resources = body.spec.min_resources
    for key, quantity in (resources or {}).items():
        if not 0 < len(key) <= 253:
            causes.append(
                Cause(
                    "spec.minResources",
                    f'Invalid value: "{key[:40]}": a resource name has 1 to 253 characters',
                )
            )
            continue
        try:
            parse_quantity(quantity)
        except (QuantityError, ValueError) as exc:
            causes.append(
                Cause(
                    f"spec.minResources[{key[:63]}]",
                    f'Invalid value: "{str(quantity)[:40]}": not a quantity ({exc}); '
                    'write it as Kubernetes does, e.g. "4", "500m", "16Gi"',
                )
            )
    spec = {
        "labels": dict(body.metadata.labels or {}),
        "annotations": annotations,
        "owner_references": _owners(body.metadata),
        "min_member": body.spec.min_member,
        "required_topology": required,
        "preferred_topology": preferred,
        "schedule_timeout_seconds": body.spec.schedule_timeout_seconds,
        "min_resources": {k: str(v) for k, v in resources.items()} if resources else None,
    }
    return spec, causes


def _insert(
    session: Session, namespace: NamespaceInfo, meta: ObjectMeta, spec: dict[str, Any], group: str
) -> dict[str, Any]:
    name = meta.name or ""
    values = {
        "uid": str(uuid.uuid4()),
        "namespace": namespace.name,
        "name": name,
        "tenant_id": namespace.tenant_id,
        "resource_version": next_resource_version(session),
        "created_at": now(),
        "api_group": group,
        "schedule_timeout_seconds": None,
        "min_resources": None,
        "scheduling_since": None,
        "failed_reason": None,
        **spec,
    }
    if not insert_unless_exists(session, groups_t, values):
        holder = session.execute(
            select(groups_t.c.api_group).where(
                groups_t.c.namespace == namespace.name, groups_t.c.name == name
            )
        ).scalar()
        if holder is not None and holder != group:
            raise AlreadyExists(
                f'podgroups.{group} "{name}" cannot be created: a PodGroup of {holder} named '
                f'"{name}" exists in namespace "{namespace.name}", and a pod names its gang by '
                "name alone; choose another name, or delete that one first",
                ref=ResourceRef("podgroups", name, group),
            )
        raise AlreadyExists(
            f'podgroups.{group} "{name}" already exists',
            ref=ResourceRef("podgroups", name, group),
        )
    obj = to_api(values, _members(session, namespace.name, [name]))
    _log(session, values, obj, "ADDED")
    return obj


def get_row(session: Session, namespace: str, name: str, group: str = TESSERA_GROUP) -> Row:
    row = (
        session.execute(
            select(groups_t).where(
                groups_t.c.namespace == namespace,
                groups_t.c.name == name,
                groups_t.c.api_group == group,
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(
            f'podgroups.{group} "{name}" not found',
            ref=ResourceRef("podgroups", name, group),
        )
    return row


def group_of(session: Session, namespace: str, name: str) -> str | None:
    """The API group of the PodGroup of this name in the namespace; None when there is none."""
    query = select(groups_t.c.api_group).where(
        groups_t.c.namespace == namespace, groups_t.c.name == name
    )
    return session.execute(query).scalar()


def exists(session: Session, namespace: str, name: str) -> bool:
    return group_of(session, namespace, name) is not None


def get(
    session: Session, *, namespace: str, name: str, group: str = TESSERA_GROUP
) -> dict[str, Any]:
    row = get_row(session, namespace, name, group)
    return to_api(row, _members(session, namespace, [name]))


def list_groups(
    session: Session,
    *,
    tenant_id: int | None,
    namespace: str | None,
    group: str = TESSERA_GROUP,
) -> list[dict[str, Any]]:
    query = (
        select(groups_t)
        .where(groups_t.c.api_group == group)
        .order_by(groups_t.c.namespace, groups_t.c.name)
    )
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
    _check_identity(row, body.metadata, TESSERA_GROUP)
    causes = (
        validate_labels(body.metadata.labels or {}, "metadata.labels")
        + validate_annotations(body.metadata.annotations or {}, "metadata.annotations")
        + _topology_causes(body)
    )
    if causes:
        raise invalid("PodGroup", name, causes, group=TESSERA_GROUP)
    return _update(session, row, _tessera_spec(body))


def update_coscheduling(
    session: Session, *, namespace: str, name: str, body: CoschedulingPodGroup
) -> dict[str, Any]:
    """As `update_group`, for a scheduling.x-k8s.io PodGroup. Any change (spec, labels or
    annotations) also clears a Failed verdict: the gang is tried again, its timeout anew."""
    row = get_row(session, namespace, name, SCHEDULING_GROUP)
    _check_identity(row, body.metadata, SCHEDULING_GROUP)
    spec, causes = _coscheduling_spec(body)
    if causes:
        raise invalid("PodGroup", name, causes, group=SCHEDULING_GROUP)
    return _update(session, row, spec)


def _check_identity(row: Row, meta: ObjectMeta, group: str) -> None:
    name = row["name"]
    identity = [
        Cause(path, f'Invalid value: "{value}": field is immutable', "FieldValueInvalid")
        for path, value, current in (
            ("metadata.name", meta.name, name),
            ("metadata.namespace", meta.namespace, row["namespace"]),
        )
        if value not in (None, current)
    ]
    if identity:
        raise invalid("PodGroup", name, identity, group=group)
    wanted_rv = meta.resource_version
    if wanted_rv and wanted_rv != str(row["resource_version"]):
        raise Conflict(
            f'Operation cannot be fulfilled on podgroups.{group} "{name}": the object has been modified; please apply your changes to the latest version and try again',
            ref=ResourceRef("podgroups", name, group),
        )


def _update(session: Session, row: Row, changes: dict[str, Any]) -> dict[str, Any]:
    members = _members(session, row["namespace"], [row["name"]])
    if all(row[k] == v for k, v in changes.items()):
        return to_api(row, members)
    changes = {
        **changes,
        "scheduling_since": None,
        "failed_reason": None,
        "resource_version": next_resource_version(session),
    }
    session.execute(update(groups_t).where(groups_t.c.uid == row["uid"]).values(**changes))
    updated = {**row, **changes}
    obj = to_api(updated, members)
    _log(session, updated, obj, "MODIFIED", before=to_api(row, members))
    return obj


def _locked_by_uid(session: Session, uid: str) -> Row | None:
    return (
        session.execute(select(groups_t).where(groups_t.c.uid == uid).with_for_update())
        .mappings()
        .first()
    )


def note_unplaced(session: Session, *, uid: str, reason: str) -> str | None:
    """The scheduler tried this group's complete gang and could not place it (`reason`, the
    solver's words). The first try starts the clock of `spec.scheduleTimeoutSeconds`; once it
    has run out the group is marked timed out with the reason, and the message its pods are
    told is returned (None while it may still wait, and for a group marked already: it is
    tried again, with the scheduler's back-off, without telling its pods again)."""
    row = _locked_by_uid(session, uid)
    if row is None or row["failed_reason"] or row["schedule_timeout_seconds"] is None:
        return None
    at = now()
    since = row["scheduling_since"]
    if since is None:
        session.execute(update(groups_t).where(groups_t.c.uid == uid).values(scheduling_since=at))
        return None
    since = since if since.tzinfo else since.replace(tzinfo=at.tzinfo)
    if (at - since).total_seconds() < row["schedule_timeout_seconds"]:
        return None
    failed = (
        f"not placed within scheduleTimeoutSeconds ({row['schedule_timeout_seconds']}s): {reason}"
    )
    changes = {"failed_reason": failed[:4000], "resource_version": next_resource_version(session)}
    session.execute(update(groups_t).where(groups_t.c.uid == uid).values(**changes))
    members = _members(session, row["namespace"], [row["name"]])
    updated = {**row, **changes}
    _log(session, updated, to_api(updated, members), "MODIFIED", before=to_api(row, members))
    return timeout_message(updated)


def timeout_message(row: Row) -> str:
    """What the pods of a timed-out group are told."""
    return (
        f'pod group "{row["name"]}" timed out: {row["failed_reason"]}; it is tried again, '
        "backing off as a pod that does not fit does, and at once when the PodGroup changes"
    )


def note_placed(session: Session, *, uid: str) -> bool:
    """The gang of a timed-out group was placed on a later try: once its members are bound
    the mark goes (its status shows it scheduled). False when nothing changed (no mark, or a
    bind that went stale)."""
    row = _locked_by_uid(session, uid)
    if row is None or not row["failed_reason"]:
        return False
    members = _members(session, row["namespace"], [row["name"]])
    if members.get("scheduled", 0) < row["min_member"]:
        return False
    changes = {
        "failed_reason": None,
        "scheduling_since": None,
        "resource_version": next_resource_version(session),
    }
    session.execute(update(groups_t).where(groups_t.c.uid == uid).values(**changes))
    updated = {**row, **changes}
    _log(session, updated, to_api(updated, members), "MODIFIED", before=to_api(row, members))
    return True


def delete_group(
    session: Session, *, namespace: str, name: str, group: str = TESSERA_GROUP
) -> dict[str, Any]:
    """Delete a group, as Kubernetes and scheduler-plugins do, whether or not pods still name it:
    its running members run on, on their own; pending ones wait (the scheduler says the group
    does not exist) until it is made again or they are deleted."""
    row = get_row(session, namespace, name, group)
    members = _members(session, namespace, [name])
    session.execute(delete(groups_t).where(groups_t.c.uid == row["uid"]))
    gone = {**row, "resource_version": next_resource_version(session)}
    obj = to_api(gone, members)
    _log(session, gone, obj, "DELETED")
    return obj


def to_api(row: Row, members: Mapping[str, int]) -> dict[str, Any]:
    if row["api_group"] == SCHEDULING_GROUP:
        return _coscheduling_api(row, members)
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
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": _metadata(row),
        "spec": {"minMember": row["min_member"], "topology": topology},
        "status": {"phase": phase, "members": total, "scheduled": scheduled, "running": running},
    }


def _metadata(row: Row) -> dict[str, Any]:
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
    if row.get("owner_references"):
        metadata["ownerReferences"] = row["owner_references"]
    return metadata


def _coscheduling_api(row: Row, members: Mapping[str, int]) -> dict[str, Any]:
    """scheduler-plugins' PodGroup: its status phases and counts as its controller keeps them
    (Pending until minMember pods exist, Scheduling, Scheduled, Running, Finished once
    minMember succeeded, Failed when a member failed). A group whose schedule timeout ran out
    is still Scheduling (it is tried again), with the condition Scheduled=False,
    ScheduleTimeout, until it is placed."""
    minimum = row["min_member"]
    total = members.get("members", 0)
    scheduled, running = members.get("scheduled", 0), members.get("running", 0)
    succeeded, failed = members.get("succeeded", 0), members.get("failed", 0)
    if total < minimum:
        phase = "Pending"
    elif succeeded >= minimum:
        phase = "Finished"
    elif failed and failed + running + succeeded >= minimum:
        phase = "Failed"
    elif running + succeeded >= minimum:
        phase = "Running"
    elif scheduled >= minimum:
        phase = "Scheduled"
    else:
        phase = "Scheduling"
    spec: dict[str, Any] = {"minMember": minimum}
    if row["schedule_timeout_seconds"] is not None:
        spec["scheduleTimeoutSeconds"] = row["schedule_timeout_seconds"]
    if row["min_resources"]:
        spec["minResources"] = row["min_resources"]
    status: dict[str, Any] = {
        "phase": phase,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
    }
    if row["scheduling_since"] is not None:
        status["scheduleStartTime"] = timestamp(row["scheduling_since"])
    if row["failed_reason"]:
        status["conditions"] = [
            {
                "type": "Scheduled",
                "status": "False",
                "reason": "ScheduleTimeout",
                "message": row["failed_reason"],
            }
        ]
    return {
        "apiVersion": COSCHEDULING_API_VERSION,
        "kind": "PodGroup",
        "metadata": _metadata(row),
        "spec": spec,
        "status": status,
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
            func.sum(case((pods_t.c.phase == "Succeeded", 1), else_=0)).label("succeeded"),
            func.sum(case((pods_t.c.phase == "Failed", 1), else_=0)).label("failed"),
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
            "succeeded": int(r.succeeded or 0),
            "failed": int(r.failed or 0),
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
            "kind": CHANGE_KIND[row["api_group"]],
            "namespace": row["namespace"],
            "name": row["name"],
            "tenant_id": row["tenant_id"],
            "type": event_type,
            "object": obj,
        },
        before=before,
        selectable=FIELD_SELECTORS,
    )


# A namespace's deletion deletes its groups (of either API group) through `delete_group`, so
# watchers see each go.
CONTENTS.append(
    TableContents(
        groups_t,
        lambda s, row: delete_group(
            s, namespace=row["namespace"], name=row["name"], group=row["api_group"]
        ),
    )
)
