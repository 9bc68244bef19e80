"""The change log keeps an object's previous state when a selector could see it differently.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("changes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("previous", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("changes", schema=None) as batch_op:
        batch_op.drop_column("previous")
