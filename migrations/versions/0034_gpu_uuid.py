"""A GPU's UUID (GPU-xxxxxxxx-...), as NVML and the NVIDIA container runtime name it: the
docker runtime passes it in the engine's device request.

Revision ID: 0034
Revises: 0033
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_devices", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("uuid", sa.String(length=96), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_devices", schema=None) as batch_op:
        batch_op.drop_column("uuid")
