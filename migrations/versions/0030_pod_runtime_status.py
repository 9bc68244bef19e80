"""What a node's container runtime reports of a pod beyond its containers' states.

- `init_container_statuses`: the init containers' states as the node agent reports them
  (`status.initContainerStatuses`; NULL: none reported).
- `pod_ip`: the pod's address on its namespace's network (`status.podIP`; NULL: none).

Revision ID: 0030
Revises: 0029
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "init_container_statuses",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )
        batch_op.add_column(sa.Column("pod_ip", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_column("pod_ip")
        batch_op.drop_column("init_container_statuses")
