"""scheduler-plugins coscheduling PodGroups (scheduling.x-k8s.io/v1alpha1) in the pod_groups
table: the API group that declared each, its schedule timeout and minResources, when its
gang was first tried and why it failed.

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "api_group", sa.String(length=63), nullable=False, server_default="tessera.io"
            )
        )
        batch_op.add_column(sa.Column("schedule_timeout_seconds", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("min_resources", JSON, nullable=True))
        batch_op.add_column(
            sa.Column("scheduling_since", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("failed_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.drop_column("failed_reason")
        batch_op.drop_column("scheduling_since")
        batch_op.drop_column("min_resources")
        batch_op.drop_column("schedule_timeout_seconds")
        batch_op.drop_column("api_group")
