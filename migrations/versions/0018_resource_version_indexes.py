"""Indexes on the resourceVersion of pods, nodes and GPUs: the scheduler reads only the rows
that changed since its last cycle.

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_pods_resource_version", "pods", ["resource_version"])
    op.create_index("ix_nodes_resource_version", "nodes", ["resource_version"])
    op.create_index("ix_gpu_devices_resource_version", "gpu_devices", ["resource_version"])


def downgrade() -> None:
    op.drop_index("ix_gpu_devices_resource_version", table_name="gpu_devices")
    op.drop_index("ix_nodes_resource_version", table_name="nodes")
    op.drop_index("ix_pods_resource_version", table_name="pods")
