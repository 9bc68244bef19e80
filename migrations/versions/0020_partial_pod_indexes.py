"""Partial indexes for what the node loop looks for every half second (deletion, disruption
deadlines, Deferred resizes): only the few pods with the column set are in them.

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARTIAL = ("disruption_deadline", "resize_cpu_milli")


def upgrade() -> None:
    for column in PARTIAL:
        op.drop_index(f"ix_pods_{column}", table_name="pods")
    for column in (*PARTIAL, "deletion_timestamp"):
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            f"ix_pods_{column}",
            "pods",
            [column],
            postgresql_where=where,
            sqlite_where=where,
        )


def downgrade() -> None:
    for column in (*PARTIAL, "deletion_timestamp"):
        op.drop_index(f"ix_pods_{column}", table_name="pods")
    for column in PARTIAL:
        op.create_index(f"ix_pods_{column}", "pods", [column])
