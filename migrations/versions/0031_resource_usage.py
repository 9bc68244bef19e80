"""Resource usage the node agents report (`kubectl top pod`, `kubectl top node`): one row per
node, its usage and its pods' as of its last report.

Revision ID: 0031
Revises: 0030
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "resource_usage",
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_seconds", sa.Float(), nullable=False),
        sa.Column("body", JSON, nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_resource_usage")),
    )


def downgrade() -> None:
    op.drop_table("resource_usage")
