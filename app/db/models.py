"""All ORM tables, in one place so Alembic sees one metadata.

Capacity is guarded by the database itself: every `*_free` column carries a CHECK constraint
(`>= 0` and `<=` its allocatable amount), and the bind path decrements it in the same transaction
that binds the pod. Two concurrent binds can never over-allocate a node or a GPU: the second one
fails its CHECK (or waits for the first one's row lock and then fails) and is reported as a
conflict.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every dialect (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")
# The change log's objects stay JSON text on PostgreSQL too: each is written once, read back
# whole by watches and never queried inside but by a path (`#>>`), so JSONB's parse on every
# insert and print on every read (about 15 and 5 µs for a pod) bought nothing.
LogJSONType = JSON()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
    }


class Counter(Base):
    """Store-wide counters. The row `resource_version` orders every write (and the watch log)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Tenant(Base):
    __tablename__ = "tenants"
    __table_args__ = (CheckConstraint("weight >= 1 AND weight <= 1000", name="weight_range"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), unique=True, nullable=False)
    uid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    # The Tenant object's spec: `quota.hard` and `spendLimits` (the admin's), `budget` (the
    # tenant's own); see app/budgets. NULL: nothing set.
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    # Fair share: the tenant's dominant share is divided by this when the pool is contended
    # (a tenant of weight 2 is entitled to twice the share of one of weight 1). The admin's.
    weight: Mapped[int] = mapped_column(
        Integer, nullable=False, default=1, server_default=text("1")
    )


