"""Pod lifecycle: create, read, list, patch/replace, delete, bind, start, finalize.

Every write bumps the pod's resourceVersion, appends to the change log (for watches) and, where
something happened a person would want to know, records an Event.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app import workloads
from app.budgets import service as budgets
from app.callbacks import service as callbacks
from app.constants import (
    ANNOTATION_COMPUTE_CLASS,
    ANNOTATION_GPU_ALLOCATION,
    ANNOTATION_POD_USE_SPEC,
    ANNOTATION_REQUEUE_ON_PREEMPTION,
    ANNOTATION_RESCHEDULE_ON_FAULT,
    CPU,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    IMMUTABLE_POD_LABELS,
    LABEL_COMPUTE_CLASS,
    LABEL_COMPUTE_QOS,
    MEMORY,
)
from app.db.engine import (
    current_resource_version,
    defer_update,
    next_resource_version,
    record_change,
)
from app.errors import (
    AlreadyExists,
    Cause,
    Conflict,
    Forbidden,
    NotFound,
    ResourceRef,
    TesseraError,
    invalid,
)
from app.events import service as events
from app.inventory import service as inventory
from app.kube.bodies import apply_patch, section
from app.kube.lists import ContinueToken
from app.kube.meta import new_uid, now, parse_timestamp, timestamp
from app.kube.quantity import QuantityError, format_cpu, format_mib, parse_quantity
from app.kube.selectors import FieldRequirement, LabelSelector
from app.namespaces import service as namespaces
from app.namespaces.service import NamespaceInfo
from app.podgroups import service as podgroups
from app.pods import repository
from app.pods.admission import (
    AdmissionError,
    Admitted,
    ResizedDemand,
    admit,
    describe_rounding,
    resized_demand,
    stored_spec,
    with_default_tolerations,
)
from app.pods.schemas import Pod, ReportedPodStatus, ResourceRequirements
from app.pods.validation import AdmissionContext, pydantic_causes
from app.quotas import service as quotas
from billing import ledger
from billing.specs import ComputeSpec
from billing.usage import Reason, Transition, finished_at

Row = Mapping[Any, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
FIELD_SELECTORS = tuple(repository.FIELD_COLUMNS)
# Annotations Tessera writes (and why): a client may omit them or send them back unchanged.
SERVER_ANNOTATIONS = {
    ANNOTATION_COMPUTE_CLASS: "to the class the pod was admitted in",
    ANNOTATION_POD_USE_SPEC: "to the spec the pod was sold",
    ANNOTATION_GPU_ALLOCATION: "to the GPU fragments the scheduler bound the pod to",
}


@dataclass(frozen=True)
class PodPage:
    items: list[dict[str, Any]]
    resource_version: int
    continue_token: str | None


# --- create -------------------------------------------------------------------------------


@dataclass
class NewPod:
    """A create worked out before its write transaction (`prepare`): the pod's row, its API
    object and its first event. `insert` gives them their resourceVersions and queues them in
    the transaction. `generated`: the name was made from the pod's generateName."""

    namespace: NamespaceInfo
    pod: Pod
    admitted: Admitted
    values: dict[str, Any]
    obj: dict[str, Any]
    event: events.Prepared
    generated: bool = False
    owner: workloads.Ref | None = None  # the controller whose workload `insert` reads


class GeneratedNameTaken(AlreadyExists):
    """The name made from a generateName was taken: prepare the pod again (a new name)."""


GENERATE_NAME_ATTEMPTS = 8  # names tried for one generateName, as Kubernetes' apiserver


def generate_name_exhausted(prefix: str) -> Conflict:
    return Conflict(
        f'could not find a free name for generateName "{prefix}" in '
        f"{GENERATE_NAME_ATTEMPTS} tries: try again"
    )


def create(
    session: Session,
    *,
    namespace: NamespaceInfo,
    pod: Pod,
    admitted: Admitted,
) -> dict[str, Any]:
    """Create a pod in this transaction (a caller of its own, not the API's batched writes):
    a generated name is first looked up, so that it does not fail at the commit."""
    owner = workloads.controller_of(owner_references(pod))
    new = prepare(namespace=namespace, pod=pod, admitted=admitted, owner=owner)
    for _ in range(GENERATE_NAME_ATTEMPTS):
        if not new.generated or not repository.name_taken(
            session, namespace.name, new.values["name"]
        ):
            return insert(session, new=new)
        new = prepare(namespace=namespace, pod=pod, admitted=admitted, owner=owner)
    raise generate_name_exhausted(pod.metadata.generate_name or "")


def prepare(
    *,
    namespace: NamespaceInfo,
    pod: Pod,
    admitted: Admitted,
    name: str | None = None,
    workload: str | None = None,
    owner: workloads.Ref | None = None,
) -> NewPod:
    """Everything about a new pod that needs no database: its row, API object and event (the
    API's create does this before it waits for the writer, so the write itself is short).
    Its workload (`app.workloads.top`) is `workload`, known before, or, given its controller
    `owner`, read by `insert`.

    A pod with a generateName gets a name made from it here, without a look at the store: a
    name already taken fails the insert with GeneratedNameTaken (rare: 27**5 suffixes), and
    the caller prepares it again (`GENERATE_NAME_ATTEMPTS`)."""
    meta = pod.metadata
    if namespace.terminating:
        raise Forbidden(
            f'pods "{meta.name or meta.generate_name}" is forbidden: unable to create new content '
            f"in namespace {namespace.name} because it is being terminated",
            ref=ResourceRef("pods", meta.name or ""),
        )
    generated = not (name or meta.name)
    name = name or meta.name or _generated_name(meta.generate_name or "")
    at = now()
    demand = admitted.demand
    values: dict[str, Any] = {
        "uid": new_uid(),
        "namespace": namespace.name,
        "name": name,
        "tenant_id": namespace.tenant_id,
        "resource_version": 0,  # given by `insert`
        "generation": 1,
        "created_at": at,
        "deletion_timestamp": None,
        "deletion_grace_seconds": None,
        "labels": admitted.labels,
        "annotations": admitted.annotations,
        "meta_extra": _meta_extra(pod),
        "spec": admitted.spec,
        "spec_name": demand.spec.name,
        "cpu_milli": demand.spec.cpu_milli,
        "memory_mib": demand.spec.memory_mib,
        "gpu_count": demand.gpu_count,
        "gpu_memory_mib": demand.gpu_memory_mib,
        "gpu_core_pct": demand.gpu_core_pct,
        "gpu_model": demand.gpu_model,
        "compute_class": demand.compute_class,
        "qos": demand.qos,
        "priority": demand.priority,
        "pod_group": demand.pod_group,
        "phase": "Pending",
        "node_name": None,
        "conditions": [
            _condition(
                "PodScheduled", "False", "Queued", "waiting for the scheduler to place it", at
            )
        ],
        "status_reason": None,
        "status_message": None,
        "start_time": None,
        "bound_at": None,
        "nominated_node_name": None,
        "disruption_deadline": None,
        "resize_cpu_milli": None,
        "resize_memory_mib": None,
        "allocated_resources": None,
        "resizes": 0,
        "workload": workload,
    }
    event = events.Note(
        involved=_involved(values),
        reason="SpecRounded" if demand.rounded else "Created",
        message=admitted.notes[0]
        if demand.rounded
        else f"accepted with the sold spec {demand.spec.name}",
        tenant_id=namespace.tenant_id,
        at=at,
    )
    return NewPod(
        namespace, pod, admitted, values, to_api(values), events.prepare(event), generated, owner
    )


def insert(session: Session, *, new: NewPod) -> dict[str, Any]:
    """Write a prepared pod in this transaction; returns its API object. Raises only before it
    has queued anything (a create is a `clean` write): its row goes in with the other creates of
    the transaction, in one statement before it commits, and a name taken meanwhile fails this
    create alone (AlreadyExists)."""
    namespace, values = new.namespace, new.values
    name = values["name"]
    demand = new.admitted.demand
    if demand.pod_group:
        wanted = podgroups.GROUP_OF_LABEL[demand.pod_group_label]
        found = podgroups.group_of(session, namespace.name, demand.pod_group)
        if found != wanted:
            version = podgroups.API_VERSIONS[wanted]
            other = (
                f" (there is one of {podgroups.API_VERSIONS[found]}: label the pod {podgroups.MEMBER_LABEL[found]} to join it)"
                if found
                else ""
            )
            raise invalid(
                "Pod",
                name,
                [
                    Cause(
                        f"metadata.labels.{demand.pod_group_label}",
                        f'Invalid value: "{demand.pod_group}": no PodGroup of {version} of that '
                        f'name in namespace "{namespace.name}"{other}; create it first '
                        f"(kind: PodGroup, apiVersion: {version})",
                    )
                ],
            )
    quotas.check(
        session,
        namespace=namespace.name,
        pod=name,
        adds=quotas.of_pod(values),
        tenant_id=namespace.tenant_id,
    )
    budgets.check_pod(
        session, tenant_id=namespace.tenant_id, pod=name, today=values["created_at"].date()
    )
    if new.owner is not None:
        values["workload"] = _workload(session, namespace.name, new.owner)
    rv = next_resource_version(session)
    values["resource_version"] = rv
    obj = new.obj
    obj["metadata"]["resourceVersion"] = str(rv)
    taken = GeneratedNameTaken if new.generated else AlreadyExists
    repository.add_pod(
        session,
        values,
        conflict=lambda: taken(f'pods "{name}" already exists', ref=ResourceRef("pods", name)),
    )
    _log(session, values, obj, "ADDED")
    events.add(session, new.event)
    return obj


def _workload(session: Session, namespace: str, owner: workloads.Ref) -> str | None:
    """The workload of a pod `owner` controls, read once per transaction for its pods."""
    read: dict[tuple[str, ...], str | None] = session.info.setdefault("workloads", {})
    key = (namespace, *workloads.key(owner))
    if key not in read:
        read[key] = workloads.top(session, namespace, [owner])
    return read[key]


def _generated_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))


# --- read ---------------------------------------------------------------------------------


def get(session: Session, *, namespace: str, name: str) -> dict[str, Any]:
    row = repository.get(session, namespace, name)
    if row is None:
        raise NotFound(f'pods "{name}" not found', ref=ResourceRef("pods", name))
    return to_api(row)


def list_pods(
    session: Session,
    *,
    tenant_id: int | None,
    namespace: str | None,
    labels: LabelSelector,
    fields: list[FieldRequirement],
    limit: int | None,
    continue_token: str | None,
) -> PodPage:
    """A page of pods; `tenant_id=None` lists every tenant's (the admin's view).

    The resourceVersion is read before the rows, so a watch started from it cannot miss a change
    (at worst it repeats one the list already showed).
    """
    after = None
    list_rv = current_resource_version(session)
    if continue_token:
        token = ContinueToken.decode(continue_token)
        after = (token.namespace, token.name)
        list_rv = token.resource_version
    field_args = [(f.field, f.value, f.negate) for f in fields]
    want = limit or 0
    items: list[dict[str, Any]] = []
    last: tuple[str, str] | None = None
    batch = max(want + 1, 500) if want else 2000
    more = False
    while True:
        rows = repository.page(
            session,
            tenant_id=tenant_id,
            namespace=namespace,
            fields=field_args,
            after=after,
            size=batch,
        )
        for row in rows:
            if want and len(items) == want:
                more = True
                break
            if labels.empty or labels.matches(row["labels"]):
                items.append(to_api(row))
                last = (row["namespace"], row["name"])
        if more or len(rows) < batch:
            break
        after = (rows[-1]["namespace"], rows[-1]["name"])
    next_token = None
    if more and last is not None:
        next_token = ContinueToken(last[0], last[1], list_rv).encode()
    return PodPage(items, list_rv, next_token)


