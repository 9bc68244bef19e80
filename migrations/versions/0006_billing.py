"""Billing: the usage ledger, node heartbeats for reconciliation, the price book, commitment
plans and closed statements.

Revision ID: 0006
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_events",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("pod_uid", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_name", sa.String(253), nullable=True),
        sa.Column("compute_class", sa.String(32), nullable=False),
        sa.Column("qos", sa.String(32), nullable=False),
        sa.Column("gpu_model", sa.String(63), nullable=True),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpu_vram_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpu_core_pct", sa.Integer(), nullable=False),
        sa.CheckConstraint("kind IN ('start', 'change', 'stop')", name="kind_known"),
        sa.CheckConstraint("seq >= 0", name="seq_nonneg"),
        sa.CheckConstraint("cpu_milli >= 0", name="cpu_nonneg"),
        sa.CheckConstraint("memory_mib >= 0", name="memory_nonneg"),
        sa.CheckConstraint("gpu_vram_mib >= 0", name="gpu_vram_nonneg"),
        sa.CheckConstraint("gpu_core_pct >= 0", name="gpu_core_nonneg"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_usage_events_tenant_at", "usage_events", ["tenant_id", "at"])
    op.create_index("ix_usage_events_pod_at", "usage_events", ["pod_uid", "at"])
    op.create_index("ix_usage_events_recorded_at", "usage_events", ["recorded_at"])
    op.create_table(
        "usage_heartbeats",
        sa.Column("node_name", sa.String(253), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node_name"),
    )
    op.create_table(
        "prices",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("uid"),
        sa.UniqueConstraint("effective_from"),
    )
    op.create_table(
        "commitments",
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("amount_minor > 0", name="amount_positive"),
        sa.ForeignKeyConstraint(["namespace"], ["namespaces.name"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("uid"),
        sa.UniqueConstraint("namespace", "name", name="uq_commitments_namespace_name"),
        sa.UniqueConstraint("tenant_id"),
    )
    op.create_table(
        "commitment_terms",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("effective_day", sa.Date(), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("amount_minor >= 0", name="amount_nonneg"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_commitment_terms_tenant_day", "commitment_terms", ["tenant_id", "effective_day"]
    )
    op.create_table(
        "statements",
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("total_minor", sa.BigInteger(), nullable=False),
        sa.Column("lines", JSON, nullable=False),
        sa.PrimaryKeyConstraint("uid"),
        sa.UniqueConstraint("tenant_id", "day", name="uq_statements_tenant_day"),
    )


def downgrade() -> None:
    op.drop_table("statements")
    op.drop_index("ix_commitment_terms_tenant_day", table_name="commitment_terms")
    op.drop_table("commitment_terms")
    op.drop_table("commitments")
    op.drop_table("prices")
    op.drop_table("usage_heartbeats")
    op.drop_index("ix_usage_events_recorded_at", table_name="usage_events")
    op.drop_index("ix_usage_events_pod_at", table_name="usage_events")
    op.drop_index("ix_usage_events_tenant_at", table_name="usage_events")
    op.drop_table("usage_events")
