"""Tenant callbacks (webhooks) and their delivery outbox.

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "callbacks",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", JSON, nullable=False),
        sa.Column("description", sa.String(length=1024), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("secret_rotated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_callbacks_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_callbacks_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_callbacks")),
        sa.UniqueConstraint("namespace", "name", name="uq_callbacks_namespace_name"),
    )
    with op.batch_alter_table("callbacks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_callbacks_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "callback_deliveries",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("callback_uid", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=512), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=1024), nullable=True),
        sa.Column("response_code", sa.Integer(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('Pending', 'Delivered', 'Failed')",
            name=op.f("ck_callback_deliveries_status_known"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_callback_deliveries_attempts_nonneg")),
        sa.ForeignKeyConstraint(
            ["callback_uid"],
            ["callbacks.uid"],
            name=op.f("fk_callback_deliveries_callback_uid_callbacks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_callback_deliveries")),
        sa.UniqueConstraint(
            "callback_uid", "event_id", name="uq_callback_deliveries_callback_event"
        ),
    )
    with op.batch_alter_table("callback_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_callback_deliveries_status_next", ["status", "next_attempt_at"], unique=False
        )
        batch_op.create_index(
            "ix_callback_deliveries_callback_created", ["callback_uid", "created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("callback_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_callback_deliveries_callback_created")
        batch_op.drop_index("ix_callback_deliveries_status_next")
    op.drop_table("callback_deliveries")
    with op.batch_alter_table("callbacks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_callbacks_tenant_id"))
    op.drop_table("callbacks")
