"""Hourly usage rollups: a derived, rebuildable cache of the usage ledger per tenant and hour,
so a report over closed hours does not read every event.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_hours",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("compute_class", sa.String(32), nullable=False),
        sa.Column("qos", sa.String(32), nullable=False),
        sa.Column("gpu_model", sa.String(63), nullable=False),
        sa.Column("price", sa.String(63), nullable=False),
        sa.Column("gpu", sa.Boolean(), nullable=False),
        sa.Column("cpu_milli_s", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib_s", sa.BigInteger(), nullable=False),
        sa.Column("vram_mib_s", sa.BigInteger(), nullable=False),
        sa.Column("core_pct_s", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id",
            "hour",
            "namespace",
            "compute_class",
            "qos",
            "gpu_model",
            "price",
            "gpu",
        ),
    )
    op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("rolled_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.create_index("ix_usage_events_tenant_recorded_at", ["tenant_id", "recorded_at"])


def downgrade() -> None:
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_events_tenant_recorded_at")
    op.drop_table("usage_rollups")
    op.drop_table("usage_hours")
