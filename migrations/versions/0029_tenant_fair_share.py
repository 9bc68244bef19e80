"""Fair share: each tenant's weight (default 1), which the scheduler divides the tenant's
dominant share by when the pool is contended (`scheduler/fairshare.py`).

Revision ID: 0029
Revises: 0028
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WEIGHT_RANGE = "weight >= 1 AND weight <= 1000"


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("weight", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
        batch_op.create_check_constraint(op.f("ck_tenants_weight_range"), WEIGHT_RANGE)


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_tenants_weight_range"), type_="check")
        batch_op.drop_column("weight")
