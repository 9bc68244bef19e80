"""The real Alembic migrations, on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, text

from app.db.migrate import downgrade, upgrade
from app.db.models import Base

pytestmark = pytest.mark.parametrize("empty_database_url", ["sqlite", "postgresql"], indirect=True)


def test_upgrade_creates_every_table_downgrade_removes_them(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        with engine.connect() as conn:
            assert (
                conn.execute(
                    text("SELECT value FROM counters WHERE name = 'resource_version'")
                ).scalar_one()
                == 0
            )
        downgrade(empty_database_url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(empty_database_url)
        upgrade(empty_database_url)  # idempotent
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_schema_matches_the_models(empty_database_url: str) -> None:
    """A model change without a migration fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()
