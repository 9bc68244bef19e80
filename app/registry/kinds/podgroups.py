"""PodGroups: gangs, in two API groups. tessera.io/v1 PodGroup (`kubectl get pg`) and
scheduler-plugins' coscheduling scheduling.x-k8s.io/v1alpha1 PodGroup (its topology in the
annotations tessera.io/topology-required and -preferred), so manifests written for that
scheduler apply unchanged. A pod joins one with the label `tessera.io/pod-group: NAME`
(`scheduling.x-k8s.io/pod-group: NAME` for the other group), in the same namespace; the
scheduler places a group's pending pods as one gang once `minMember` of them exist.

The objects are the registry's, two kinds with every verb the store gives. Beside each object,
under its uid, is its row of `pod_groups`: what the scheduler reads of it (minMember, the
topology levels, the schedule timeout, by namespace and name) and what the scheduler writes
(when the complete gang was first tried, why it timed out: app/podgroups/service.py). That row
is written as the object is created and rewritten with every change of it (any change clears a
timeout: the gang is tried again, its clock anew), and goes with it (ON DELETE CASCADE). A pod
names its gang by name alone, so the row's unique (namespace, name) keeps a name unique in a
namespace across both groups.

The status is computed as the object is read, from the member pods and that row, and is in what
the change log keeps (`logs_status`), so watchers see it as a get does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from app.constants import (
    ANNOTATION_TOPOLOGY_PREFERRED,
    ANNOTATION_TOPOLOGY_REQUIRED,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    TESSERA_GROUP,
    TESSERA_VERSION,
)
from app.db.engine import insert_unless_exists
from app.db.models import Pod, table
from app.db.models import PodGroup as PodGroupRow
from app.errors import AlreadyExists, Cause, ResourceRef
from app.kube.meta import timestamp
from app.kube.quantity import QuantityError, parse_quantity
from app.kube.tables import (
    COSCHEDULING_COLUMNS,
    PODGROUP_COLUMNS,
    Column,
    coscheduling_row,
    podgroup_row,
)
from app.podgroups.schemas import (
    CoschedulingPodGroup,
    CoschedulingPodGroupList,
    PodGroup,
    PodGroupList,
)
from app.registry.strategy import Obj, Strategy

groups_t = table(PodGroupRow)
pods_t = table(Pod)
LEVELS = ("nvlink", "node", "rack", "zone")  # tightest first
Row = Mapping[Any, Any]


class _PodGroupKind(Strategy):
    """What both groups' PodGroups share: the `pod_groups` row beside the object, and a status
    computed from the member pods."""

    resource = "podgroups"
    singular = "podgroup"
    kind = "PodGroup"
    logs_status = True

    def levels(self, obj: Obj) -> tuple[str | None, str | None]:
        """The required and preferred topology levels (valid ones only)."""
        raise NotImplementedError

    def index(self, obj: Obj) -> dict[str, Any]:
        """The object's `pod_groups` row: what the scheduler reads of it."""
        required, preferred = self.levels(obj)
        spec = obj.get("spec") or {}
        return {
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "api_group": self.group,
            "min_member": spec.get("minMember", 1),
            "required_topology": required,
            "preferred_topology": preferred,
            "schedule_timeout_seconds": spec.get("scheduleTimeoutSeconds"),
        }

    def prepare_create(self, obj: Obj) -> None:
        obj.pop("status", None)  # computed as it is read

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        obj.pop("status", None)

    def created(self, session: Session, obj: Obj) -> Obj:
        """Its `pod_groups` row; 409 when the other group holds the name in this namespace."""
        meta = obj["metadata"]
        values = {"uid": meta["uid"], **self.index(obj)}
        if not insert_unless_exists(session, groups_t, values):
            holder = session.scalar(
                select(groups_t.c.api_group).where(
                    groups_t.c.namespace == meta["namespace"], groups_t.c.name == meta["name"]
                )
            )
            raise AlreadyExists(
                f'{self.qualified} "{meta["name"]}" cannot be created: a PodGroup of {holder} '
                f'named "{meta["name"]}" exists in namespace "{meta["namespace"]}", and a pod '
                "names its gang by name alone; choose another name, or delete that one first",
                ref=ResourceRef(self.resource, meta["name"], self.group),
            )
        return obj

    def updated(self, session: Session, obj: Obj, old: Obj) -> None:
        """The scheduler reads the change; a timeout's mark and clock go (tried anew)."""
        session.execute(
            update(groups_t)
            .where(groups_t.c.uid == obj["metadata"]["uid"])
            .values(**self.index(obj), scheduling_since=None, failed_reason=None)
        )

    def deleted(self, session: Session, obj: Obj) -> None:
        """Its row goes with it (the foreign key's ON DELETE CASCADE says the same)."""
        session.execute(delete(groups_t).where(groups_t.c.uid == obj["metadata"]["uid"]))

    def present(self, session: Session, obj: Obj) -> None:
        self.present_all(session, [obj])

    def present_all(self, session: Session, objs: list[Obj]) -> None:
        """Every group's status from two queries for the whole page: its members' counts and
        its scheduling row."""
        if not objs:
            return
        metas = [obj["metadata"] for obj in objs]
        namespaces = {meta["namespace"] for meta in metas}
        counts = member_counts(
            session,
            namespace=next(iter(namespaces)) if len(namespaces) == 1 else None,
            names=sorted({meta["name"] for meta in metas}),
        )
        rows = {
            row["uid"]: row
            for row in session.execute(
                select(groups_t).where(groups_t.c.uid.in_([meta["uid"] for meta in metas]))
            ).mappings()
        }
        for obj, meta in zip(objs, metas, strict=True):
            members = counts.get((meta["namespace"], meta["name"]), {})
            obj["status"] = self.status(obj, members, rows.get(meta["uid"]))

    def status(self, obj: Obj, members: Mapping[str, int], row: Row | None) -> Obj:
        raise NotImplementedError