class Token(Base):
    """An API token. Only a SHA-256 of its secret is stored; `key_id` finds the row."""

    __tablename__ = "tokens"
    __table_args__ = (
        CheckConstraint("role IN ('admin', 'tenant', 'node', 'controller')", name="role_known"),
        CheckConstraint(
            "(role IN ('admin', 'controller') AND tenant_id IS NULL AND node_name IS NULL) OR "
            "(role = 'tenant' AND tenant_id IS NOT NULL AND node_name IS NULL) OR "
            "(role = 'node' AND tenant_id IS NULL AND node_name IS NOT NULL)",
            name="role_matches_tenant",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True, nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    # A node token acts for this node only (its agent); no foreign key: a token may be made
    # before its agent registers the node.
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    description: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Namespace(Base):
    __tablename__ = "namespaces"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    deletion_timestamp: Mapped[datetime | None] = mapped_column(nullable=True)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)


class GPUModel(Base):
    """The catalogue of GPU models the pool has held: validates slice sizes."""

    __tablename__ = "gpu_models"
    __table_args__ = (
        CheckConstraint("vram_mib > 0", name="vram_positive"),
        CheckConstraint("sm_count > 0", name="sm_positive"),
    )

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    vram_mib: Mapped[int] = mapped_column(Integer, nullable=False)
    sm_count: Mapped[int] = mapped_column(Integer, nullable=False)


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (
        CheckConstraint("cpu_allocatable_milli >= 0", name="cpu_allocatable_nonneg"),
        CheckConstraint("cpu_free_milli >= 0", name="cpu_free_nonneg"),
        CheckConstraint("cpu_free_milli <= cpu_allocatable_milli", name="cpu_free_le_allocatable"),
        CheckConstraint("memory_allocatable_mib >= 0", name="memory_allocatable_nonneg"),
        CheckConstraint("memory_free_mib >= 0", name="memory_free_nonneg"),
        CheckConstraint(
            "memory_free_mib <= memory_allocatable_mib", name="memory_free_le_allocatable"
        ),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    # Indexed, as the pods' and GPUs' are: the scheduler reads what changed since its last cycle.
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    unschedulable: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    region: Mapped[str] = mapped_column(String(63), nullable=False, default="")
    zone: Mapped[str] = mapped_column(String(63), nullable=False, default="", index=True)
    rack: Mapped[str] = mapped_column(String(63), nullable=False, default="")
    compute_classes: Mapped[str] = mapped_column(String(255), nullable=False)
    cpu_capacity_milli: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cpu_allocatable_milli: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cpu_free_milli: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_capacity_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_allocatable_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_free_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    numa_nodes: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    ready: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    # Set while an agent-managed node's Lease has expired (Ready=Unknown, NodeStatusUnknown).
    lost_since: Mapped[datetime | None] = mapped_column(nullable=True)


class GPUDevice(Base):
    __tablename__ = "gpu_devices"
    __table_args__ = (
        UniqueConstraint("node_name", "index", name="uq_gpu_devices_node_index"),
        CheckConstraint("health IN ('Healthy', 'Unhealthy')", name="health_known"),
        CheckConstraint("vram_free_mib >= 0", name="vram_free_nonneg"),
        CheckConstraint("vram_free_mib <= vram_mib", name="vram_free_le_total"),
        CheckConstraint("core_free_pct >= 0", name="core_free_nonneg"),
        CheckConstraint("core_free_pct <= 100", name="core_free_le_100"),
    )

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    node_name: Mapped[str] = mapped_column(
        ForeignKey("nodes.name", ondelete="CASCADE"), nullable=False
    )
    index: Mapped[int] = mapped_column(Integer, nullable=False)
    model: Mapped[str] = mapped_column(ForeignKey("gpu_models.name"), nullable=False)
    vram_mib: Mapped[int] = mapped_column(Integer, nullable=False)
    sm_count: Mapped[int] = mapped_column(Integer, nullable=False)
    numa_node: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    pcie_switch: Mapped[str] = mapped_column(String(63), nullable=False, default="")
    nvlink_domain: Mapped[str] = mapped_column(String(127), nullable=False, default="")
    rdma_nic: Mapped[str] = mapped_column(String(63), nullable=False, default="")
    # NVML's UUID ("GPU-..."; "" when not known, as on virtual nodes): what a container is
    # given the GPU by
    uuid: Mapped[str] = mapped_column(
        String(96), nullable=False, default="", server_default=text("''")
    )
    health: Mapped[str] = mapped_column(String(16), nullable=False, default="Healthy")
    # Device taints, as KEP-5055 names them: [{key, value, effect, timeAdded}]; a fault is a
    # NoExecute taint, a drain a NoSchedule one. Either keeps new fragments off the GPU.
    taints: Mapped[list[Any]] = mapped_column(
        nullable=False, default=list, server_default=text("'[]'")
    )
    # The last faults, newest last (bounded): [{kind, xid, message, time, repairedTime}].
    faults: Mapped[list[Any]] = mapped_column(
        nullable=False, default=list, server_default=text("'[]'")
    )
    vram_free_mib: Mapped[int] = mapped_column(Integer, nullable=False)
    core_free_pct: Mapped[int] = mapped_column(Integer, nullable=False)


class Pod(Base):
    __tablename__ = "pods"
    __table_args__ = (
        UniqueConstraint("namespace", "name", name="uq_pods_namespace_name"),
        Index("ix_pods_tenant_namespace_name", "tenant_id", "namespace", "name"),
        Index("ix_pods_node_name", "node_name"),
        Index("ix_pods_phase", "phase"),
        # Partial: only the few pods with the column set are in these (what the node loop looks
        # for every half second), so a pass costs nothing with many pods, nor does a write.
        Index(
            "ix_pods_disruption_deadline",
            "disruption_deadline",
            postgresql_where=text("disruption_deadline IS NOT NULL"),
            sqlite_where=text("disruption_deadline IS NOT NULL"),
        ),
        Index(
            "ix_pods_deletion_timestamp",
            "deletion_timestamp",
            postgresql_where=text("deletion_timestamp IS NOT NULL"),
            sqlite_where=text("deletion_timestamp IS NOT NULL"),
        ),
        Index(  # the Deferred resizes
            "ix_pods_resize_cpu_milli",
            "resize_cpu_milli",
            postgresql_where=text("resize_cpu_milli IS NOT NULL"),
            sqlite_where=text("resize_cpu_milli IS NOT NULL"),
        ),
        Index("ix_pods_resource_version", "resource_version"),  # what changed since (scheduler)
        Index(  # a gang's members (the scheduler, every cycle with one); the others not in it
            "ix_pods_namespace_pod_group",
            "namespace",
            "pod_group",
            postgresql_where=text("pod_group IS NOT NULL"),
            sqlite_where=text("pod_group IS NOT NULL"),
        ),
        CheckConstraint("cpu_milli > 0", name="cpu_positive"),
        CheckConstraint("memory_mib > 0", name="memory_positive"),
        CheckConstraint("gpu_count >= 0", name="gpu_count_nonneg"),
        CheckConstraint("gpu_core_pct >= 0 AND gpu_core_pct <= 100", name="gpu_core_range"),
        CheckConstraint("NOT (gpu_count > 0 AND gpu_memory_mib > 0)", name="slice_or_whole"),
    )

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    namespace: Mapped[str] = mapped_column(
        ForeignKey("namespaces.name", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    generation: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    deletion_timestamp: Mapped[datetime | None] = mapped_column(nullable=True)
    deletion_grace_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    meta_extra: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(nullable=False)
    # What the pod was sold: the rounded spec (e.g. "2-4Gi") and its amounts.
    spec_name: Mapped[str] = mapped_column(String(32), nullable=False)
    cpu_milli: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    gpu_memory_mib: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    gpu_core_pct: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    gpu_model: Mapped[str | None] = mapped_column(String(63), nullable=True)
    compute_class: Mapped[str] = mapped_column(String(32), nullable=False)
    qos: Mapped[str] = mapped_column(String(32), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    pod_group: Mapped[str | None] = mapped_column(String(253), nullable=True)
    # Status.
    phase: Mapped[str] = mapped_column(String(16), nullable=False)
    node_name: Mapped[str | None] = mapped_column(
        ForeignKey("nodes.name", ondelete="SET NULL"), nullable=True
    )
    conditions: Mapped[list[Any]] = mapped_column(nullable=False, default=list)
    status_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    start_time: Mapped[datetime | None] = mapped_column(nullable=True)
    # The containers' states as the pod's node agent reports them (None: Tessera derives them).
    container_statuses: Mapped[list[Any] | None] = mapped_column(nullable=True)
    init_container_statuses: Mapped[list[Any] | None] = mapped_column(nullable=True)
    pod_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    bound_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Preemption chose this node for the pending pod and is freeing it (cleared by the bind).
    nominated_node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    # A BestEffort pod preempted for a regular one stops (Failed, or requeued) at this time.
    disruption_deadline: Mapped[datetime | None] = mapped_column(nullable=True)
    # In-place resize (`pods/resize`): the sold spec a Deferred resize waits to take (NULL: none
    # waits), each container's resources as the node holds them while a resize is pending
    # (Deferred or Infeasible; the spec shows the new ones), and how many resizes took effect.
    resize_cpu_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    resize_memory_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allocated_resources: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    resizes: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    # The top of its chain of controllers, "Kind/name" (app/workloads.py); None: none owns it.
    workload: Mapped[str | None] = mapped_column(String(320), nullable=True)


class PodGroup(Base):
    """What the scheduler reads of a PodGroup (of either API group), beside its object in
    `objects` (app/registry/kinds/podgroups.py), and what the scheduler writes of it: a gang of
    the pods labelled with its name, placed all together or not at all, optionally inside one
    topology domain. Written with the object (created, and rewritten with every change of it),
    and gone with it (ON DELETE CASCADE)."""

    __tablename__ = "pod_groups"
    __table_args__ = (
        # A pod's label names its gang by name alone: a name is unique per namespace across
        # both API groups.
        UniqueConstraint("namespace", "name", name="uq_pod_groups_namespace_name"),
        CheckConstraint("min_member >= 1", name="min_member_positive"),
    )

    uid: Mapped[str] = mapped_column(
        String(36), ForeignKey("objects.uid", ondelete="CASCADE"), primary_key=True
    )
    namespace: Mapped[str] = mapped_column(String(63), nullable=False)
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    # Which API group declared it (tessera.io, or scheduling.x-k8s.io for a coscheduling
    # PodGroup).
    api_group: Mapped[str] = mapped_column(String(63), nullable=False)
    min_member: Mapped[int] = mapped_column(Integer, nullable=False)
    required_topology: Mapped[str | None] = mapped_column(String(16), nullable=True)
    preferred_topology: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # scheduling.x-k8s.io only: spec.scheduleTimeoutSeconds, when the scheduler first tried
    # the complete gang, and why it gave up (its status shows them).
    schedule_timeout_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    scheduling_since: Mapped[datetime | None] = mapped_column(nullable=True)
    failed_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Lease(Base):
    """A coordination.k8s.io Lease: a node's heartbeat in `kube-node-lease` (named like the
    node), or any other holder's claim (leader election).

    Kept by the registry's store (app/registry/kinds/leases.py) in this table of its own, with
    the columns of `objects` but the kind's; the spec's fields are columns (leader election
    locks the row and reads them, the node loop reads renewTime), and `body` holds the rest of
    the object (annotations, finalizers, ownerReferences, managedFields, the spec's other
    fields)."""

    __tablename__ = "leases"
    __table_args__ = (UniqueConstraint("namespace", "name", name="uq_leases_namespace_name"),)

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    namespace: Mapped[str] = mapped_column(
        ForeignKey("namespaces.name", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    deletion_timestamp: Mapped[datetime | None] = mapped_column(nullable=True)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    body: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    holder_identity: Mapped[str | None] = mapped_column(String(253), nullable=True)
    lease_duration_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    acquire_time: Mapped[datetime | None] = mapped_column(nullable=True)
    renew_time: Mapped[datetime | None] = mapped_column(nullable=True)
    lease_transitions: Mapped[int | None] = mapped_column(Integer, nullable=True)


class GPUAllocation(Base):
    """The part of one GPU that one pod holds."""

    __tablename__ = "gpu_allocations"
    __table_args__ = (
        UniqueConstraint("pod_uid", "gpu_name", name="uq_gpu_allocations_pod_gpu"),
        CheckConstraint("vram_mib >= 0", name="vram_nonneg"),
        CheckConstraint("core_pct >= 0 AND core_pct <= 100", name="core_range"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pod_uid: Mapped[str] = mapped_column(ForeignKey("pods.uid", ondelete="CASCADE"), nullable=False)
    gpu_name: Mapped[str] = mapped_column(
        ForeignKey("gpu_devices.name", ondelete="CASCADE"), nullable=False, index=True
    )
    vram_mib: Mapped[int] = mapped_column(Integer, nullable=False)
    core_pct: Mapped[int] = mapped_column(Integer, nullable=False)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_namespace_involved", "namespace", "involved_name"),
        Index("ix_events_tenant", "tenant_id"),
        # Events are only inserted: their table is their own change log, read by version.
        Index("ix_events_resource_version", "resource_version"),
    )

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(63), nullable=False)
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    involved_kind: Mapped[str] = mapped_column(String(63), nullable=False)
    involved_api_version: Mapped[str] = mapped_column(String(63), nullable=False)
    involved_name: Mapped[str] = mapped_column(String(253), nullable=False)
    involved_namespace: Mapped[str | None] = mapped_column(String(63), nullable=True)
    involved_uid: Mapped[str] = mapped_column(String(36), nullable=False)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(String(128), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    component: Mapped[str] = mapped_column(String(63), nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    first_timestamp: Mapped[datetime] = mapped_column(nullable=False)
    last_timestamp: Mapped[datetime] = mapped_column(nullable=False)


class Change(Base):
    """The change log: one row per write of a watchable object, keyed by resourceVersion.

    Watches are served from here; the newest `watch_log_retention` rows are kept.
    """

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_kind_rv", "kind", "resource_version"),)

    resource_version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(63), nullable=False)
    namespace: Mapped[str | None] = mapped_column(String(63), nullable=True)
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    object: Mapped[dict[str, Any]] = mapped_column(LogJSONType, nullable=False)
    # MODIFIED only: the object before the write, when its labels or selectable fields changed
    # (a watch with a selector then sees it start or stop matching: ADDED or DELETED).
    previous: Mapped[dict[str, Any] | None] = mapped_column(LogJSONType, nullable=True)


class StoredObject(Base):
    """An object of a kind the generic registry keeps (app/registry): ConfigMaps, Secrets,
    Callbacks and the rest of app/registry/kinds.

    The columns are what lists select and order on; `body` is the rest of the object as its
    strategy stores it (a Secret's data sealed). `namespace` is "" for a cluster-scoped kind.
    Objects are deleted through their store (never by a cascade), so watchers see every
    deletion; rows of other tables that belong to one object (a Callback's secret and
    deliveries) go with it by ON DELETE CASCADE.
    """

    __tablename__ = "objects"
    __table_args__ = (
        UniqueConstraint("api_group", "resource", "namespace", "name", name="uq_objects_key"),
        Index("ix_objects_tenant", "api_group", "resource", "tenant_id"),
    )

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    api_group: Mapped[str] = mapped_column(String(63), nullable=False)
    resource: Mapped[str] = mapped_column(String(63), nullable=False)
    namespace: Mapped[str] = mapped_column(String(63), nullable=False)
    name: Mapped[str] = mapped_column(String(253), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    deletion_timestamp: Mapped[datetime | None] = mapped_column(nullable=True)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    body: Mapped[dict[str, Any]] = mapped_column(nullable=False)


# --- billing ---------------------------------------------------------------------------------


class UsageEvent(Base):
    """The usage ledger: append-only, one row per transition that starts, changes or stops
    billing. The id is deterministic (`<pod uid>/<kind>/<seq>`), so a repeated write is ignored.
    Segments, totals and statements are derived from these rows; nothing here is ever updated.

    No foreign keys: usage outlives the pod, its namespace and its node."""

    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_events_tenant_at", "tenant_id", "at"),
        Index("ix_usage_events_pod_at", "pod_uid", "at"),
        Index("ix_usage_events_recorded_at", "recorded_at"),
        Index("ix_usage_events_tenant_recorded_at", "tenant_id", "recorded_at"),
        CheckConstraint(
            "kind IN ('start', 'change', 'pause', 'resume', 'stop')", name="kind_known"
        ),
        CheckConstraint("seq >= 0", name="seq_nonneg"),
        CheckConstraint("cpu_milli >= 0", name="cpu_nonneg"),
        CheckConstraint("memory_mib >= 0", name="memory_nonneg"),
        CheckConstraint("gpu_vram_mib >= 0", name="gpu_vram_nonneg"),
        CheckConstraint("gpu_core_pct >= 0", name="gpu_core_nonneg"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    pod_uid: Mapped[str] = mapped_column(String(36), nullable=False)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    namespace: Mapped[str] = mapped_column(String(63), nullable=False)
    pod_name: Mapped[str] = mapped_column(String(253), nullable=False)
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    reason: Mapped[str] = mapped_column(String(32), nullable=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    at: Mapped[datetime] = mapped_column(nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(nullable=False)
    node_name: Mapped[str | None] = mapped_column(String(253), nullable=True)
    compute_class: Mapped[str] = mapped_column(String(32), nullable=False)
    qos: Mapped[str] = mapped_column(String(32), nullable=False)
    gpu_model: Mapped[str | None] = mapped_column(String(63), nullable=True)
    cpu_milli: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    gpu_vram_mib: Mapped[int] = mapped_column(BigInteger, nullable=False)
    gpu_core_pct: Mapped[int] = mapped_column(Integer, nullable=False)
    # The pod's workload when the event was written ("Kind/name"; None: no controller owns it).
    workload: Mapped[str | None] = mapped_column(String(320), nullable=True)


class UsageHour(Base):
    """Hourly rollups of the usage ledger: per tenant, hour, namespace, workload and rate key (what
    a second costs), the unit-seconds held. Derived from `usage_events` by `billing.ledger.roll_up`
    and rebuilt from them whenever a late event reaches back into a rolled hour; never the truth.
    Empty strings stand for "no GPU model", "before the first price" and "no workload"."""

    __tablename__ = "usage_hours"

    tenant_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    namespace: Mapped[str] = mapped_column(String(63), primary_key=True)
    workload: Mapped[str] = mapped_column(String(320), primary_key=True)
    compute_class: Mapped[str] = mapped_column(String(32), primary_key=True)
    qos: Mapped[str] = mapped_column(String(32), primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(63), primary_key=True)
    price: Mapped[str] = mapped_column(String(63), primary_key=True)
    gpu: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    cpu_milli_s: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_mib_s: Mapped[int] = mapped_column(BigInteger, nullable=False)
    vram_mib_s: Mapped[int] = mapped_column(BigInteger, nullable=False)
    core_pct_s: Mapped[int] = mapped_column(BigInteger, nullable=False)


class UsageRollup(Base):
    """How far a tenant's hourly rollups reach: every hour before `rolled_until` was computed
    from the events as they stood at `computed_at`."""

    __tablename__ = "usage_rollups"

    tenant_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rolled_until: Mapped[datetime] = mapped_column(nullable=False)
    computed_at: Mapped[datetime] = mapped_column(nullable=False)


class UsageHeartbeat(Base):
    """The last time each node was known to hold its pods: where reconciliation closes the usage
    of a pod that vanished while the control plane was down."""

    __tablename__ = "usage_heartbeats"

    node_name: Mapped[str] = mapped_column(String(253), primary_key=True)
    at: Mapped[datetime] = mapped_column(nullable=False)
    # An agent-managed node's lease renewTime as the node loop last saw it (the node's clock):
    # a restarted node loop compares the next renewal with it to find a silence it did not see.
    renewed: Mapped[datetime | None] = mapped_column(nullable=True)


class BillingCredit(Base):
    """An operator's credit of a window of time (an outage) to one tenant or every tenant
    (`tessera billing credit`): append-only, never edited; statements show it as a line."""

    __tablename__ = "billing_credits"
    __table_args__ = (
        Index("ix_billing_credits_end", "end_at"),
        CheckConstraint("end_at > start_at", name="window_forward"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: every tenant
    start_at: Mapped[datetime] = mapped_column(nullable=False)
    end_at: Mapped[datetime] = mapped_column(nullable=False)
    reason: Mapped[str] = mapped_column(String(256), nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(nullable=False)


class PriceVersion(Base):
    """One version of the price book (`billing.tessera.io/v1` Price). Immutable once written."""

    __tablename__ = "prices"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    effective_from: Mapped[datetime] = mapped_column(unique=True, nullable=False)
    labels: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(nullable=False, default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(nullable=False)


class Commitment(Base):
    """Beside a Commitment object of the registry (`objects`, keyed by its uid): its tenant,
    whose one plan it is (the unique tenant_id keeps it one), and its amount per day in minor
    units (app/registry/kinds/commitments.py). Its amounts over time are the append-only
    `commitment_terms`, which billing rates with."""

    __tablename__ = "commitments"
    __table_args__ = (CheckConstraint("amount_minor > 0", name="amount_positive"),)

    uid: Mapped[str] = mapped_column(
        String(36), ForeignKey("objects.uid", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), unique=True, nullable=False
    )
    amount_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)


class CommitmentTerm(Base):
    """From `effective_day` on, the tenant commits `amount_minor` per UTC day (0: no plan).
    The latest row (highest id) for a day wins."""

    __tablename__ = "commitment_terms"
    __table_args__ = (
        Index("ix_commitment_terms_tenant_day", "tenant_id", "effective_day"),
        CheckConstraint("amount_minor >= 0", name="amount_nonneg"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(Integer, nullable=False)
    effective_day: Mapped[date] = mapped_column(Date, nullable=False)
    amount_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(nullable=False)


class Statement(Base):
    """A tenant's closed daily statement: final, never updated (late usage becomes an
    adjustment line on a later statement)."""

    __tablename__ = "statements"
    __table_args__ = (UniqueConstraint("tenant_id", "day", name="uq_statements_tenant_day"),)

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(Integer, nullable=False)
    tenant: Mapped[str] = mapped_column(String(63), nullable=False)
    day: Mapped[date] = mapped_column(Date, nullable=False)
    resource_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    closed_at: Mapped[datetime] = mapped_column(nullable=False)
    currency: Mapped[str] = mapped_column(String(3), nullable=False)
    total_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    lines: Mapped[list[Any]] = mapped_column(nullable=False)


class TenantSpend(Base):
    """What a tenant's statements come to so far today and this month (UTC), as the ledger
    rates them: the meter of its spend limits, recomputed by the node loop's housekeeping so
    a pod's create reads one row instead of rating the ledger."""

    __tablename__ = "tenant_spend"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[date] = mapped_column(Date, nullable=False)
    day_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    month_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    currency: Mapped[str] = mapped_column(String(3), nullable=False)
    minor_digits: Mapped[int] = mapped_column(Integer, nullable=False)
    computed_at: Mapped[datetime] = mapped_column(nullable=False)


class BudgetAlert(Base):
    """A threshold of a tenant's budget its spend crossed in a period: one row each, so each
    crossing is told (an Event and a callback) once."""

    __tablename__ = "budget_alerts"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    period: Mapped[str] = mapped_column(String(8), primary_key=True)  # daily | monthly
    period_start: Mapped[date] = mapped_column(Date, primary_key=True)
    threshold: Mapped[int] = mapped_column(Integer, primary_key=True)  # percent
    spent_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    limit_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    at: Mapped[datetime] = mapped_column(nullable=False)


# --- callbacks -------------------------------------------------------------------------------


class CallbackSecret(Base):
    """A Callback's signing secret (the Callback itself is an object of the registry, in
    `objects`). HMAC needs the secret, so it is kept; it is never served back but in the answer
    that makes it (a create, a rotate), and never in the change log. Goes with its Callback."""

    __tablename__ = "callback_secrets"

    callback_uid: Mapped[str] = mapped_column(
        ForeignKey("objects.uid", ondelete="CASCADE"), primary_key=True
    )
    secret: Mapped[str] = mapped_column(String(128), nullable=False)
    rotated_at: Mapped[datetime] = mapped_column(nullable=False)


class CallbackDelivery(Base):
    """The outbox: one row per event and subscribed callback, written in the transaction of the
    transition that caused it and sent after commit by the delivery worker. (callback_uid,
    event_id) is unique: the same event emitted twice is delivered once."""

    __tablename__ = "callback_deliveries"
    __table_args__ = (
        UniqueConstraint("callback_uid", "event_id", name="uq_callback_deliveries_callback_event"),
        Index("ix_callback_deliveries_status_next", "status", "next_attempt_at"),
        Index("ix_callback_deliveries_callback_created", "callback_uid", "created_at"),
        CheckConstraint("status IN ('Pending', 'Delivered', 'Failed')", name="status_known"),
        CheckConstraint("attempts >= 0", name="attempts_nonneg"),
    )

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    callback_uid: Mapped[str] = mapped_column(
        ForeignKey("objects.uid", ondelete="CASCADE"), nullable=False
    )
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    event_id: Mapped[str] = mapped_column(String(36), nullable=False)
    type: Mapped[str] = mapped_column(String(64), nullable=False)
    subject: Mapped[str] = mapped_column(String(512), nullable=False)
    at: Mapped[datetime] = mapped_column(nullable=False)
    data: Mapped[dict[str, Any]] = mapped_column(nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(nullable=False)
    # A worker sending this delivery holds it until then (several API processes share the outbox).
    lease_until: Mapped[datetime | None] = mapped_column(nullable=True)
    last_attempt_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    response_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(nullable=True)


class PodLogLine(Base):
    """A line a node agent wrote for one run of a container (app/pods/logs.py's store): only
    the current and the previous run of each container are kept, each up to a cap of lines and
    bytes (oldest dropped), and they go with the pod (ON DELETE CASCADE)."""

    __tablename__ = "pod_log_lines"
    __table_args__ = (Index("ix_pod_log_lines_run", "pod_uid", "container", "run", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pod_uid: Mapped[str] = mapped_column(ForeignKey("pods.uid", ondelete="CASCADE"), nullable=False)
    container: Mapped[str] = mapped_column(String(63), nullable=False)
    run: Mapped[int] = mapped_column(Integer, nullable=False)  # the container's restart count
    at: Mapped[datetime] = mapped_column(nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    size: Mapped[int] = mapped_column(Integer, nullable=False)  # bytes of text, UTF-8


class ResourceUsage(Base):
    """What a node's agent last reported of its resource usage and its pods' (`kubectl top`,
    app/resourcemetrics): one row per node, replaced at every report."""

    __tablename__ = "resource_usage"

    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    reported_at: Mapped[datetime] = mapped_column(nullable=False)
    window_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    body: Mapped[dict[str, Any]] = mapped_column(JSONType, nullable=False)


def table(model: type[Base]) -> Table:
    """The Core table of a model, for statements on hot paths (no ORM unit of work)."""
    return cast(Table, model.__table__)
