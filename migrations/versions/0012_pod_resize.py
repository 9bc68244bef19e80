"""In-place resize of a pod (`pods/resize`): the resize waiting for room and what the pod holds.

- `resize_cpu_milli` / `resize_memory_mib`: the sold spec a Deferred resize waits to take on its
  node (NULL: none waits); the node agent retries it when the node has the room.
- `allocated_resources`: while a resize is pending (Deferred or Infeasible), each container's
  resources as the node holds them (the spec already shows the new ones, as in Kubernetes).
- `resizes`: how many resizes took effect (the usage ledger's sequence number of the next one).

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resize_cpu_milli", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("resize_memory_mib", sa.BigInteger(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "allocated_resources",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )
        batch_op.add_column(
            sa.Column("resizes", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        # the node agent looks for Deferred resizes on every pass
        batch_op.create_index("ix_pods_resize_cpu_milli", ["resize_cpu_milli"])


def downgrade() -> None:
    with op.batch_alter_table("pods", schema=None) as batch_op:
        batch_op.drop_index("ix_pods_resize_cpu_milli")
        batch_op.drop_column("resizes")
        batch_op.drop_column("allocated_resources")
        batch_op.drop_column("resize_memory_mib")
        batch_op.drop_column("resize_cpu_milli")
