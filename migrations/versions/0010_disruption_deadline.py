"""A BestEffort pod told to stop for a preemptor stops at `disruption_deadline`.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("disruption_deadline", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_index("ix_pods_disruption_deadline", ["disruption_deadline"])


def downgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_index("ix_pods_disruption_deadline")
        batch_op.drop_column("disruption_deadline")
