"""A pod's deletion grace period holds any int64 of seconds, as Kubernetes accepts.

Revision ID: 0005
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.alter_column(
            "deletion_grace_seconds",
            existing_type=sa.Integer(),
            type_=sa.BigInteger(),
            existing_nullable=True,
        )


def downgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.alter_column(
            "deletion_grace_seconds",
            existing_type=sa.BigInteger(),
            type_=sa.Integer(),
            existing_nullable=True,
        )
