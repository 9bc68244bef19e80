"""An index of the pods of pod groups by (namespace, group): the scheduler reads a gang's
members in every cycle that has one, and scanned the whole pods table to find them. Partial:
pods of no group are not in it, so their writes do not maintain it.

Revision ID: 0022
Revises: 0021
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    where = sa.text("pod_group IS NOT NULL")
    op.create_index(
        "ix_pods_namespace_pod_group",
        "pods",
        ["namespace", "pod_group"],
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    op.drop_index("ix_pods_namespace_pod_group", table_name="pods")
