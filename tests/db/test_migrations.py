"""The real Alembic migrations, on both databases."""

from __future__ import annotations

import orjson
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


def test_the_change_log_keeps_its_objects_across_0021(empty_database_url: str) -> None:
    """0021 stores the change log's objects as JSON text on PostgreSQL (JSONB before): what was
    logged comes back the same after the upgrade and after a downgrade."""
    upgrade(empty_database_url, "0020")
    engine = create_engine(empty_database_url)
    logged = {"metadata": {"name": "p", "uid": "u-1", "labels": {"a": "b"}}, "spec": {"n": [1, 2]}}
    insert = text(
        "INSERT INTO changes (resource_version, kind, namespace, name, tenant_id, type, object, "
        "previous) VALUES (7, 'Pod', 'ns', 'p', NULL, 'MODIFIED', :o, :p)"
    )
    read = text("SELECT object, previous FROM changes WHERE resource_version = 7")
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"o": orjson.dumps(logged).decode(), "p": '{"x": 1}'})
        for target in ("0021", "0020", "head"):
            if target == "0020":
                downgrade(empty_database_url, target)
            else:
                upgrade(empty_database_url, target)
            with engine.connect() as conn:
                obj, previous = conn.execute(read).one()
            as_dicts = [orjson.loads(v) if isinstance(v, str) else v for v in (obj, previous)]
            assert as_dicts == [logged, {"x": 1}], target
    finally:
        engine.dispose()
