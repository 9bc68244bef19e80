"""Pod groups (gangs), and the group a pod belongs to.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pod_groups",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("min_member", sa.Integer(), nullable=False),
        sa.Column("required_topology", sa.String(length=16), nullable=True),
        sa.Column("preferred_topology", sa.String(length=16), nullable=True),
        sa.CheckConstraint("min_member >= 1", name=op.f("ck_pod_groups_min_member_positive")),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_pod_groups_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_pod_groups_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_pod_groups")),
        sa.UniqueConstraint("namespace", "name", name="uq_pod_groups_namespace_name"),
    )
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pod_groups_tenant_id"), ["tenant_id"], unique=False)

    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pod_group", sa.String(length=253), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_column("pod_group")

    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pod_groups_tenant_id"))

    op.drop_table("pod_groups")