class PodGroupStrategy(_PodGroupKind):
    """tessera.io/v1 PodGroup: its topology in spec.topology."""

    group = TESSERA_GROUP
    version = TESSERA_VERSION
    model = PodGroup
    list_model = PodGroupList
    short_names = ("pg",)
    categories = ("tessera",)
    summary = "a gang"
    columns: ClassVar[list[Column]] = PODGROUP_COLUMNS

    def row(self, obj: Obj) -> list[Any]:
        return podgroup_row(obj)

    def levels(self, obj: Obj) -> tuple[str | None, str | None]:
        topology = (obj.get("spec") or {}).get("topology") or {}
        return topology.get("required"), topology.get("preferred")

    def prepare_create(self, obj: Obj) -> None:
        super().prepare_create(obj)
        obj.setdefault("spec", {}).setdefault("topology", {})

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        super().prepare_update(obj, old)
        obj.setdefault("spec", {}).setdefault("topology", {})

    def validate(self, obj: Obj) -> list[Cause]:
        required, preferred = self.levels(obj)
        if required and preferred and LEVELS.index(preferred) > LEVELS.index(required):
            return [
                Cause(
                    "spec.topology.preferred",
                    f'Invalid value: "{preferred}": wider than the required level "{required}"; '
                    "a preference must be as tight or tighter",
                )
            ]
        return []

    def status(self, obj: Obj, members: Mapping[str, int], row: Row | None) -> Obj:
        """Pending below minMember pods, Waiting while some are not placed, Scheduled, then
        Running once all run."""
        minimum = (obj.get("spec") or {}).get("minMember", 1)
        total, scheduled, running = (
            members.get("members", 0),
            members.get("scheduled", 0),
            members.get("running", 0),
        )
        if total < minimum:
            phase = "Pending"
        elif scheduled < total:
            phase = "Waiting"
        elif running < total:
            phase = "Scheduled"
        else:
            phase = "Running"
        return {"phase": phase, "members": total, "scheduled": scheduled, "running": running}


