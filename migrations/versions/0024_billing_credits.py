"""Credits: an operator credits a window of time (an outage) to one tenant or every tenant;
append-only, shown on statements as a line of its own.

Revision ID: 0024
Revises: 0023
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "billing_credits",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(length=256), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("end_at > start_at", name=op.f("ck_billing_credits_window_forward")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_billing_credits")),
    )
    op.create_index("ix_billing_credits_end", "billing_credits", ["end_at"])


def downgrade() -> None:
    op.drop_index("ix_billing_credits_end", table_name="billing_credits")
    op.drop_table("billing_credits")
