"""resourceVersions without a lock every writer shares: on PostgreSQL a transaction's versions
come from its transaction id (see `app/db/engine.py`, `next_resource_version`), plus the offset
kept here, chosen so that they start above every version the counter handed out. SQLite keeps
the counter.

Revision ID: 0035
Revises: 0034
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHIFT = 20  # app.db.engine.RV_SHIFT when this was written


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        bind.execute(
            sa.text(
                "INSERT INTO counters (name, value) SELECT 'rv_offset', greatest(0, value + 1"
                f" - (pg_current_xact_id()::text::bigint << {SHIFT}))"
                " FROM counters WHERE name = 'resource_version'"
            )
        )
    else:
        bind.execute(sa.text("INSERT INTO counters (name, value) VALUES ('rv_offset', 0)"))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # the counter goes on above every version handed out by transaction id
        bind.execute(
            sa.text(
                "UPDATE counters SET value = greatest(value, (SELECT o.value + "
                f"((pg_current_xact_id()::text::bigint + 1) << {SHIFT}) FROM counters o"
                " WHERE o.name = 'rv_offset')) WHERE name = 'resource_version'"
            )
        )
    bind.execute(sa.text("DELETE FROM counters WHERE name = 'rv_offset'"))
