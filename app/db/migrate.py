"""Run Alembic migrations from code (`tessera migrate`, `tessera dev`, the test suite)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, pool, text

import migrations
from app.db.engine import RV_OFFSET, lift_versions

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at `database_url` to `revision` (creates a SQLite file if needed)."""
    _run(command.upgrade, database_url, revision)


def downgrade(database_url: str, revision: str) -> None:
    _run(command.downgrade, database_url, revision)


def _run(step: Callable[[Config, str], None], database_url: str, revision: str) -> None:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            config = alembic_config(database_url)
            config.attributes["connection"] = connection
            step(config, revision)
            if (
                step is command.upgrade
                and connection.dialect.name == "postgresql"
                and _has_version_offset(connection)
            ):
                lift_versions(connection)
    finally:
        engine.dispose()


def _has_version_offset(connection: Connection) -> bool:
    """Whether the store is at a revision whose versions come from transaction ids (0035 on)."""
    found = connection.execute(
        text("SELECT 1 FROM counters WHERE name = :name"), {"name": RV_OFFSET}
    ).first()
    return found is not None