# --- update -------------------------------------------------------------------------------


def patch(
    session: Session,
    *,
    namespace: str,
    name: str,
    body: Any,
    patch_type: str,
    context: AdmissionContext,
) -> dict[str, Any]:
    row = _locked(session, namespace, name)
    current = to_api(row)
    desired = apply_patch(current, body, patch_type)
    return _update(session, row, current, desired, context)


def server_side_apply(
    session: Session,
    *,
    namespace: NamespaceInfo,
    name: str,
    pod: Pod,
    manager: str,
    context: AdmissionContext,
) -> tuple[dict[str, Any], bool]:
    """`kubectl apply --server-side`: create the pod, or make its labels and annotations those
    this field manager applies (removing the ones it applied before and no longer does).

    Returns the object and whether it was created. Ownership is recorded in
    `metadata.managedFields`; fields owned by other managers are left alone.
    """
    applied_labels = dict(pod.metadata.labels or {})
    applied_annotations = dict(pod.metadata.annotations or {})
    entry = _managed_entry(manager, applied_labels, applied_annotations)
    row = repository.get(session, namespace.name, name, for_update=True)
    if row is None:
        pod = pod.model_copy(
            update={"metadata": pod.metadata.model_copy(update={"managed_fields": [entry]})}
        )
        try:
            admitted = admit(
                pod, specs=context.specs, pool=context.pool, default_spec=context.default_spec
            )
        except AdmissionError as exc:
            raise invalid("Pod", name, exc.causes) from exc
        return create(session, namespace=namespace, pod=pod, admitted=admitted), True
    current = to_api(row)
    managed = [m for m in row["meta_extra"].get("managedFields", []) if m.get("manager") != manager]
    before_labels, before_annotations = _owned(row["meta_extra"].get("managedFields", []), manager)
    labels = {
        k: v
        for k, v in (current["metadata"].get("labels") or {}).items()
        if k not in before_labels - applied_labels.keys()
    }
    annotations = {
        k: v
        for k, v in (current["metadata"].get("annotations") or {}).items()
        if k not in before_annotations - applied_annotations.keys()
    }
    labels.update(applied_labels)
    annotations.update(applied_annotations)
    previous = next(
        (m for m in row["meta_extra"].get("managedFields", []) if m.get("manager") == manager),
        None,
    )
    if previous is not None and previous.get("fieldsV1") == entry["fieldsV1"]:
        entry = previous  # the same fields applied again: not a change
    # Fields the manifest leaves out are the stored ones (see `_update`).
    spec = pod.spec.model_dump(by_alias=True, exclude_none=True)
    desired = {
        **current,
        "metadata": {
            **current["metadata"],
            "labels": labels,
            "annotations": annotations,
            "managedFields": (
                [entry if m is previous else m for m in row["meta_extra"]["managedFields"]]
                if previous is not None
                else [*managed, entry]
            ),
        },
        "spec": spec,
    }
    return _update(session, row, current, desired, context), False


