"""coordination.k8s.io/v1 Lease: a holder's claim, kept by renewing it.

A node agent keeps one in `kube-node-lease` named like its node (the control plane reads its
`renewTime` to tell a live node from a lost one, app/agent.py); the scheduler and the
controller manager elect their leaders through one in `kube-system` (app/leases/service.py).

Leases are kept in a table of their own (`leases`, `Strategy.table`): the spec's fields are
columns, which leader election locks and reads and the node loop reads without parsing JSON;
the rest of the object (annotations, finalizers, ownerReferences, managedFields, the spec's
other fields) is in its `body`. Every verb is the registry's. A renewal (an update that moves
only `spec.renewTime`, and what a holder's renewal rewrites with it) takes the store's lean
path (`Store.update`, `renewal`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from app.constants import COORDINATION_GROUP
from app.db.models import Lease as LeaseRow
from app.db.models import table
from app.errors import Cause
from app.kube.meta import KubeModel, ListMeta, ObjectMeta, micro_timestamp
from app.kube.tables import Column, age
from app.registry.strategy import Obj, Strategy

leases_t = table(LeaseRow)

# One year: longer than any heartbeat or leader term is a mistake, and bounds the arithmetic.
MAX_LEASE_SECONDS = 365 * 86400
# The spec's fields kept in columns: (column, field), as the API writes them in this order.
SPEC_COLUMNS = (
    ("holder_identity", "holderIdentity"),
    ("lease_duration_seconds", "leaseDurationSeconds"),
    ("lease_transitions", "leaseTransitions"),
)
TIMES = (("acquire_time", "acquireTime"), ("renew_time", "renewTime"))
OBJECT_KEYS = {"apiVersion", "kind", "metadata", "spec"}
# metadata an update keeps when it is left out (app/registry/store.py's SERVER_KEPT), and what
# the store sets whatever the update says
SERVER_KEPT = {"managedFields", "generateName", "resourceVersion"}


class LeaseSpec(KubeModel):
    holder_identity: str | None = Field(
        default=None, max_length=253, description="Who holds the lease (a node agent: its node)."
    )
    lease_duration_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LEASE_SECONDS,
        description="How long after renewTime the holder is presumed gone.",
    )
    acquire_time: str | None = Field(
        default=None, max_length=64, description="When the current holder took the lease."
    )
    renew_time: str | None = Field(
        default=None, max_length=64, description="When the holder last renewed it."
    )
    lease_transitions: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="How many times the holder changed."
    )
    preferred_holder: str | None = Field(default=None, max_length=253)
    strategy: str | None = Field(default=None, max_length=64)


class Lease(KubeModel):
    """A lease: a node's heartbeat (namespace kube-node-lease, named like the node), or a
    claim to leadership held by renewing it."""

    api_version: Literal["coordination.k8s.io/v1"] | None = "coordination.k8s.io/v1"
    kind: Literal["Lease"] | None = "Lease"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LeaseSpec = Field(default_factory=LeaseSpec)


class LeaseList(KubeModel):
    api_version: Literal["coordination.k8s.io/v1"] = "coordination.k8s.io/v1"
    kind: Literal["LeaseList"] = "LeaseList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Lease]


def parse_micro_time(text: str) -> datetime | None:
    """A MicroTime (any RFC 3339 time with its zone) in UTC; None when it is not one."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None or not 1970 <= at.year <= 9999:
        return None
    return at.astimezone(UTC)


def _duration(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LEASE_SECONDS
    )


def spec_of(row: Any) -> Obj:
    """The spec held in a row's columns, as the API writes it."""
    spec: Obj = {}
    for column, field in SPEC_COLUMNS:
        if row[column] is not None:
            spec[field] = row[column]
    for column, field in TIMES:
        if row[column] is not None:
            spec[field] = micro_timestamp(row[column])
    return spec


class LeaseStrategy(Strategy):
    kind = "Lease"
    resource = "leases"
    singular = "lease"
    group = COORDINATION_GROUP
    model = Lease
    list_model = LeaseList
    table = leases_t
    routes_first = True  # every node renews its Lease every 10 s
    summary = "a node agent: its own, in kube-node-lease"
    field_selectors = ("metadata.name", "metadata.namespace", "spec.holderIdentity")
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the lease.", 0),
        ("Holder", "string", "Who holds it (spec.holderIdentity).", 0),
        ("Age", "string", "Time since creation.", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        return [
            obj["metadata"]["name"],
            (obj.get("spec") or {}).get("holderIdentity") or "<none>",
            age(obj["metadata"].get("creationTimestamp")),
        ]

    def validate(self, obj: Obj) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = []
        for _, field in TIMES:
            text = spec.get(field)
            if text is not None and parse_micro_time(text) is None:
                causes.append(
                    Cause(
                        f"spec.{field}",
                        f'Invalid value: "{text[:64]}": write an RFC 3339 time with its zone, '
                        "like 2026-12-04T10:00:00.000000Z",
                    )
                )
        return causes

    def renewal(self, obj: Obj, old: Obj) -> dict[str, Any] | None:
        """A holder's renewal: a new spec.renewTime (and leaseDurationSeconds), the rest of the
        object as stored, as a node agent's heartbeat is (it sends back the lease it was given,
        its renewTime moved). A change of holder, labels, anything else: None."""
        if obj.keys() - OBJECT_KEYS:
            return None
        meta, was = obj.get("metadata") or {}, old["metadata"]
        for key, value in was.items():
            if key not in meta:
                if key not in SERVER_KEPT:
                    return None  # dropped: the update removes it
            elif key != "resourceVersion" and meta[key] != value:
                return None
        if meta.keys() - was.keys() - {"resourceVersion"}:
            return None
        spec, stored = obj.get("spec") or {}, old.get("spec") or {}
        if spec.keys() != stored.keys():
            return None
        columns: dict[str, Any] = {}
        for key, value in spec.items():
            if value == stored[key]:
                continue
            if key == "renewTime" and isinstance(value, str):
                at = parse_micro_time(value)
                if at is None:
                    return None  # the whole update says what is wrong with it
                columns["renew_time"] = at
            elif key == "leaseDurationSeconds" and _duration(value):
                columns["lease_duration_seconds"] = value
            else:
                return None
        return columns or None

    def to_row(self, body: Obj) -> tuple[Obj, dict[str, Any]]:
        spec = dict(body.get("spec") or {})
        columns: dict[str, Any] = {column: spec.pop(field, None) for column, field in SPEC_COLUMNS}
        for column, field in TIMES:
            text = spec.pop(field, None)
            columns[column] = None if text is None else parse_micro_time(text)
        kept = {k: v for k, v in body.items() if k != "spec"}
        if spec:
            kept["spec"] = spec
        return kept, columns

    def from_row(self, row: Any) -> Obj:
        body: Obj = row["body"] or {}
        spec = spec_of(row)
        extra = body.get("spec")
        if extra:
            spec.update(extra)
        return {**{k: v for k, v in body.items() if k != "spec"}, "spec": spec}
