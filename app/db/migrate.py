"""Run Alembic migrations from code (`tessera migrate`, `tessera dev`, the test suite)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool

import migrations

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
    finally:
        engine.dispose()
