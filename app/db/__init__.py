"""Persistence: ORM tables, engine and transactions, migrations."""
