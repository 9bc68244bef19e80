"""Node agents: tokens bound to one node, and coordination.k8s.io Leases (a node's heartbeat).

Revision ID: 0015
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

ROLE_KNOWN = "role IN ('admin', 'tenant', 'node')"
ROLE_MATCHES = (
    "(role = 'admin' AND tenant_id IS NULL AND node_name IS NULL) OR "
    "(role = 'tenant' AND tenant_id IS NOT NULL AND node_name IS NULL) OR "
    "(role = 'node' AND tenant_id IS NULL AND node_name IS NOT NULL)"
)


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_name", sa.String(length=253), nullable=True))
        batch_op.drop_constraint(op.f("ck_tokens_role_known"), type_="check")
        batch_op.drop_constraint(op.f("ck_tokens_role_matches_tenant"), type_="check")
        batch_op.create_check_constraint(op.f("ck_tokens_role_known"), ROLE_KNOWN)
        batch_op.create_check_constraint(op.f("ck_tokens_role_matches_tenant"), ROLE_MATCHES)
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.add_column(sa.Column("container_statuses", JSON, nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lost_since", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "leases",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("holder_identity", sa.String(length=253), nullable=True),
        sa.Column("lease_duration_seconds", sa.Integer(), nullable=True),
        sa.Column("acquire_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("renew_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_transitions", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_leases_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_leases")),
        sa.UniqueConstraint("namespace", "name", name="uq_leases_namespace_name"),
    )


def downgrade() -> None:
    op.drop_table("leases")
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_column("container_statuses")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("lost_since")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_tokens_role_known"), type_="check")
        batch_op.drop_constraint(op.f("ck_tokens_role_matches_tenant"), type_="check")
        batch_op.create_check_constraint(
            op.f("ck_tokens_role_known"), "role IN ('admin', 'tenant')"
        )
        batch_op.create_check_constraint(
            op.f("ck_tokens_role_matches_tenant"),
            "(role = 'admin' AND tenant_id IS NULL) OR (role = 'tenant' AND tenant_id IS NOT NULL)",
        )
        batch_op.drop_column("node_name")
