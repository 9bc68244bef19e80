"""Usage events may pause and resume a pod's billing: its node went silent past its lease (its
agent died, or the control plane was down and saw no renewal) and came back. The node loop keeps
each node's last renewTime it saw, so that a restarted loop finds a silence it did not see.

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = "kind IN ('start', 'change', 'pause', 'resume', 'stop')"
OLD_KINDS = "kind IN ('start', 'change', 'stop')"


def upgrade() -> None:
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_usage_events_kind_known"), type_="check")
        batch_op.create_check_constraint(op.f("ck_usage_events_kind_known"), KINDS)
    with op.batch_alter_table("usage_heartbeats", schema=None) as batch_op:
        batch_op.add_column(sa.Column("renewed", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_heartbeats", schema=None) as batch_op:
        batch_op.drop_column("renewed")
    op.execute("DELETE FROM usage_events WHERE kind IN ('pause', 'resume')")
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_usage_events_kind_known"), type_="check")
        batch_op.create_check_constraint(op.f("ck_usage_events_kind_known"), OLD_KINDS)
