"""The generic registry's objects table (ConfigMaps, Secrets, and every kind the registry
keeps after them): one row per object, its stored body as JSON.

Revision ID: 0026
Revises: 0024
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0026"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "objects",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("api_group", sa.String(length=63), nullable=False),
        sa.Column("resource", sa.String(length=63), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deletion_timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("body", JSON, nullable=False),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_objects")),
        sa.UniqueConstraint("api_group", "resource", "namespace", "name", name="uq_objects_key"),
    )
    op.create_index("ix_objects_tenant", "objects", ["api_group", "resource", "tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_objects_tenant", table_name="objects")
    op.drop_table("objects")
