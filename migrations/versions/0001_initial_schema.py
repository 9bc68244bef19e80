"""initial schema

Revision ID: 0001
Revises: (none)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSON documents: JSONB on PostgreSQL, JSON text on SQLite.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "changes",
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=63), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=True),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("object", JSON, nullable=False),
        sa.PrimaryKeyConstraint("resource_version", name=op.f("pk_changes")),
    )
    with op.batch_alter_table("changes", schema=None) as batch_op:
        batch_op.create_index("ix_changes_kind_rv", ["kind", "resource_version"], unique=False)

    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_counters")),
    )
    op.create_table(
        "gpu_models",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("vram_mib", sa.Integer(), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.CheckConstraint("sm_count > 0", name=op.f("ck_gpu_models_sm_positive")),
        sa.CheckConstraint("vram_mib > 0", name=op.f("ck_gpu_models_vram_positive")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_gpu_models")),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("unschedulable", sa.Boolean(), nullable=False),
        sa.Column("region", sa.String(length=63), nullable=False),
        sa.Column("zone", sa.String(length=63), nullable=False),
        sa.Column("rack", sa.String(length=63), nullable=False),
        sa.Column("compute_classes", sa.String(length=255), nullable=False),
        sa.Column("cpu_capacity_milli", sa.BigInteger(), nullable=False),
        sa.Column("cpu_allocatable_milli", sa.BigInteger(), nullable=False),
        sa.Column("cpu_free_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_capacity_mib", sa.BigInteger(), nullable=False),
        sa.Column("memory_allocatable_mib", sa.BigInteger(), nullable=False),
        sa.Column("memory_free_mib", sa.BigInteger(), nullable=False),
        sa.Column("numa_nodes", sa.Integer(), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.CheckConstraint(
            "cpu_allocatable_milli >= 0", name=op.f("ck_nodes_cpu_allocatable_nonneg")
        ),
        sa.CheckConstraint(
            "cpu_free_milli <= cpu_allocatable_milli", name=op.f("ck_nodes_cpu_free_le_allocatable")
        ),
        sa.CheckConstraint("cpu_free_milli >= 0", name=op.f("ck_nodes_cpu_free_nonneg")),
        sa.CheckConstraint(
            "memory_allocatable_mib >= 0", name=op.f("ck_nodes_memory_allocatable_nonneg")
        ),
        sa.CheckConstraint(
            "memory_free_mib <= memory_allocatable_mib",
            name=op.f("ck_nodes_memory_free_le_allocatable"),
        ),
        sa.CheckConstraint("memory_free_mib >= 0", name=op.f("ck_nodes_memory_free_nonneg")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
        sa.UniqueConstraint("uid", name=op.f("uq_nodes_uid")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_zone"), ["zone"], unique=False)

    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
        sa.UniqueConstraint("uid", name=op.f("uq_tenants_uid")),
    )
    op.create_table(
        "events",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("involved_kind", sa.String(length=63), nullable=False),
        sa.Column("involved_api_version", sa.String(length=63), nullable=False),
        sa.Column("involved_name", sa.String(length=253), nullable=False),
        sa.Column("involved_namespace", sa.String(length=63), nullable=True),
        sa.Column("involved_uid", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("component", sa.String(length=63), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_events_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_events_namespace_involved", ["namespace", "involved_name"], unique=False
        )
        batch_op.create_index("ix_events_tenant", ["tenant_id"], unique=False)

    op.create_table(
        "gpu_devices",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("vram_mib", sa.Integer(), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("numa_node", sa.Integer(), nullable=False),
        sa.Column("pcie_switch", sa.String(length=63), nullable=False),
        sa.Column("nvlink_domain", sa.String(length=127), nullable=False),
        sa.Column("rdma_nic", sa.String(length=63), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("vram_free_mib", sa.Integer(), nullable=False),
        sa.Column("core_free_pct", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "health IN ('Healthy', 'Unhealthy')", name=op.f("ck_gpu_devices_health_known")
        ),
        sa.CheckConstraint("core_free_pct <= 100", name=op.f("ck_gpu_devices_core_free_le_100")),
        sa.CheckConstraint("core_free_pct >= 0", name=op.f("ck_gpu_devices_core_free_nonneg")),
        sa.CheckConstraint(
            "vram_free_mib <= vram_mib", name=op.f("ck_gpu_devices_vram_free_le_total")
        ),
        sa.CheckConstraint("vram_free_mib >= 0", name=op.f("ck_gpu_devices_vram_free_nonneg")),
        sa.ForeignKeyConstraint(
            ["model"], ["gpu_models.name"], name=op.f("fk_gpu_devices_model_gpu_models")
        ),
        sa.ForeignKeyConstraint(
            ["node_name"],
            ["nodes.name"],
            name=op.f("fk_gpu_devices_node_name_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_gpu_devices")),
        sa.UniqueConstraint("node_name", "index", name="uq_gpu_devices_node_index"),
        sa.UniqueConstraint("uid", name=op.f("uq_gpu_devices_uid")),
    )
    op.create_table(
        "namespaces",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deletion_timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_namespaces_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_namespaces")),
        sa.UniqueConstraint("uid", name=op.f("uq_namespaces_uid")),
    )
    with op.batch_alter_table("namespaces", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_namespaces_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("description", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(role = 'admin' AND tenant_id IS NULL) OR (role = 'tenant' AND tenant_id IS NOT NULL)",
            name=op.f("ck_tokens_role_matches_tenant"),
        ),
        sa.CheckConstraint("role IN ('admin', 'tenant')", name=op.f("ck_tokens_role_known")),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_tokens_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("key_id", name=op.f("uq_tokens_key_id")),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "pods",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deletion_timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deletion_grace_seconds", sa.Integer(), nullable=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("meta_extra", JSON, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("spec_name", sa.String(length=32), nullable=False),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_mib", sa.Integer(), nullable=False),
        sa.Column("gpu_core_pct", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(length=63), nullable=True),
        sa.Column("compute_class", sa.String(length=32), nullable=False),
        sa.Column("qos", sa.String(length=32), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=True),
        sa.Column("conditions", JSON, nullable=False),
        sa.Column("status_reason", sa.String(length=64), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("bound_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "NOT (gpu_count > 0 AND gpu_memory_mib > 0)", name=op.f("ck_pods_slice_or_whole")
        ),
        sa.CheckConstraint("cpu_milli > 0", name=op.f("ck_pods_cpu_positive")),
        sa.CheckConstraint(
            "gpu_core_pct >= 0 AND gpu_core_pct <= 100", name=op.f("ck_pods_gpu_core_range")
        ),
        sa.CheckConstraint("gpu_count >= 0", name=op.f("ck_pods_gpu_count_nonneg")),
        sa.CheckConstraint("memory_mib > 0", name=op.f("ck_pods_memory_positive")),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_pods_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_name"], ["nodes.name"], name=op.f("fk_pods_node_name_nodes"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_pods_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_pods")),
        sa.UniqueConstraint("namespace", "name", name="uq_pods_namespace_name"),
    )
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.create_index("ix_pods_node_name", ["node_name"], unique=False)
        batch_op.create_index("ix_pods_phase", ["phase"], unique=False)
        batch_op.create_index(
            "ix_pods_tenant_namespace_name", ["tenant_id", "namespace", "name"], unique=False
        )

    op.create_table(
        "gpu_allocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pod_uid", sa.String(length=36), nullable=False),
        sa.Column("gpu_name", sa.String(length=253), nullable=False),
        sa.Column("vram_mib", sa.Integer(), nullable=False),
        sa.Column("core_pct", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "core_pct >= 0 AND core_pct <= 100", name=op.f("ck_gpu_allocations_core_range")
        ),
        sa.CheckConstraint("vram_mib >= 0", name=op.f("ck_gpu_allocations_vram_nonneg")),
        sa.ForeignKeyConstraint(
            ["gpu_name"],
            ["gpu_devices.name"],
            name=op.f("fk_gpu_allocations_gpu_name_gpu_devices"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["pod_uid"],
            ["pods.uid"],
            name=op.f("fk_gpu_allocations_pod_uid_pods"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_allocations")),
        sa.UniqueConstraint("pod_uid", "gpu_name", name="uq_gpu_allocations_pod_gpu"),
    )
    with op.batch_alter_table("gpu_allocations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_allocations_gpu_name"), ["gpu_name"], unique=False)

    counters = sa.table("counters", sa.column("name", sa.String), sa.column("value", sa.BigInteger))
    op.bulk_insert(counters, [{"name": "resource_version", "value": 0}])


def downgrade() -> None:
    with op.batch_alter_table("gpu_allocations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_allocations_gpu_name"))

    op.drop_table("gpu_allocations")
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_index("ix_pods_tenant_namespace_name")
        batch_op.drop_index("ix_pods_phase")
        batch_op.drop_index("ix_pods_node_name")

    op.drop_table("pods")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_tenant_id"))

    op.drop_table("tokens")
    with op.batch_alter_table("namespaces", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_namespaces_tenant_id"))

    op.drop_table("namespaces")
    op.drop_table("gpu_devices")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_tenant")
        batch_op.drop_index("ix_events_namespace_involved")

    op.drop_table("events")
    op.drop_table("tenants")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_zone"))

    op.drop_table("nodes")
    op.drop_table("gpu_models")
    op.drop_table("counters")
    with op.batch_alter_table("changes", schema=None) as batch_op:
        batch_op.drop_index("ix_changes_kind_rv")

    op.drop_table("changes")
