"""The change log's objects are JSON text on PostgreSQL, not JSONB: written once, read back
whole, never queried inside (but by a path), so parsing them into JSONB on every write and
printing them on every watch read bought nothing. SQLite stores JSON as text either way.

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("object", "previous")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in COLUMNS:
            op.execute(f"ALTER TABLE changes ALTER COLUMN {column} TYPE json USING {column}::json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in COLUMNS:
            op.execute(
                f"ALTER TABLE changes ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb"
            )
