"""GPU faults: a GPU's device taints (KEP-5055 vocabulary: NoSchedule, NoExecute) and its
bounded fault history.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_devices", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("taints", JSON, nullable=False, server_default=sa.text("'[]'"))
        )
        batch_op.add_column(
            sa.Column("faults", JSON, nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_devices", schema=None) as batch_op:
        batch_op.drop_column("faults")
        batch_op.drop_column("taints")
