"""Usage by workload: each pod's workload (the top of its chain of controllers, `Kind/name`,
app/workloads.py) is kept on the pod and on its usage events, and the hourly rollups are keyed
by it as well, so that reports can group by it after the workload is gone.

The rollups are derived from the events and rebuilt from them: `usage_hours` is made again
with `workload` in its key and `usage_rollups` emptied, so the agent's next housekeeping passes
roll every hour anew. Usage recorded before this revision has no workload.

Revision ID: 0040
Revises: 0039
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0040"
down_revision: str | None = "0039"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKLOAD = 320  # a kind (63), a slash and a name (253)


def _usage_hours(*, workload: bool) -> None:
    keyed = [sa.Column("workload", sa.String(WORKLOAD), nullable=False)] if workload else []
    op.create_table(
        "usage_hours",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        *keyed,
        sa.Column("compute_class", sa.String(32), nullable=False),
        sa.Column("qos", sa.String(32), nullable=False),
        sa.Column("gpu_model", sa.String(63), nullable=False),
        sa.Column("price", sa.String(63), nullable=False),
        sa.Column("gpu", sa.Boolean(), nullable=False),
        sa.Column("cpu_milli_s", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib_s", sa.BigInteger(), nullable=False),
        sa.Column("vram_mib_s", sa.BigInteger(), nullable=False),
        sa.Column("core_pct_s", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id",
            "hour",
            "namespace",
            *(["workload"] if workload else []),
            "compute_class",
            "qos",
            "gpu_model",
            "price",
            "gpu",
        ),
    )


def upgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.add_column(sa.Column("workload", sa.String(WORKLOAD), nullable=True))
    with op.batch_alter_table("usage_events") as batch:
        batch.add_column(sa.Column("workload", sa.String(WORKLOAD), nullable=True))
    op.drop_table("usage_hours")
    _usage_hours(workload=True)
    op.execute("DELETE FROM usage_rollups")


def downgrade() -> None:
    op.drop_table("usage_hours")
    _usage_hours(workload=False)
    op.execute("DELETE FROM usage_rollups")
    with op.batch_alter_table("usage_events") as batch:
        batch.drop_column("workload")
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("workload")