class CoschedulingPodGroupStrategy(_PodGroupKind):
    """scheduler-plugins' scheduling.x-k8s.io/v1alpha1 PodGroup: the same gangs, its topology
    in annotations, with a schedule timeout and minResources (accepted as written, checked to
    be quantities; members are placed by their own requests)."""

    group = SCHEDULING_GROUP
    version = SCHEDULING_VERSION
    model = CoschedulingPodGroup
    list_model = CoschedulingPodGroupList
    summary = "a gang, in scheduler-plugins' form"
    columns: ClassVar[list[Column]] = COSCHEDULING_COLUMNS

    @property
    def log_kind(self) -> str:
        """A second group's kind of the same name: a watch of one group never sees the
        other's objects."""
        return f"{self.kind}.{self.group}"

    def row(self, obj: Obj) -> list[Any]:
        return coscheduling_row(obj)

    def levels(self, obj: Obj) -> tuple[str | None, str | None]:
        annotations = obj["metadata"].get("annotations") or {}
        required = annotations.get(ANNOTATION_TOPOLOGY_REQUIRED)
        preferred = annotations.get(ANNOTATION_TOPOLOGY_PREFERRED)
        return (
            required if required in LEVELS else None,
            preferred if preferred in LEVELS else None,
        )

    def _minimum_resources_as_written(self, obj: Obj) -> None:
        resources = (obj.get("spec") or {}).get("minResources")
        if resources:
            obj["spec"]["minResources"] = {k: str(v) for k, v in resources.items()}

    def prepare_create(self, obj: Obj) -> None:
        super().prepare_create(obj)
        self._minimum_resources_as_written(obj)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        super().prepare_update(obj, old)
        self._minimum_resources_as_written(obj)

    def validate(self, obj: Obj) -> list[Cause]:
        annotations = obj["metadata"].get("annotations") or {}
        causes: list[Cause] = []
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
        required, preferred = self.levels(obj)
        if required and preferred and LEVELS.index(preferred) > LEVELS.index(required):
            causes.append(
                Cause(
                    f"metadata.annotations[{ANNOTATION_TOPOLOGY_PREFERRED}]",
                    f'Invalid value: "{preferred}": wider than the required level "{required}"; '
                    "a preference must be as tight or tighter",
                )
            )
        for key, quantity in ((obj.get("spec") or {}).get("minResources") or {}).items():
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
        return causes

    def status(self, obj: Obj, members: Mapping[str, int], row: Row | None) -> Obj:
        """Its status phases and counts as scheduler-plugins' controller keeps them (Pending
        until minMember pods exist, Scheduling, Scheduled, Running, Finished once minMember
        succeeded, Failed when a member failed). A group whose schedule timeout ran out is
        still Scheduling (it is tried again), with the condition Scheduled=False,
        ScheduleTimeout, until it is placed."""
        minimum = (obj.get("spec") or {}).get("minMember", 1)
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
        status: Obj = {
            "phase": phase,
            "scheduled": scheduled,
            "running": running,
            "succeeded": succeeded,
            "failed": failed,
        }
        if row is not None and row["scheduling_since"] is not None:
            status["scheduleStartTime"] = timestamp(row["scheduling_since"])
        if row is not None and row["failed_reason"]:
            status["conditions"] = [
                {
                    "type": "Scheduled",
                    "status": "False",
                    "reason": "ScheduleTimeout",
                    "message": row["failed_reason"],
                }
            ]
        return status


def member_counts(
    session: Session,
    *,
    namespace: str | None,
    names: list[str] | None = None,
) -> dict[tuple[str, str], dict[str, int]]:
    """Per (namespace, group name): member pods, how many are placed, run, succeeded, failed."""
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
