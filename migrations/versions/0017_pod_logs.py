"""Pod logs that node agents send: a bounded store of lines per pod, container and run.

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pod_log_lines",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pod_uid", sa.String(length=36), nullable=False),
        sa.Column("container", sa.String(length=63), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pod_uid"],
            ["pods.uid"],
            name=op.f("fk_pod_log_lines_pod_uid_pods"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pod_log_lines")),
    )
    op.create_index("ix_pod_log_lines_run", "pod_log_lines", ["pod_uid", "container", "run", "id"])


def downgrade() -> None:
    op.drop_index("ix_pod_log_lines_run", table_name="pod_log_lines")
    op.drop_table("pod_log_lines")
