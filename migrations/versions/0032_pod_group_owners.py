"""A PodGroup's ownerReferences (metadata.ownerReferences): a JobSet's gang is owned by its
JobSet, so that deleting the JobSet deletes its PodGroup.

Revision ID: 0032
Revises: 0031
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner_references", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.drop_column("owner_references")