def _managed_entry(
    manager: str, labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if labels:
        fields["f:labels"] = {f"f:{k}": {} for k in labels}
    if annotations:
        fields["f:annotations"] = {f"f:{k}": {} for k in annotations}
    return {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": "v1",
        "time": timestamp(now()),
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": fields, "f:spec": {}},
    }


def _owned(managed: list[dict[str, Any]], manager: str) -> tuple[set[str], set[str]]:
    for entry in managed:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            meta = entry.get("fieldsV1", {}).get("f:metadata", {})
            return (
                {k[2:] for k in meta.get("f:labels", {})},
                {k[2:] for k in meta.get("f:annotations", {})},
            )
    return set(), set()


def replace(
    session: Session, *, namespace: str, name: str, body: dict[str, Any], context: AdmissionContext
) -> dict[str, Any]:
    row = _locked(session, namespace, name)
    current = to_api(row)
    body_meta = section(body, "metadata")
    if body_meta.get("name") not in (None, name):
        raise invalid(
            "Pod",
            name,
            [
                Cause(
                    "metadata.name",
                    f'Invalid value: "{body_meta.get("name")}": the name in the body must match the URL ("{name}")',
                )
            ],
        )
    if not body_meta.get("resourceVersion"):
        body = {
            **body,
            "metadata": {**body_meta, "resourceVersion": current["metadata"]["resourceVersion"]},
        }
    return _update(session, row, current, body, context)


def _update(
    session: Session,
    row: Row,
    current: dict[str, Any],
    desired: dict[str, Any],
    context: AdmissionContext,
) -> dict[str, Any]:
    """Write what an update changes, compared field by field with the stored pod.

    Fields the server owns or defaulted (nodeName, priority, schedulerName, ...) that the client
    omits are taken from the stored pod, so sending back an object read earlier, or the original
    manifest, changes nothing it did not mean to change. A real change to a field a pod cannot
    change is refused naming that field alone.
    """
    name = row["name"]
    meta = section(desired, "metadata")
    wanted_rv = meta.get("resourceVersion")
    if wanted_rv not in (None, "") and str(wanted_rv) != str(row["resource_version"]):
        raise _stale(name)
    desired = _with_stored_defaults(current, desired)
    try:
        pod = Pod.model_validate(desired)
    except ValidationError as exc:
        raise invalid("Pod", name, pydantic_causes(exc)) from exc
    causes = _immutable_changes(current, desired, pod)
    if row["deletion_timestamp"] is not None:
        added = set(pod.metadata.finalizers or []) - set(row["meta_extra"].get("finalizers", []))
        if added:
            causes.append(
                Cause(
                    "metadata.finalizers",
                    f"Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}",
                    "FieldValueForbidden",
                )
            )
    if causes:
        raise invalid("Pod", name, causes)
    # nodeName was compared with the stored one above; admission checks what the user may set.
    spec_update: dict[str, Any] = {"node_name": None}
    held = row["allocated_resources"]
    if held:  # a resize is pending: the pod is admitted as what it holds (it may never fit)
        spec_update["containers"] = [
            c.model_copy(update={"resources": ResourceRequirements.model_validate(held[c.name])})
            if c.name in held
            else c
            for c in pod.spec.containers
        ]
    unbound = pod.model_copy(update={"spec": pod.spec.model_copy(update=spec_update)})
    try:
        admitted = admit(
            unbound,
            specs=context.specs,
            pool=context.pool,
            default_spec=context.default_spec,
            name_required=False,
        )
    except AdmissionError as exc:
        raise invalid("Pod", name, exc.causes) from exc
    labels = admitted.labels
    annotations = admitted.annotations
    annotations[ANNOTATION_POD_USE_SPEC] = row["spec_name"]  # what it holds, resized or not
    if ANNOTATION_GPU_ALLOCATION in row["annotations"]:
        annotations[ANNOTATION_GPU_ALLOCATION] = row["annotations"][ANNOTATION_GPU_ALLOCATION]
    meta_extra = _meta_extra(pod)
    changes: dict[str, Any] = {}
    if labels != row["labels"]:
        changes["labels"] = labels
    if annotations != row["annotations"]:
        changes["annotations"] = annotations
    if meta_extra != row["meta_extra"]:
        changes["meta_extra"] = meta_extra
        refs = meta_extra.get("ownerReferences")
        if refs != row["meta_extra"].get("ownerReferences"):  # adopted, orphaned or released
            changes["workload"] = workloads.top(session, row["namespace"], refs)
    spec = _with_mutable_fields(row["spec"], stored_spec(pod))
    if spec != row["spec"]:
        changes["spec"] = spec
        changes["generation"] = row["generation"] + 1
    if not changes:
        return current
    updated, obj = _modify(session, row, changes, check_version=True)
    deleted_at = updated["deletion_timestamp"]
    if (
        deleted_at is not None
        and not meta_extra.get("finalizers")
        and (updated["node_name"] is None or deleted_at <= now())
    ):
        # The last finalizer of a deleted pod is gone and nothing runs (or its grace is over).
        return _remove(session, updated, now())
    return obj


# Spec fields the server fills in when a pod is created: a client that omits them on an update
# means "as they are", not "remove them".
SERVER_FILLED_SPEC = (
    "nodeName",
    "priority",
    "schedulerName",
    "dnsPolicy",
    "restartPolicy",
    "terminationGracePeriodSeconds",
    "enableServiceLinks",
    "tolerations",
)
# Metadata the server keeps when an update omits it (as Kubernetes keeps managedFields).
SERVER_KEPT_METADATA = ("managedFields", "generateName")


def _with_stored_defaults(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    spec = dict(section(desired, "spec"))
    for key in SERVER_FILLED_SPEC:
        if spec.get(key) is None and key in current["spec"]:
            spec[key] = current["spec"][key]
    tolerations = spec.get("tolerations")
    if isinstance(tolerations, list) and all(isinstance(t, dict) for t in tolerations):
        # the manifest as written, without the tolerations the server added, is no change
        spec["tolerations"] = with_default_tolerations(spec["tolerations"])
    meta = dict(section(desired, "metadata"))
    for key in SERVER_KEPT_METADATA:
        if not meta.get(key) and key in current["metadata"]:
            meta[key] = current["metadata"][key]
    return {**desired, "metadata": meta, "spec": spec}


_QUANTITY_MAPS = ("limits", "requests", "overhead")
_MAX_CAUSES = 10
_CONTAINER_LISTS = ("initContainers", "containers")


def _with_mutable_fields(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` (a stored spec) with what Kubernetes lets an update change taken from `new`:
    `activeDeadlineSeconds`, the containers' images and the tolerations. (`_immutable_changes`
    refuses everything else, and the changes of these that Kubernetes refuses.)"""
    spec = dict(old)
    for key in ("activeDeadlineSeconds", "tolerations"):
        if new.get(key) is None:
            spec.pop(key, None)
        else:
            spec[key] = new[key]
    for key in _CONTAINER_LISTS:
        if key not in old or len(old[key]) != len(new.get(key, [])):
            continue
        images = {c.get("name"): c.get("image") for c in new[key]}
        spec[key] = [
            {**c, "image": images[c.get("name")]} if images.get(c.get("name")) else c
            for c in old[key]
        ]
    return spec


def _mutable_refusals(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Kubernetes' rules for the spec fields an update may change: `activeDeadlineSeconds` may
    be set or lowered, not raised or removed; tolerations may be added, not removed or changed;
    an image may change, not be emptied."""
    causes = []
    before, after = old.get("activeDeadlineSeconds"), new.get("activeDeadlineSeconds")
    if before is not None and (after is None or after > before):
        causes.append(
            Cause(
                "spec.activeDeadlineSeconds",
                f"Invalid value: {after}: must be less than or equal to the previous value "
                f"({before}): a deadline can be set or lowered, not raised or removed",
                "FieldValueInvalid",
            )
        )
    kept = new.get("tolerations") or []
    for i, toleration in enumerate(old.get("tolerations") or []):
        if toleration not in kept:
            causes.append(
                Cause(
                    f"spec.tolerations[{i}]",
                    "Forbidden: existing tolerations can not be modified or removed; new ones "
                    "may be added",
                    "FieldValueForbidden",
                )
            )
            break
    for key in _CONTAINER_LISTS:
        for i, container in enumerate(new.get(key, [])):
            if not str(container.get("image") or "").strip():
                causes.append(
                    Cause(f"spec.{key}[{i}].image", "Required value", "FieldValueRequired")
                )
    return causes


def _immutable_changes(current: dict[str, Any], desired: dict[str, Any], pod: Pod) -> list[Cause]:
    new_spec = _canonical(stored_spec(pod))
    old_spec = _canonical(dict(current["spec"]))
    causes = _mutable_refusals(old_spec, new_spec)
    # The fields an update may change compare equal here (refused changes of them are above).
    new_spec = _with_mutable_fields(new_spec, old_spec)
    for path in _differences(old_spec, new_spec, "spec")[:_MAX_CAUSES]:
        if path == "spec.nodeName":
            why = (
                "Tessera chooses where a pod runs: spec.nodeName cannot be set or changed "
                "(leave it out, or send back the value the pod has)"
            )
        elif re.fullmatch(
            r"spec\.containers\[\d+\]\.resources\.(requests|limits)\.(cpu|memory)", path
        ):
            why = (
                "a container's cpu and memory change through the resize subresource, which "
                "resizes the pod in place: kubectl patch pod NAME --subresource resize --patch "
                '\'{"spec":{"containers":[{"name":"...","resources":{...}}]}}\''
            )
        else:
            why = (
                "a pod's spec cannot change after creation, except spec.activeDeadlineSeconds "
                "(lowered), spec.tolerations (added), containers' images, and their cpu and "
                "memory (through the resize subresource); labels and annotations can: delete "
                "and re-create the pod to change this field"
            )
        causes.append(Cause(path, f"Forbidden: {why}", "FieldValueForbidden"))
    old_labels = current["metadata"].get("labels") or {}
    new_labels = pod.metadata.labels or {}
    old_annotations = current["metadata"].get("annotations") or {}
    admitted_as = {  # what the pod was admitted with where its labels say nothing
        LABEL_COMPUTE_CLASS: old_annotations.get(ANNOTATION_COMPUTE_CLASS),
        LABEL_COMPUTE_QOS: "default",
    }
    for key in IMMUTABLE_POD_LABELS:
        before = old_labels.get(key, admitted_as.get(key))
        if key in new_labels and new_labels[key] != before:
            causes.append(
                Cause(
                    f"metadata.labels.{key}",
                    f"Forbidden: {key} decides placement and price and cannot change after creation",
                    "FieldValueForbidden",
                )
            )
    new_annotations = pod.metadata.annotations or {}
    for key in SERVER_ANNOTATIONS:
        if new_annotations.get(key) not in (None, old_annotations.get(key)):
            causes.append(
                Cause(
                    f"metadata.annotations.{key}",
                    f"Forbidden: Tessera sets this annotation ({SERVER_ANNOTATIONS[key]}); "
                    "leave it out or send back the value the pod has",
                    "FieldValueForbidden",
                )
            )
    for field in ("name", "namespace", "uid"):
        value = section(desired, "metadata").get(field)
        if value not in (None, current["metadata"][field]):
            causes.append(
                Cause(f"metadata.{field}", "Invalid value: field is immutable", "FieldValueInvalid")
            )
    return causes


def _canonical(value: Any, key: str = "") -> Any:
    """`value` with resource quantities as numbers, so `2`, `"2"` and `"2000m"` compare equal."""
    if isinstance(value, dict):
        if key in _QUANTITY_MAPS:
            return {k: _quantity(v) for k, v in value.items()}
        return {k: _canonical(v, k) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _quantity(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except (QuantityError, TypeError, AttributeError):
        return value


def _differences(old: Any, new: Any, path: str) -> list[str]:
    """The paths (`spec.containers[0].image`) at which `new` differs from `old`."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                out += _differences(old.get(key), new.get(key), f"{path}.{key}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a != b:
                out += _differences(a, b, f"{path}[{i}]")
        return out
    return [path] if old != new else []


# --- delete -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Disruption:
    """Why a pod is stopped that its owner did not delete: the `DisruptionTarget` condition's
    reason and message, and the words for its Killing event."""

    reason: str
    message: str
    why: str


EVICTED = Disruption(
    "EvictionByEvictionAPI", "Eviction API: evicting", "evicted through the Eviction API"
)


def delete(
    session: Session,
    *,
    namespace: str,
    name: str,
    grace_seconds: int | None,
    precondition_uid: str | None = None,
    precondition_rv: str | None = None,
    disruption: Disruption | None = None,
) -> dict[str, Any]:
    """Delete a pod. A pod never bound is removed at once; a bound pod is marked with a
    deletionTimestamp and removed when its node has stopped it (or at once with grace 0).
    `disruption`: why, when the owner did not ask (an eviction, a preemption); the pod says so
    in its `DisruptionTarget` condition while it stops."""
    row = _locked(session, namespace, name)
    if precondition_uid and precondition_uid != row["uid"]:
        raise Conflict(
            f"Precondition failed: UID in precondition: {precondition_uid}, UID in object meta: {row['uid']}",
            ref=ResourceRef("pods", name),
        )
    if precondition_rv and precondition_rv != str(row["resource_version"]):
        raise _stale(name)
    at = now()
    finalizers = row["meta_extra"].get("finalizers")
    if (row["node_name"] is None or grace_seconds == 0) and not finalizers:
        return _remove(session, row, at)
    grace = (
        grace_seconds
        if grace_seconds is not None
        else int(row["spec"].get("terminationGracePeriodSeconds", 30))
    )
    if row["node_name"] is None:
        grace = 0  # nothing runs: only the finalizers hold it
    deadline = _deadline(at, grace)
    # Already terminating: a shorter grace period takes effect, a longer one does not.
    if row["deletion_timestamp"] is not None and (
        grace_seconds is None or deadline >= row["deletion_timestamp"]
    ):
        return to_api(row)
    changes: dict[str, Any] = {"deletion_timestamp": deadline, "deletion_grace_seconds": grace}
    conditions = row["conditions"]
    if disruption is not None:
        conditions = _set_condition(
            conditions,
            _condition("DisruptionTarget", "True", disruption.reason, disruption.message, at),
        )
        changes["conditions"] = conditions
    if row["phase"] == "Running":
        # As the kubelet reports a terminating pod: no longer ready while its containers stop.
        names = ", ".join(c["name"] for c in row["spec"].get("containers", []))
        for kind in ("ContainersReady", "Ready"):
            conditions = _set_condition(
                conditions,
                _condition(
                    kind,
                    "False",
                    "ContainersNotReady",
                    f"the pod is terminating: containers with unready status: [{names}]",
                    at,
                ),
            )
        changes["conditions"] = conditions
    _, obj = _modify(session, row, changes)
    if disruption is not None and row["node_name"] is not None:
        callbacks.emit_eviction_notice(
            session,
            row,
            deadline=deadline,
            reason=disruption.reason,
            message=disruption.message,
            at=at,
        )
    events.record(
        session,
        involved=_involved(row),
        reason="Killing",
        message=f"stopping the pod (grace period {grace}s)"
        + (f": {disruption.why}" if disruption is not None else ""),
        tenant_id=row["tenant_id"],
        at=at,
    )
    return obj


def delete_collection(
    session: Session,
    *,
    namespace: str,
    labels: LabelSelector,
    fields: list[FieldRequirement],
    grace_seconds: int | None,
) -> list[dict[str, Any]]:
    """Delete every pod of the namespace that the selectors match, each as `delete` does, in
    one transaction; returns them as deleted (or as marked for deletion)."""
    matched = list_pods(
        session,
        tenant_id=None,
        namespace=namespace,
        labels=labels,
        fields=fields,
        limit=None,
        continue_token=None,
    ).items
    return [
        delete(
            session, namespace=namespace, name=pod["metadata"]["name"], grace_seconds=grace_seconds
        )
        for pod in matched
    ]


BUDGET_SPENT = Disruption(
    "BudgetExceeded",
    "Spend limit: the tenant's budget is spent and it asked for its running pods to stop",
    "stopped: the tenant's budget is spent",
)


def stop_for_budget(session: Session, *, namespace: str, name: str, reached: datetime) -> None:
    """Stop a pod because its tenant's budget is spent and asked for it: deleted with its grace
    period (condition `DisruptionTarget`, reason `BudgetExceeded`), and billed only up to
    `reached`, the second the limit was reached (never before its bind), as a GPU fault's stop
    is written at the fault: the time the meter took to notice and the pod's grace period are
    not billed, so a spend limit is the most a statement shows."""
    row = _locked(session, namespace, name)
    if holds_capacity(row):
        bound = row["bound_at"]
        ended = reached if bound is None else max(reached, bound)
        ledger.record(
            session, [ledger.stopped(row, at=ended, reason=Reason.BUDGET)], recorded_at=now()
        )
    delete(session, namespace=namespace, name=name, grace_seconds=None, disruption=BUDGET_SPENT)


PREEMPTED = Disruption(
    "PreemptionByScheduler",
    "Tessera preempted this BestEffort pod to place a regular one",
    "preempted to place a regular pod",
)


def preempt(
    session: Session,
    *,
    nominations: Mapping[str, str],
    victims: Sequence[str],
    notice_seconds: int,
) -> list[str]:
    """Carry out a preemption plan: each victim (a running BestEffort pod, by uid) gets the
    `DisruptionTarget` condition, a Warning event and `notice_seconds` to stop; each preemptor
    (uid -> node) is nominated to the node being freed for it. Neither side is told the other's
    names (they may be other tenants'). Returns the uids of the victims evicted; nothing is done
    when a preemptor was bound or deleted meanwhile, or a victim is gone or already stopping
    (the plan is stale: the next cycle computes a new one)."""
    preemptors = [repository.get_by_uid(session, uid, for_update=True) for uid in nominations]
    if any(row is None or row["node_name"] is not None for row in preemptors):
        return []
    rows = [repository.get_by_uid(session, uid, for_update=True) for uid in victims]
    if any(
        row is None
        or row["qos"] != "best-effort"
        or not holds_capacity(row)
        or row["deletion_timestamp"] is not None
        or row["disruption_deadline"] is not None
        for row in rows
    ):
        return []
    at = now()

    def named(others: Sequence[Row | None], tenant_id: int, what: str) -> str:
        """The pods of the same tenant by name; another tenant's are only counted."""
        own = sorted(
            f"{r['namespace']}/{r['name']}" for r in others if r and r["tenant_id"] == tenant_id
        )
        foreign = sum(1 for r in others if r and r["tenant_id"] != tenant_id)
        parts = own + ([f"{foreign} {what} of another tenant"] if foreign else [])
        return ", ".join(parts)

    for row in rows:
        assert row is not None
        conditions = _set_condition(
            row["conditions"],
            _condition("DisruptionTarget", "True", PREEMPTED.reason, PREEMPTED.message, at),
        )
        _modify(
            session,
            row,
            {"conditions": conditions, "disruption_deadline": _deadline(at, notice_seconds)},
        )
        callbacks.emit_eviction_notice(
            session,
            row,
            deadline=_deadline(at, notice_seconds),
            reason=PREEMPTED.reason,
            message=PREEMPTED.message,
            at=at,
        )
        events.record(
            session,
            involved=_involved(row),
            reason="Preempted",
            message=f"preempted for {named(preemptors, row['tenant_id'], 'pod(s)')}, a regular "
            f"pod that needs this capacity: the pod stops in {notice_seconds}s",
            type="Warning",
            component="tessera-scheduler",
            tenant_id=row["tenant_id"],
            at=at,
        )
    for row in preemptors:
        assert row is not None
        node = nominations[row["uid"]]
        _modify(session, row, {"nominated_node_name": node})
        events.record(
            session,
            involved=_involved(row),
            reason="Preempting",
            message=f"preempting BestEffort {named(rows, row['tenant_id'], 'pod(s)')} on {node} "
            "to make room for this one; it is placed when they have stopped",
            component="tessera-scheduler",
            tenant_id=row["tenant_id"],
            at=at,
        )
    return [row["uid"] for row in rows if row is not None]


# Kubernetes' reason for a pod evicted because a device it uses has a NoExecute taint (KEP-5055).
GPU_FAULT_REASON = "DeletionByDeviceTaintManager"


def disrupt_for_fault(
    session: Session, *, uid: str, message: str, at: datetime, grace_seconds: int
) -> Row | None:
    """A GPU the pod holds a fragment of (or a GPU of its gang, `message` says which) failed at
    `at`: the pod gets the `DisruptionTarget` condition (reason `DeletionByDeviceTaintManager`,
    as Kubernetes' device taint manager writes it) and a Warning event now, its billing stops at
    `at`, and it stops `grace_seconds` later (`end_preempted`, the same notice machinery as a
    preemption; a notice already running is never made longer). Returns the updated row, or
    None when the pod holds no capacity or was already told of a fault."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or not holds_capacity(row) or fault_disrupted(row):
        return None
    conditions = _set_condition(
        row["conditions"], _condition("DisruptionTarget", "True", GPU_FAULT_REASON, message, at)
    )
    deadline = _deadline(at, grace_seconds)
    if row["disruption_deadline"] is not None:
        deadline = min(deadline, row["disruption_deadline"])
    ledger.record(session, [ledger.stopped(row, at=at, reason=Reason.GPU_FAULT)], recorded_at=at)
    updated, _ = _modify(session, row, {"conditions": conditions, "disruption_deadline": deadline})
    again = reschedules_on_fault(session, row)
    events.record(
        session,
        involved=_involved(row),
        reason="GPUFault",
        message=f"{message}: billing stopped at the fault; the pod stops in "
        f"{max(0, int((deadline - at).total_seconds()))}s"
        + (" and is placed again on healthy capacity" if again else ""),
        type="Warning",
        component="tessera-device-taint-manager",
        tenant_id=row["tenant_id"],
        at=at,
    )
    return updated


def fault_disrupted(row: Row) -> bool:
    """The pod was told that a GPU it (or its gang) holds failed."""
    return any(
        c["type"] == "DisruptionTarget" and c.get("reason") == GPU_FAULT_REASON
        for c in row["conditions"]
    )


def reschedules_on_fault(session: Session, row: Row) -> bool:
    """Annotated `tessera.io/reschedule-on-fault: "true"` (for a gang: any of its members)."""
    if row["annotations"].get(ANNOTATION_RESCHEDULE_ON_FAULT) == "true":
        return True
    if not row["pod_group"]:
        return False
    return any(
        m["annotations"].get(ANNOTATION_RESCHEDULE_ON_FAULT) == "true"
        for m in repository.group_members(session, row["namespace"], row["pod_group"])
    )


def end_preempted(session: Session, *, uid: str) -> bool:
    """A disrupted pod's notice is over (a preemption's, or a GPU fault's grace period): its
    node stops it and its capacity is released, and the pod ends Failed with reason `Preempted`
    (`GPUFault`). Billing of a preempted pod ends now; a faulted one's ended at the fault.
    Annotated `tessera.io/requeue-on-preemption: "true"` (`tessera.io/reschedule-on-fault`), it
    is replaced instead by a Pending pod of the same name and spec (a new uid: each run of a pod
    is its own object to watchers and billing); a gang whose GPU failed goes back whole, in this
    one transaction. A pod its owner was deleting meanwhile (or whose namespace is being
    deleted) is removed."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or row["disruption_deadline"] is None:
        return False
    if not holds_capacity(row):  # it ended on its own during the notice
        _modify(session, row, {"disruption_deadline": None})
        return True
    if fault_disrupted(row) and row["pod_group"] and reschedules_on_fault(session, row):
        mates = [
            m
            for m in repository.group_members(session, row["namespace"], row["pod_group"])
            if m["uid"] != uid
            and m["disruption_deadline"] is not None
            and fault_disrupted(m)
            and holds_capacity(m)
        ]
        _end_disrupted(session, row, now())
        for mate in mates:
            locked = repository.get_by_uid(session, mate["uid"], for_update=True)
            if locked is not None and locked["disruption_deadline"] is not None:
                _end_disrupted(session, locked, now())
        return True
    _end_disrupted(session, row, now())
    return True


def _end_disrupted(session: Session, row: Row, at: datetime) -> None:
    fault = fault_disrupted(row)
    reason = Reason.GPU_FAULT if fault else Reason.PREEMPT
    node = row["node_name"]
    if row["deletion_timestamp"] is not None:
        _remove(session, row, at, reason=reason)
        return
    inventory.release(session, pod=row)
    if not fault:  # a fault's stop was written at the fault
        ledger.record(session, [ledger.stopped(row, at=at, reason=reason)], recorded_at=at)
    if fault and reschedules_on_fault(session, row):
        _requeue(session, row, at, fault=True)
        return
    if not fault and row["annotations"].get(ANNOTATION_REQUEUE_ON_PREEMPTION) == "true":
        _requeue(session, row, at)
        return
    conditions = row["conditions"]
    for kind in ("ContainersReady", "Ready"):
        conditions = _set_condition(conditions, _condition(kind, "False", "PodFailed", None, at))
    if fault:
        told = next(c for c in row["conditions"] if c["type"] == "DisruptionTarget")
        status_reason, why = "GPUFault", told.get("message", "its GPU failed")
        message = f"{why}; its grace period is over"
    else:
        status_reason, why = "Preempted", PREEMPTED.why
        message = f"preempted on {node} to place a regular pod; its notice period is over"
    _modify(
        session,
        row,
        {
            "phase": "Failed",
            "status_reason": status_reason,
            "status_message": message,
            "conditions": conditions,
            "disruption_deadline": None,
        },
    )
    callbacks.emit_pod_finished(
        session, row, phase="Failed", reason="Preempted", exit_code=143, at=at, message=message
    )
    events.record(
        session,
        involved=_involved(row),
        reason="Killing",
        message=f"stopped the pod: {why}",
        type="Warning" if fault else "Normal",
        component="tessera-agent",
        tenant_id=row["tenant_id"],
        at=at,
    )


def _requeue(session: Session, row: Row, at: datetime, *, fault: bool = False) -> None:
    """Replace a preempted pod (or one whose GPU failed) by a Pending one of the same name,
    placed again like any other."""
    repository.delete_pod(session, row["uid"])
    gone = {
        **row,
        "resource_version": next_resource_version(session),
        "deletion_timestamp": at,
        "deletion_grace_seconds": 0,
    }
    _log(session, gone, to_api(gone), "DELETED")
    annotations = {k: v for k, v in row["annotations"].items() if k != ANNOTATION_GPU_ALLOCATION}
    demand: dict[str, Any] = {}
    if row["resize_cpu_milli"] is not None:  # a deferred resize: placed again at the new size
        demand = _sold_as(
            {**row, "annotations": annotations},
            ComputeSpec(row["resize_cpu_milli"], row["resize_memory_mib"]),
        )
        annotations = demand.pop("annotations")
    values = {
        **row,
        **demand,
        "resize_cpu_milli": None,
        "resize_memory_mib": None,
        "allocated_resources": None,
        "resizes": 0,
        "uid": new_uid(),
        "resource_version": next_resource_version(session),
        "generation": 1,
        "created_at": at,
        "annotations": annotations,
        "phase": "Pending",
        "node_name": None,
        "conditions": [
            _condition(
                "PodScheduled",
                "False",
                "GPUFault" if fault else "Preempted",
                ("requeued after a GPU fault" if fault else "requeued after preemption")
                + ": waiting for the scheduler to place it again",
                at,
            )
        ],
        "status_reason": None,
        "status_message": None,
        "start_time": None,
        "container_statuses": None,
        "init_container_statuses": None,
        "pod_ip": None,
        "bound_at": None,
        "nominated_node_name": None,
        "disruption_deadline": None,
    }
    repository.insert_pod(session, values)
    _log(session, values, to_api(values), "ADDED")
    events.record(
        session,
        involved=_involved(values),
        reason="Requeued",
        message=f"the previous pod of this name ({row['uid']}) "
        + ("stopped: a GPU failed" if fault else "was preempted")
        + f" on {row['node_name']}: this one waits to be placed again",
        component="tessera-scheduler",
        tenant_id=row["tenant_id"],
        at=at,
    )


def clear_nomination(session: Session, *, uid: str) -> bool:
    """The capacity preemption freed was not enough after all (or went elsewhere): forget the
    nomination so that the scheduler may plan again."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or not row.get("nominated_node_name") or row["node_name"] is not None:
        return False
    _modify(session, row, {"nominated_node_name": None})
    return True


# The latest deadline a grace period can set (any int64 of seconds is accepted, as in Kubernetes).
LATEST_DEADLINE = datetime(9999, 1, 1, tzinfo=UTC)


def _deadline(at: datetime, grace_seconds: int) -> datetime:
    if grace_seconds >= (LATEST_DEADLINE - at).total_seconds():
        return LATEST_DEADLINE
    return at + timedelta(seconds=grace_seconds)


def finish(
    session: Session,
    *,
    uid: str,
    succeeded: bool = True,
    reason: str | None = None,
    message: str | None = None,
    container_statuses: list[dict[str, Any]] | None = None,
    at: datetime | None = None,
    billing_reason: Reason = Reason.FINISH,
) -> bool:
    """The node reports that a running pod's containers have exited (all with code 0 when
    `succeeded`): the pod is Succeeded (or Failed) and stays until it is deleted; its capacity
    is released and its billing ends now (or at `at`: a lost node's last heartbeat). `reason`
    and `message` are the pod's (DeadlineExceeded, NodeLost); `container_statuses` as the node
    reported them."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or row["phase"] != "Running":
        return False
    recorded = now()
    at = at or recorded
    conditions = row["conditions"]
    for kind in ("ContainersReady", "Ready"):
        conditions = _set_condition(conditions, _condition(kind, "False", "PodCompleted", None, at))
    phase = "Succeeded" if succeeded else "Failed"
    inventory.release(session, pod=row)
    ledger.record(
        session, [ledger.stopped(row, at=at, reason=billing_reason)], recorded_at=recorded
    )
    changes: dict[str, Any] = {
        "phase": phase,
        "conditions": _without_resize_conditions(conditions),  # a pending resize ends with it
        "disruption_deadline": None,
        "resize_cpu_milli": None,
        "resize_memory_mib": None,
    }
    if reason is not None or message is not None:
        changes["status_reason"], changes["status_message"] = reason, message
    if container_statuses is not None:
        changes["container_statuses"] = container_statuses
    _modify(session, row, changes)
    callbacks.emit_pod_finished(
        session,
        row,
        phase=phase,
        reason=reason or ("Completed" if succeeded else "Error"),
        exit_code=_exit_code(container_statuses, succeeded=succeeded),
        at=at,
    )
    events.record(
        session,
        involved=_involved(row),
        reason="Completed" if succeeded else "Failed",
        message=message
        or ("all containers exited" + ("" if succeeded else " and one or more failed")),
        type="Normal" if succeeded else "Warning",
        component="tessera-agent",
        tenant_id=row["tenant_id"],
        at=at,
    )
    return True


def _exit_code(statuses: list[dict[str, Any]] | None, *, succeeded: bool) -> int:
    """The pod's exit code as its node reported it: the first failed container's, else 0 (1 for
    a failure reported without container states)."""
    codes = [
        s.get("state", {}).get("terminated", {}).get("exitCode")
        for s in statuses or []
        if isinstance(s, dict)
    ]
    failed = [c for c in codes if isinstance(c, int) and c != 0]
    if failed:
        return failed[0]
    return 0 if succeeded else 1


NODE_LOST_MESSAGE = (
    "the node {node} stopped renewing its Lease at {at} and did not come back within the "
    "grace period: the pod is lost with it"
)


def node_lost(session: Session, *, uid: str, last_heartbeat: datetime) -> bool:
    """A pod's node is lost: the pod fails with reason `NodeLost`, its capacity is released
    and its billing ends at the node's last heartbeat (not before the pod was bound)."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or not holds_capacity(row):
        return False
    at = max(last_heartbeat, row["bound_at"]) if row["bound_at"] else last_heartbeat
    recorded = now()
    inventory.release(session, pod=row)
    ledger.record(
        session, [ledger.stopped(row, at=at, reason=Reason.NODE_LOST)], recorded_at=recorded
    )
    conditions = row["conditions"]
    for kind in ("ContainersReady", "Ready"):
        conditions = _set_condition(
            conditions, _condition(kind, "False", "NodeLost", None, recorded)
        )
    message = NODE_LOST_MESSAGE.format(node=row["node_name"], at=timestamp(last_heartbeat))
    _modify(
        session,
        row,
        {
            "phase": "Failed",
            "status_reason": "NodeLost",
            "status_message": message,
            "conditions": _without_resize_conditions(conditions),
            "disruption_deadline": None,
            "resize_cpu_milli": None,
            "resize_memory_mib": None,
        },
    )
    callbacks.emit_pod_finished(
        session, row, phase="Failed", reason="NodeLost", exit_code=None, at=at, message=message
    )
    events.record(
        session,
        involved=_involved(row),
        reason="NodeLost",
        message=message,
        type="Warning",
        component="tessera-controller",
        tenant_id=row["tenant_id"],
        at=recorded,
    )
    return True


def finalize(session: Session, *, uid: str) -> bool:
    """The node has stopped a terminating pod: release its capacity and remove it."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or row["deletion_timestamp"] is None or row["meta_extra"].get("finalizers"):
        return False
    _remove(session, row, now())
    return True


def holds_capacity(row: Row) -> bool:
    """A bound pod holds its node's capacity until it ends (Succeeded, Failed) or is removed."""
    return row["node_name"] is not None and row["phase"] not in TERMINAL_PHASES


def _remove(
    session: Session, row: Row, at: datetime, *, reason: Reason | None = None
) -> dict[str, Any]:
    if holds_capacity(row):
        if reason is None:
            evicted = any(
                c["type"] == "DisruptionTarget" and c.get("reason") == EVICTED.reason
                for c in row["conditions"]
            )
            reason = Reason.EVICT if evicted else Reason.DELETE
        inventory.release(session, pod=row)
        # Billing ends when the node saw the containers stop (its last report), and a deletion's
        # at its grace deadline at the latest, however late the removal itself comes.
        ended = observed_end(row, row["container_statuses"], at=at)
        ledger.record(session, [ledger.stopped(row, at=ended, reason=reason)], recorded_at=at)
    repository.delete_pod(session, row["uid"])
    gone = {**row, "resource_version": next_resource_version(session)}
    if gone["deletion_timestamp"] is None:
        gone["deletion_timestamp"] = at
        gone["deletion_grace_seconds"] = 0
    obj = to_api(gone)
    _log(session, gone, obj, "DELETED")
    namespaces.remove_if_emptied(session, row["namespace"])
    return obj


def observed_end(
    row: Row, statuses: Sequence[Mapping[str, Any]] | None, *, at: datetime
) -> datetime:
    """The second a pod's billing ends when it stops at `at` (when the control plane learns of
    it): when its node saw the containers end, if it reported that, else `at`; never before
    the bind, never after `at` (a node clock running ahead), never after the grace deadline of
    its deletion. A report that arrives late (the API was down) thus ends billing when the pod
    ended, not when the report came."""
    end = finished_at(statuses) or at
    end = min(end, at)
    deadline = row["deletion_timestamp"]
    if deadline is not None:
        end = min(end, deadline)
    bound = row["bound_at"]
    if bound is not None:
        end = max(end, bound)
    return end


# --- bind and run -------------------------------------------------------------------------


def bind(
    session: Session,
    *,
    namespace: str,
    name: str,
    node_name: str,
    gpus: list[inventory.GPUShare],
    component: str = "tessera-scheduler",
    meter: bool = True,
) -> dict[str, Any]:
    """Assign a pending pod to a node and GPU fragments, reserving the capacity.

    The reservation decrements the node's and the GPUs' free columns in this transaction; the
    database's CHECK constraints refuse an over-allocation, which is reported as a Conflict.
    Billing starts in the same transaction, at the same second (`meter=False` only for the
    benchmark that measures what metering costs).
    """
    row = _bindable(_locked(session, namespace, name), "")
    inventory.reserve(session, pod=row, node_name=node_name, gpus=gpus)
    at = now()
    if meter:
        model = row["gpu_model"] or (ledger.gpu_model_of(session, gpus[0].gpu) if gpus else None)
        ledger.record(session, [_started(row, node_name, gpus, model, at)], recorded_at=at)
    changes, note = _bound(row, node_name, gpus, at, component)
    _, obj = _modify(session, row, changes)
    events.record_many(session, [note])
    return obj


BindGroups = Sequence[Sequence[tuple[str, str, Sequence[inventory.GPUShare]]]]


def bind_many(
    session: Session,
    groups: BindGroups,
    *,
    component: str = "tessera-scheduler",
    known: inventory.Known | None = None,
) -> list[TesseraError | None]:
    """Bind many pending pods at once: what `bind` does, for a scheduling cycle's placements,
    in a handful of statements whatever their number (the pods, nodes and GPUs locked by one
    SELECT each, then every pod, node, GPU, fragment, usage event and event written by one
    statement per table).

    `groups`: (pod uid, node, GPU fragments) per pod; a group (a gang's members, or one pod) is
    bound whole or not at all. Returns, per group, None when it was bound, or the error that
    kept it from being bound (a pod deleted or bound meanwhile, a node cordoned, capacity
    taken), while the other groups go on. `known`: rows the caller read before (the
    scheduler's), used where they are still current (see `inventory.locked_rows`)."""
    uids = sorted({uid for group in groups for uid, _, _ in group})
    node_names = sorted({node for group in groups for _, node, _ in group})
    rows = inventory.locked_rows(
        session, repository.pods, "uid", uids, known.pods if known is not None else None
    )
    nodes, gpus = inventory.lock_targets(session, node_names, known)
    binds = plan_binds(groups, rows, nodes, gpus, at=now(), component=component)
    return write_binds(session, binds)


@dataclass
class Binds:
    """A cycle's bindings worked out from rows (`plan_binds`): each group's outcome, the pods'
    updates, the capacity they take and the usage they start. `write_binds` writes them."""

    outcomes: list[TesseraError | None]
    updates: list[PodUpdate]
    reservation: inventory.Reservation
    usage: list[Transition]
    at: datetime


def plan_binds(
    groups: BindGroups,
    pods: Mapping[str, Row],
    nodes: Mapping[str, Row],
    gpus: Mapping[str, Row],
    *,
    at: datetime,
    component: str = "tessera-scheduler",
) -> Binds:
    """What `bind_many` writes, worked out from the rows of the pods, of the nodes named and
    of all their GPUs, without a session."""
    outcomes: list[TesseraError | None] = [None] * len(groups)
    valid: list[int] = []
    for i, group in enumerate(groups):
        try:
            for uid, _, _ in group:
                _bindable(pods.get(uid), uid)
        except TesseraError as exc:
            outcomes[i] = exc
        else:
            valid.append(i)
    reservation = inventory.plan_reservations(
        [[(pods[uid], node, shares) for uid, node, shares in groups[i]] for i in valid],
        nodes,
        gpus,
    )
    bound: list[tuple[Row, str, Sequence[inventory.GPUShare]]] = []
    for i, error in zip(valid, reservation.outcomes, strict=True):
        outcomes[i] = error
        if error is None:
            bound += [(pods[uid], node, shares) for uid, node, shares in groups[i]]
    usage = [
        _started(
            row,
            node,
            shares,
            row["gpu_model"] or (gpus[shares[0].gpu]["model"] if shares else None),
            at,
        )
        for row, node, shares in bound
    ]
    updates = []
    for row, node, shares in bound:
        changes, note = _bound(row, node, shares, at, component)
        updates.append(prepare_update(row, changes, note))
    return Binds(outcomes, updates, reservation, usage, at)


def write_binds(session: Session, binds: Binds) -> list[TesseraError | None]:
    """Write planned bindings; the pods' rows must be locked (and as planned). Returns, per
    group, None when it was bound, or the error that kept it from being bound."""
    inventory.write_reservation(session, binds.reservation)
    ledger.record_at_commit(session, binds.usage, recorded_at=binds.at)
    apply_updates(session, binds.updates, locked=True)
    return binds.outcomes


def bind_planned(
    session: Session,
    groups: BindGroups,
    binds: Binds,
    *,
    known: inventory.Known,
    component: str = "tessera-scheduler",
) -> Binds:
    """Write bindings planned (`plan_binds`) from the `known` rows before the transaction, if
    every pod, node and GPU they read is still as read: checked by locking them with narrow
    SELECTs, so the counter lock is held only for that and the statements. Otherwise they are
    planned again here from the rows as they are now. Returns the bindings written (their
    `outcomes`, and the nodes and GPUs as they are now in `reservation`)."""
    uids = sorted({uid for group in groups for uid, _, _ in group})
    node_names = sorted({node for group in groups for _, node, _ in group})
    rows = inventory.locked_rows(session, repository.pods, "uid", uids, known.pods)
    nodes, gpus = inventory.lock_targets(session, node_names, known)
    planned_nodes, planned_gpus = known.targets(node_names)
    current = (
        inventory.unchanged(rows, {u: known.pods[u] for u in uids if u in known.pods})
        and inventory.unchanged(nodes, planned_nodes)
        and inventory.unchanged(gpus, planned_gpus)
    )
    if not current:
        binds = plan_binds(groups, rows, nodes, gpus, at=now(), component=component)
    write_binds(session, binds)
    return binds


def _bindable(row: Row | None, uid: str) -> Row:
    """The pending pod `row`, or the Conflict that keeps it from being bound."""
    if row is None:
        raise Conflict(f"the pod {uid} no longer exists: it was deleted")
    name = row["name"]
    if row["node_name"] is not None:
        raise Conflict(
            f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
            f'assigned to node "{row["node_name"]}"',
            ref=ResourceRef("pods", name),
        )
    if row["deletion_timestamp"] is not None:
        raise Conflict(
            f'pods "{name}" is being deleted and cannot be bound', ref=ResourceRef("pods", name)
        )
    if row["phase"] in TERMINAL_PHASES:
        raise Conflict(
            f'pods "{name}" has ended ({row["phase"]}: {row["status_reason"]}) and cannot be bound',
            ref=ResourceRef("pods", name),
        )
    return row


def _started(
    row: Row,
    node_name: str,
    gpus: Sequence[inventory.GPUShare],
    model: str | None,
    at: datetime,
) -> Transition:
    shares = [(g.memory_mib, g.core_pct) for g in gpus]
    return ledger.started(row, at=at, node_name=node_name, shares=shares, gpu_model=model)


def _bound(
    row: Row,
    node_name: str,
    gpus: Sequence[inventory.GPUShare],
    at: datetime,
    component: str,
) -> tuple[dict[str, Any], events.Note]:
    """A bind's changes to the pod's row, and the Scheduled event that tells of it."""
    allocation = [
        {"gpu": g.gpu, "memoryMiB": g.memory_mib, "corePercent": g.core_pct} for g in gpus
    ]
    annotations = dict(row["annotations"])
    if allocation:
        annotations[ANNOTATION_GPU_ALLOCATION] = orjson.dumps(allocation).decode()
    gpu_text = ", ".join(f"{g.gpu} ({g.memory_mib // 1024}Gi, {g.core_pct}% SM)" for g in gpus)
    message = f"Successfully assigned {row['namespace']}/{row['name']} to {node_name}" + (
        f" with {gpu_text}" if gpus else ""
    )
    changes = {
        "node_name": node_name,
        "bound_at": at,
        "nominated_node_name": None,
        "annotations": annotations,
        "conditions": _set_condition(
            row["conditions"], _condition("PodScheduled", "True", None, None, at)
        ),
    }
    note = events.Note(
        involved=_involved(row),
        reason="Scheduled",
        message=message,
        component=component,
        tenant_id=row["tenant_id"],
        at=at,
    )
    return changes, note


PENDING_TIMEOUT = "PendingTimeout"


def fail_pending(session: Session, *, expired: Sequence[tuple[str, str]]) -> list[str]:
    """Pods that waited for a node longer than the operator allows (`max_pending_seconds`)
    fail unbound: phase Failed, reason `PendingTimeout` and the message given (uid, message),
    a Warning event and the PodFinished callback. A pod bound, being deleted or ended since
    is left alone (it held no capacity and was never billed). Returns the uids failed."""
    at = now()
    failed: list[str] = []
    for uid, message in expired:
        row = repository.get_by_uid(session, uid, for_update=True)
        if (
            row is None
            or row["node_name"] is not None
            or row["deletion_timestamp"] is not None
            or row["phase"] in TERMINAL_PHASES
        ):
            continue
        _modify(
            session,
            row,
            {
                "phase": "Failed",
                "status_reason": PENDING_TIMEOUT,
                "status_message": message,
                "nominated_node_name": None,
            },
        )
        callbacks.emit_pod_finished(
            session,
            row,
            phase="Failed",
            reason=PENDING_TIMEOUT,
            exit_code=None,
            at=at,
            message=message,
        )
        events.record(
            session,
            involved=_involved(row),
            reason=PENDING_TIMEOUT,
            message=message,
            type="Warning",
            component="tessera-scheduler",
            tenant_id=row["tenant_id"],
            at=at,
        )
        failed.append(uid)
    return failed


def mark_unschedulable(session: Session, *, uid: str, message: str) -> bool:
    row = repository.get_by_uid(session, uid, for_update=True)
    if row is None or row["node_name"] is not None:
        return False
    update = prepare_unschedulable(row, message, at=now())
    if update is None:
        return False
    _modify(session, row, update.changes)
    if update.note is not None:
        events.add(session, update.note)
    return True


def prepare_unschedulable(row: Row, message: str, *, at: datetime) -> PodUpdate | None:
    """The PodScheduled=False (Unschedulable) condition with the scheduler's reason, and a
    FailedScheduling event, for a pending pod's row; None when the pod says so already (a pod
    tried again and again writes nothing until the reason changes). The scheduler writes many
    with `apply_updates`."""
    conditions = _set_condition(
        row["conditions"], _condition("PodScheduled", "False", "Unschedulable", message, at)
    )
    if conditions == row["conditions"]:
        return None
    note = events.Note(
        involved=_involved(row),
        reason="FailedScheduling",
        message=message,
        type="Warning",
        component="tessera-scheduler",
        tenant_id=row["tenant_id"],
        at=at,
    )
    return prepare_update(row, {"conditions": conditions}, note)


def start(
    session: Session, *, uid: str, container_statuses: list[dict[str, Any]] | None = None
) -> bool:
    """The node reports the pod's containers running (as `container_statuses` say, when its
    agent reports them)."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if not _startable(row):
        return False
    assert row is not None
    changes, note = _started_changes(row, now(), container_statuses)
    _modify(session, row, changes)
    events.record_many(session, [note])
    return True


def prepare_start(row: Row, *, at: datetime) -> PodUpdate:
    """`start` worked out from a pod's row read before the write (the node loop starts many
    pods at once with `apply_updates`)."""
    changes, note = _started_changes(row, at, None)
    return prepare_update(row, changes, note)


def _startable(row: Row | None) -> bool:
    return row is not None and row["node_name"] is not None and row["phase"] == "Pending"


def _started_changes(
    row: Row, at: datetime, container_statuses: list[dict[str, Any]] | None
) -> tuple[dict[str, Any], events.Note]:
    """A start's changes to the pod's row (Running, the conditions), and its Started event."""
    conditions = row["conditions"]
    for kind in ("Initialized", "ContainersReady", "Ready"):
        conditions = _set_condition(conditions, _condition(kind, "True", None, None, at))
    changes: dict[str, Any] = {"phase": "Running", "start_time": at, "conditions": conditions}
    if container_statuses is not None:
        changes["container_statuses"] = container_statuses
    note = events.Note(
        involved=_involved(row),
        reason="Started",
        message="containers started",
        component="tessera-agent",
        tenant_id=row["tenant_id"],
        at=at,
    )
    return changes, note


# --- status reported by the node ------------------------------------------------------------


def report_status(
    session: Session, *, namespace: str, name: str, status: ReportedPodStatus, node: str | None
) -> dict[str, Any]:
    """The pod's node reports its status (`node`: the reporting node; None for the admin).

    The phase moves only forward, through the same transitions the built-in simulation uses:
    Pending -> Running is `start`, Running -> Succeeded/Failed is `finish` (capacity released,
    billing ended when the node saw the containers end: `observed_end`); a pod that fails before
    it runs goes through both. The containers' states are kept as reported (restart counts,
    exit codes). A report repeated, or arriving late, bills once and at the observed time. A
    backward or sideways move (Succeeded -> Running, Failed -> Succeeded) is refused with 409
    and writes nothing."""
    row = _locked(session, namespace, name)
    if node is not None and row["node_name"] != node:
        raise Forbidden(
            f'pods "{name}" is forbidden: node "{node}" may report the status only of pods '
            "bound to it",
            ref=ResourceRef("pods", name),
        )
    if row["node_name"] is None:
        raise Conflict(
            f'pods "{name}" is not bound to a node yet: only the node it is bound to reports '
            "its status",
            ref=ResourceRef("pods", name),
        )
    containers = _reported_containers(row, status)
    extra = _reported_extra(row, status)  # checked before anything is written
    current, phase = row["phase"], status.phase
    if current != phase and (current in TERMINAL_PHASES or phase == "Pending"):
        raise Conflict(
            f'pods "{name}" cannot go from {current} to {phase}: a pod\'s phase only moves '
            "forward (Pending, Running, then Succeeded or Failed); delete it and create a new one",
            ref=ResourceRef("pods", name),
        )
    uid = row["uid"]
    if current == phase:
        changes = dict(extra)
        if containers is not None and containers != row["container_statuses"]:
            changes["container_statuses"] = containers
        if changes:
            _modify(session, row, changes)
        return get(session, namespace=namespace, name=name)
    if current == "Pending":
        start(session, uid=uid, container_statuses=containers)
    if phase in TERMINAL_PHASES:
        finish(
            session,
            uid=uid,
            succeeded=phase == "Succeeded",
            reason=status.reason,
            message=status.message,
            container_statuses=containers,
            at=observed_end(row, containers, at=now()),
        )
    if extra:  # after the transitions' own conditions: what the node observed wins
        row = _locked(session, namespace, name)
        extra = _reported_extra(row, status)
        if extra:
            _modify(session, row, extra)
    return get(session, namespace=namespace, name=name)


def _reported_containers(row: Row, status: ReportedPodStatus) -> list[dict[str, Any]] | None:
    if status.container_statuses is None:
        return None
    names = [c["name"] for c in row["spec"].get("containers", [])]
    causes = []
    seen: set[str] = set()
    for i, c in enumerate(status.container_statuses):
        if c.name not in names or c.name in seen:
            causes.append(
                Cause(
                    f"status.containerStatuses[{i}].name",
                    f'Invalid value: "{c.name}": name each container of the pod once '
                    f"({', '.join(names)})",
                )
            )
        seen.add(c.name)
        for which, state in (("state", c.state), ("lastState", c.last_state)):
            for field, value in _state_times(state):
                try:
                    parse_timestamp(value)
                except ValueError:
                    causes.append(
                        Cause(
                            f"status.containerStatuses[{i}].{which}.{field}",
                            f'Invalid value: "{value}": write an RFC 3339 time like '
                            "2026-12-04T10:00:00Z",
                        )
                    )
    if causes:
        raise invalid("Pod", row["name"], causes)
    return [c.model_dump(by_alias=True, exclude_none=True) for c in status.container_statuses]


def _reported_extra(row: Row, status: ReportedPodStatus) -> dict[str, Any]:
    """The init containers' states, the pod's address and its Ready conditions as reported,
    where they differ from the row's."""
    changes: dict[str, Any] = {}
    if status.init_container_statuses is not None:
        names = [c["name"] for c in row["spec"].get("initContainers") or []]
        causes = [
            Cause(
                f"status.initContainerStatuses[{i}].name",
                f'Invalid value: "{c.name}": name each init container of the pod once '
                f"({', '.join(names) or 'it has none'})",
            )
            for i, c in enumerate(status.init_container_statuses)
            if c.name not in names
        ]
        if causes:
            raise invalid("Pod", row["name"], causes)
        reported = [
            c.model_dump(by_alias=True, exclude_none=True) for c in status.init_container_statuses
        ]
        if reported != row.get("init_container_statuses"):
            changes["init_container_statuses"] = reported
    if status.pod_ip is not None and status.pod_ip != row.get("pod_ip"):
        changes["pod_ip"] = status.pod_ip or None
    conditions = row["conditions"]
    for condition in status.conditions or []:
        if condition.type not in ("Ready", "ContainersReady") or condition.status == "Unknown":
            continue
        known = next((c for c in conditions if c["type"] == condition.type), None)
        if known is None or known["status"] != condition.status:
            conditions = _set_condition(
                conditions,
                _condition(condition.type, condition.status, condition.reason, None, now()),
            )
    if conditions != row["conditions"]:
        changes["conditions"] = conditions
    return changes


def _state_times(state: Any) -> list[tuple[str, str]]:
    out = []
    for part in ("running", "terminated"):
        value = getattr(state, part)
        if value is None:
            continue
        for field, attr in (("startedAt", "started_at"), ("finishedAt", "finished_at")):
            text = getattr(value, attr, None)
            if text is not None:
                out.append((f"{part}.{field}", text))
    return out


# --- shapes -------------------------------------------------------------------------------


def to_api(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The v1 Pod object for a stored row."""
    metadata: dict[str, Any] = {
        "name": row["name"],
        "namespace": row["namespace"],
        "uid": row["uid"],
        "resourceVersion": str(row["resource_version"]),
        "generation": row["generation"],
        "creationTimestamp": timestamp(row["created_at"]),
    }
    if row["deletion_timestamp"] is not None:
        metadata["deletionTimestamp"] = timestamp(row["deletion_timestamp"])
        metadata["deletionGracePeriodSeconds"] = row["deletion_grace_seconds"]
    if row["labels"]:
        metadata["labels"] = row["labels"]
    if row["annotations"]:
        metadata["annotations"] = row["annotations"]
    metadata.update(row["meta_extra"])
    spec = dict(row["spec"])
    spec["priority"] = row["priority"]
    if row["node_name"] is not None:
        spec["nodeName"] = row["node_name"]
    status: dict[str, Any] = {
        "phase": row["phase"],
        "conditions": row["conditions"],
        "qosClass": "BestEffort" if row["qos"] == "best-effort" else "Guaranteed",
    }
    if row["start_time"] is not None:
        status["startTime"] = timestamp(row["start_time"])
    if row.get("container_statuses"):
        images = {c["name"]: c.get("image", "") for c in row["spec"].get("containers", [])}
        terminating = row["deletion_timestamp"] is not None
        containers = {c["name"]: c for c in row["spec"].get("containers", [])}
        held = row.get("allocated_resources") or {}
        status["containerStatuses"] = [
            {
                **c,
                "image": images.get(c["name"], ""),
                "ready": c.get("ready", False) and row["phase"] == "Running" and not terminating,
                **_allocated(containers.get(c["name"], {}), held.get(c["name"])),
            }
            for c in row["container_statuses"]
        ]
    elif row["start_time"] is not None:
        status["containerStatuses"] = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": row["phase"] == "Running" and row["deletion_timestamp"] is None,
                "started": row["phase"] == "Running",
                "restartCount": 0,
                "state": _container_state(row),
                **_allocated(c, (row.get("allocated_resources") or {}).get(c["name"])),
            }
            for c in row["spec"].get("containers", [])
        ]
    if row.get("init_container_statuses"):
        status["initContainerStatuses"] = row["init_container_statuses"]
    if row.get("pod_ip"):
        status["podIP"] = row["pod_ip"]
        status["podIPs"] = [{"ip": row["pod_ip"]}]
    if row.get("nominated_node_name"):
        status["nominatedNodeName"] = row["nominated_node_name"]
    if row["status_reason"]:
        status["reason"] = row["status_reason"]
    if row["status_message"]:
        status["message"] = row["status_message"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def _allocated(container: Mapping[str, Any], held: Mapping[str, Any] | None) -> dict[str, Any]:
    """A container's `allocatedResources` and `resources` as Kubernetes 1.33 reports them: what
    the node holds for it (its spec's resources, unless a resize of them is pending)."""
    resources = dict(held if held is not None else container.get("resources") or {})
    requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out: dict[str, Any] = {"resources": {k: v for k, v in resources.items() if v}}
    if requests:
        out["allocatedResources"] = requests
        out["resources"]["requests"] = requests
    return out


def _container_state(row: Mapping[Any, Any]) -> dict[str, Any]:
    started = timestamp(row["start_time"])
    if row["status_reason"] in ("Preempted", "GPUFault"):  # stopped by SIGTERM, as on a node
        return {
            "terminated": {"exitCode": 143, "reason": row["status_reason"], "startedAt": started}
        }
    if row["phase"] in ("Succeeded", "Failed"):
        ok = row["phase"] == "Succeeded"
        return {
            "terminated": {
                "exitCode": 0 if ok else 1,
                "reason": "Completed" if ok else "Error",
                "startedAt": started,
            }
        }
    return {"running": {"startedAt": started}}


def owner_references(pod: Pod) -> list[dict[str, Any]] | None:
    refs = pod.metadata.owner_references
    return [o.model_dump(by_alias=True, exclude_none=True) for o in refs] if refs else None


def _meta_extra(pod: Pod) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    refs = owner_references(pod)
    if refs:
        extra["ownerReferences"] = refs
    if pod.metadata.finalizers:
        extra["finalizers"] = list(pod.metadata.finalizers)
    if pod.metadata.generate_name:
        extra["generateName"] = pod.metadata.generate_name
    if pod.metadata.managed_fields:
        extra["managedFields"] = list(pod.metadata.managed_fields)
    return extra


def _condition(
    kind: str, status: str, reason: str | None, message: str | None, at: datetime
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": timestamp(at),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _set_condition(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    replaced = False
    for condition in conditions:
        if condition["type"] == new["type"]:
            same = all(condition.get(k) == new.get(k) for k in ("status", "reason", "message"))
            out.append(condition if same else new)
            replaced = True
        else:
            out.append(condition)
    if not replaced:
        out.append(new)
    return out


def _involved(row: Mapping[Any, Any]) -> events.Involved:
    return events.Involved("Pod", row["name"], row["uid"], row["namespace"])


def _modify(
    session: Session, row: Row, changes: dict[str, Any], *, check_version: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write `changes` to the pod with a new resourceVersion and log the change for watchers.

    `check_version`: only if nobody changed the pod since `row` was read (else 409 Conflict).
    Returns the updated row and its API object."""
    changes = {**changes, "resource_version": next_resource_version(session)}
    expected = row["resource_version"] if check_version else None
    if not repository.update_pod(session, row["uid"], changes, expected_rv=expected):
        raise _stale(row["name"])
    updated = {**row, **changes}
    obj = to_api(updated)
    _log(session, updated, obj, "MODIFIED", before=row)
    return updated, obj


def _log(
    session: Session,
    row: Mapping[Any, Any],
    obj: dict[str, Any],
    event_type: str,
    *,
    before: Mapping[Any, Any] | None = None,
) -> None:
    """Log a change for watchers; `before` (a MODIFIED pod's previous row) is rendered only when
    its labels or a selectable column changed, which keeps the bind path cheap."""
    moved = before is not None and any(before[c] != row[c] for c in _SELECTABLE_COLUMNS)
    record_change(
        session,
        {
            "resource_version": row["resource_version"],
            "kind": "Pod",
            "namespace": row["namespace"],
            "name": row["name"],
            "tenant_id": row["tenant_id"],
            "type": event_type,
            "object": obj,
        },
        before=to_api(before) if moved and before is not None else None,
        selectable=FIELD_SELECTORS,
    )


_SELECTABLE_COLUMNS = ("labels", *(c.name for c in repository.FIELD_COLUMNS.values()))


@dataclass
class PodUpdate:
    """A change to a pod worked out from its row before the write transaction
    (`prepare_update`): the new column values, the API objects after (and, when a watch's
    selector may see the pod come or go, before) and the event that tells of it.
    `apply_updates` writes it if the pod is still as it was read, at a new resourceVersion."""

    row: Row
    changes: dict[str, Any]
    obj: dict[str, Any]
    before: dict[str, Any] | None
    note: events.Prepared | None


def prepare_update(row: Row, changes: dict[str, Any], note: events.Note | None) -> PodUpdate:
    updated = {**row, **changes}
    moved = any(row[c] != updated[c] for c in _SELECTABLE_COLUMNS)
    return PodUpdate(
        row,
        changes,
        to_api(updated),
        to_api(row) if moved else None,
        events.prepare(note) if note is not None else None,
    )


def apply_updates(
    session: Session, updates: Sequence[PodUpdate], *, locked: bool = False
) -> list[PodUpdate]:
    """Write prepared pod updates, a handful of statements whatever their number: the pods are
    locked by one narrow SELECT (unless `locked`: the caller holds their rows, as read), and
    an update whose pod changed since its row was read (another resourceVersion, or gone) is
    skipped: its caller reads it again. The others get a resourceVersion each and are written
    by one UPDATE per set of columns, logged for watchers, their events recorded. Returns the
    updates written."""
    if not updates:
        return []
    if not locked:
        pods_t = repository.pods
        current = dict(
            session.execute(
                select(pods_t.c.uid, pods_t.c.resource_version)
                .where(pods_t.c.uid.in_(sorted({u.row["uid"] for u in updates})))
                .order_by(pods_t.c.uid)
                .with_for_update()
            ).all()
        )
        updates = [u for u in updates if current.get(u.row["uid"]) == u.row["resource_version"]]
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for update in updates:
        rv = next_resource_version(session)
        update.changes["resource_version"] = rv
        update.obj["metadata"]["resourceVersion"] = str(rv)
        columns = tuple(sorted(update.changes))
        by_columns.setdefault(columns, []).append({"uid": update.row["uid"], **update.changes})
    for columns, rows in by_columns.items():  # written as the transaction commits
        defer_update(session, repository.pods, "uid", columns, rows)
    for update in updates:
        row = update.row
        record_change(
            session,
            {
                "resource_version": update.changes["resource_version"],
                "kind": "Pod",
                "namespace": row["namespace"],
                "name": row["name"],
                "tenant_id": row["tenant_id"],
                "type": "MODIFIED",
                "object": update.obj,
            },
            before=update.before,
            selectable=FIELD_SELECTORS,
        )
        if update.note is not None:
            events.add(session, update.note)
    return list(updates)


def _locked(session: Session, namespace: str, name: str) -> Row:
    row = repository.get(session, namespace, name, for_update=True)
    if row is None:
        raise NotFound(f'pods "{name}" not found', ref=ResourceRef("pods", name))
    return row


def _stale(name: str) -> Conflict:
    return Conflict(
        f'Operation cannot be fulfilled on pods "{name}": the object has been modified; please '
        "apply your changes to the latest version and try again",
        ref=ResourceRef("pods", name),
    )


# --- resize (pods/resize) ---------------------------------------------------------------------
#
# KEP-1287's conventions: the spec holds the resources asked for; the status shows what the node
# holds (`containerStatuses[].allocatedResources` / `.resources`), and while they differ the
# condition `PodResizePending` says why: `Deferred` (it may fit this node later: the node agent
# retries it when the node has the room, `retry_resize`) or `Infeasible` (it never can). A resize
# that fits takes effect at once: the node's free capacity, the sold spec, the annotation and the
# usage ledger change in one transaction, at one second.

RESIZE_PENDING = "PodResizePending"
RESIZE_IN_PROGRESS = "PodResizeInProgress"
RESIZABLE = (CPU, MEMORY)
GPU_RESOURCES = (GPU, GPU_MEMORY, GPU_CORE)
_RESIZE_ONLY = (
    "Forbidden: the resize subresource changes only the cpu and memory of containers "
    "(spec.containers[*].resources); change labels and annotations with a patch of the pod "
    "itself, anything else by deleting and re-creating the pod"
)
_GPU_FIXED = (
    f"Forbidden: GPU resources ({GPU}, {GPU_MEMORY}, {GPU_CORE}) cannot be resized in place: a "
    "pod keeps the GPUs it was bound to. Delete the pod and create it again with the GPU "
    "resources you want (its cpu and memory can be resized)"
)


def resize(
    session: Session,
    *,
    namespace: str,
    name: str,
    body: Any,
    patch_type: str | None,
    context: AdmissionContext,
) -> dict[str, Any]:
    """Change the CPU and memory of a pod's containers in place (`PATCH` with `patch_type`, or
    `PUT` of the whole pod with `patch_type=None`); returns the pod.

    A pending pod's demand just changes (the scheduler places the new size). A bound pod's new
    demand, rounded to a sold spec as at creation, takes effect at once when its node has the
    room; else the resize is `Deferred` or `Infeasible` and the pod keeps what it holds. A later
    resize replaces a pending one. Anything else the body changes is refused, writing nothing."""
    row = _locked(session, namespace, name)
    current = to_api(row)
    desired = body if patch_type is None else apply_patch(current, body, patch_type)
    if not isinstance(desired, dict):
        raise invalid("Pod", name, [Cause("", "Invalid value: the pod must be an object")])
    wanted_rv = section(desired, "metadata").get("resourceVersion")
    if wanted_rv not in (None, "") and str(wanted_rv) != str(row["resource_version"]):
        raise _stale(name)
    desired = _with_stored_defaults(current, desired)
    try:
        pod = Pod.model_validate(desired)
    except ValidationError as exc:
        raise invalid("Pod", name, pydantic_causes(exc)) from exc
    causes = _resize_refusals(current, desired, pod)
    if causes:
        raise invalid("Pod", name, causes)
    if row["phase"] in TERMINAL_PHASES:
        raise Conflict(
            f'pod "{name}" has ended ({row["phase"]}): it holds no CPU or memory and cannot be '
            "resized; create a new pod with the resources you want",
            ref=ResourceRef("pods", name),
        )
    if row["deletion_timestamp"] is not None:
        raise Conflict(
            f'pod "{name}" is being deleted and cannot be resized', ref=ResourceRef("pods", name)
        )
    try:
        demand = resized_demand(pod, specs=context.specs, default_spec=context.default_spec)
    except AdmissionError as exc:
        raise invalid("Pod", name, exc.causes) from exc
    resources = [c.get("resources", {}) for c in stored_spec(pod)["containers"]]
    if _canonical(resources) == _canonical(_resources_of(row["spec"])):
        return current  # nothing asked that the pod does not already ask
    spec = dict(row["spec"])
    spec["containers"] = [
        {**container, "resources": new}
        for container, new in zip(row["spec"]["containers"], resources, strict=True)
    ]
    changes: dict[str, Any] = {"spec": spec, "generation": row["generation"] + 1}
    target = demand.spec
    at = now()
    if target is not None:  # a resize that grows the pod must fit its namespace's quotas
        counted = quotas.of_pod(row)
        grown = quotas.of_pod(
            {
                **row,
                "cpu_milli": target.cpu_milli,
                "memory_mib": target.memory_mib,
                "resize_cpu_milli": None,
                "resize_memory_mib": None,
            }
        )
        more = quotas.Usage(
            cpu=max(0, grown.cpu - counted.cpu), memory=max(0, grown.memory - counted.memory)
        )
        if more != quotas.Usage():
            quotas.check(
                session, namespace=namespace, pod=name, adds=more, tenant_id=row["tenant_id"]
            )
    if row["node_name"] is None:
        if target is None:
            raise invalid(
                "Pod",
                name,
                [Cause("spec.containers[*].resources", f"Invalid value: {demand.why}")],
            )
        changes.update(_sold_as(row, target))
        _, obj = _modify(session, row, changes)
        events.record(
            session,
            involved=_involved(row),
            reason="Resized",
            message=f"the pod now asks for {describe_rounding(demand)}; it is not placed yet, "
            "so the scheduler places the new size",
            tenant_id=row["tenant_id"],
            at=at,
        )
        return obj
    allocated = row["allocated_resources"] or {
        c["name"]: c.get("resources", {}) for c in row["spec"]["containers"]
    }
    node = inventory.get_node_row(session, row["node_name"])
    if target is not None and (target.cpu_milli, target.memory_mib) == _held(row):
        # Back to what the pod holds (a pending resize is withdrawn): nothing moves.
        changes.update(
            resize_cpu_milli=None,
            resize_memory_mib=None,
            allocated_resources=None,
            conditions=_without_resize_conditions(row["conditions"]),
        )
        return _modify(session, row, changes)[1]
    why_not = _never_fits(node, demand)
    if why_not is not None:
        changes.update(
            resize_cpu_milli=None,
            resize_memory_mib=None,
            allocated_resources=allocated,
            conditions=_set_condition(
                _without_resize_conditions(row["conditions"]),
                _condition(RESIZE_PENDING, "True", "Infeasible", why_not, at),
            ),
        )
        _, obj = _modify(session, row, changes)
        events.record(
            session,
            involved=_involved(row),
            reason="ResizeInfeasible",
            message=why_not,
            type="Warning",
            component="tessera-agent",
            tenant_id=row["tenant_id"],
            at=at,
        )
        return obj
    assert target is not None
    if inventory.resize(session, pod=row, cpu_milli=target.cpu_milli, memory_mib=target.memory_mib):
        return _resize_took_effect(session, row, changes, target, at=at)
    more_cpu = max(0, target.cpu_milli - row["cpu_milli"])
    more_memory = max(0, target.memory_mib - row["memory_mib"])
    deferred = (
        f"the node {node['name']} has {format_cpu(node['cpu_free_milli'])} vCPU / "
        f"{format_mib(node['memory_free_mib'])} free, and the resize to "
        f"{describe_rounding(demand)} needs {format_cpu(more_cpu)} vCPU / "
        f"{format_mib(more_memory)} more: it takes effect when the node has the room (when "
        "other pods on it end or shrink); until then the pod keeps its "
        f"{row['spec_name']}; resize again to ask for something else"
    )
    changes.update(
        resize_cpu_milli=target.cpu_milli,
        resize_memory_mib=target.memory_mib,
        allocated_resources=allocated,
        conditions=_set_condition(
            _without_resize_conditions(row["conditions"]),
            _condition(RESIZE_PENDING, "True", "Deferred", deferred, at),
        ),
    )
    return _modify(session, row, changes)[1]


def retry_resize(session: Session, *, uid: str) -> bool:
    """Give a `Deferred` resize the room it waits for, if its node has it now (the node agent
    calls this for the pods whose node has the room); False when nothing was done."""
    row = repository.get_by_uid(session, uid, for_update=True)
    if (
        row is None
        or row["resize_cpu_milli"] is None
        or not holds_capacity(row)
        or row["deletion_timestamp"] is not None
    ):
        return False
    target = ComputeSpec(row["resize_cpu_milli"], row["resize_memory_mib"])
    if not inventory.resize(
        session, pod=row, cpu_milli=target.cpu_milli, memory_mib=target.memory_mib
    ):
        return False
    _resize_took_effect(session, row, {}, target, at=now(), component="tessera-agent")
    return True


def _resize_took_effect(
    session: Session,
    row: Row,
    changes: dict[str, Any],
    target: ComputeSpec,
    *,
    at: datetime,
    component: str = "tessera-api",
) -> dict[str, Any]:
    """The node's capacity has moved: the pod holds `target` from `at`, billed from then."""
    before = row["spec_name"]
    changes = {
        **changes,
        **_sold_as(row, target),
        "resizes": row["resizes"] + 1,
        "resize_cpu_milli": None,
        "resize_memory_mib": None,
        "allocated_resources": None,
        "conditions": _without_resize_conditions(row["conditions"]),
    }
    updated, obj = _modify(session, row, changes)
    ledger.record(session, [ledger.resized(session, updated, at=at)], recorded_at=at)
    events.record(
        session,
        involved=_involved(row),
        reason="Resized",
        message=f"resized in place on {row['node_name']} from {before} to {target.name} "
        f"({format_cpu(target.cpu_milli)} vCPU / {format_mib(target.memory_mib)}), billed "
        "at the new spec from now",
        component=component,
        tenant_id=row["tenant_id"],
        at=at,
    )
    return obj


def _sold_as(row: Row, spec: ComputeSpec) -> dict[str, Any]:
    annotations = {**row["annotations"], ANNOTATION_POD_USE_SPEC: spec.name}
    return {
        "spec_name": spec.name,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
        "annotations": annotations,
    }


def _held(row: Row) -> tuple[int, int]:
    return row["cpu_milli"], row["memory_mib"]


def _never_fits(node: Row, demand: ResizedDemand) -> str | None:
    """Why the resize can never take effect on this node (None: it may, now or later)."""
    keeps = "the pod keeps what it holds; resize again to ask for less"
    if demand.spec is None:
        return f"{demand.why}: {keeps}"
    spec = demand.spec
    if (
        spec.cpu_milli > node["cpu_allocatable_milli"]
        or spec.memory_mib > node["memory_allocatable_mib"]
    ):
        return (
            f"the resize asks for {describe_rounding(demand)}, and the node {node['name']} can "
            f"give a pod at most {format_cpu(node['cpu_allocatable_milli'])} vCPU / "
            f"{format_mib(node['memory_allocatable_mib'])}: it can never fit there; {keeps}, "
            "or create a new pod of this size (the scheduler places it on a node that has it)"
        )
    return None


def _without_resize_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in conditions if c["type"] not in (RESIZE_PENDING, RESIZE_IN_PROGRESS)]


def _resources_of(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [c.get("resources", {}) for c in spec.get("containers", [])]


def _fixed_resources(spec: dict[str, Any], keep: Sequence[str]) -> dict[str, Any]:
    """`spec` with only the resources named in `keep` left in its containers' requests and
    limits (empty maps dropped): what must not differ between the pod and its resize."""
    containers = []
    for container in spec.get("containers", []):
        resources = {}
        for part, values in (container.get("resources") or {}).items():
            if part in ("requests", "limits") and isinstance(values, dict):
                values = {k: v for k, v in values.items() if k in keep}
                if not values:
                    continue
            resources[part] = values
        containers.append({**container, "resources": resources})
    return {**spec, "containers": containers}


def _resize_refusals(current: dict[str, Any], desired: dict[str, Any], pod: Pod) -> list[Cause]:
    """What a resize may not change, each with its field: anything but containers' cpu and
    memory (the status is ignored, as Kubernetes ignores it on this subresource)."""
    new_spec = _canonical(stored_spec(pod))
    old_spec = _canonical(dict(current["spec"]))
    names = [c["name"] for c in old_spec.get("containers", [])]
    unknown = [
        (i, c.get("name"))
        for i, c in enumerate(new_spec.get("containers", []))
        if c.get("name") not in names
    ]
    if unknown:  # a patch naming a container the pod has not (a merge patch adds it)
        return [
            Cause(
                f"spec.containers[{i}].name",
                f'Not found: "{name}": the pod has no container of that name; its containers '
                f"are {', '.join(names)} (name one of them in the resize)",
                "FieldValueNotFound",
            )
            for i, name in unknown
        ]
    causes = []
    everything_else = [k for k in _everything_named(old_spec, new_spec) if k not in RESIZABLE]
    old_gpu = _fixed_resources(old_spec, GPU_RESOURCES)["containers"]
    new_gpu = _fixed_resources(new_spec, GPU_RESOURCES)["containers"]
    if len(old_gpu) == len(new_gpu):
        for i, (a, b) in enumerate(zip(old_gpu, new_gpu, strict=True)):
            if a.get("resources") != b.get("resources"):
                causes.append(
                    Cause(f"spec.containers[{i}].resources", _GPU_FIXED, "FieldValueForbidden")
                )
    others = [k for k in everything_else if k not in GPU_RESOURCES]
    for path in _differences(
        _fixed_resources(old_spec, others), _fixed_resources(new_spec, others), "spec"
    )[:_MAX_CAUSES]:
        if not any(c.field == path for c in causes):
            causes.append(Cause(path, _RESIZE_ONLY, "FieldValueForbidden"))
    meta = section(desired, "metadata")
    old_meta = current["metadata"]
    for field in ("name", "namespace", "uid"):
        if meta.get(field) not in (None, old_meta[field]):
            causes.append(
                Cause(f"metadata.{field}", "Invalid value: field is immutable", "FieldValueInvalid")
            )
    for field in ("labels", "annotations", "finalizers", "ownerReferences"):
        if meta.get(field) is not None and meta.get(field) != old_meta.get(field):
            causes.append(Cause(f"metadata.{field}", _RESIZE_ONLY, "FieldValueForbidden"))
    return causes


def _everything_named(*specs: dict[str, Any]) -> set[str]:
    """Every resource name any container of these specs asks for."""
    return {
        name
        for spec in specs
        for container in spec.get("containers", [])
        for part in ("requests", "limits")
        for name in ((container.get("resources") or {}).get(part) or {})
    }


# A namespace's deletion deletes its pods through `delete` (gracefully: a bound pod is stopped by
# its node first), as it deletes each kind it holds through that kind's own delete.
namespaces.CONTENTS.append(
    namespaces.TableContents(
        repository.pods,
        lambda s, row: delete(s, namespace=row["namespace"], name=row["name"], grace_seconds=None),
    )
)
