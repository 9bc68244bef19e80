"""Events are only ever inserted: watches of events read the events table by resourceVersion,
and events take no rows of the change log.

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_events_resource_version", "events", ["resource_version"])
    op.execute("DELETE FROM changes WHERE kind = 'Event'")


def downgrade() -> None:
    op.drop_index("ix_events_resource_version", table_name="events")
