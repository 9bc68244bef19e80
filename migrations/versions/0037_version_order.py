"""PostgreSQL: no change is ordered before one it came after. A transaction's versions are
its transaction id's (0035), so one that took its id early and changes an object late, after a
transaction with a later id changed it and committed, would log a change *below* the other:
watchers would apply them the wrong way round, and readers that ask what changed since a
version would miss it. Such a statement is refused with a serialization failure (40001), and
the write runs again in a new transaction, whose versions are above. Checked at the database
for every writer: when a change is logged (any earlier change of the same object above the
transaction's versions), and when a versioned row is updated or deleted (a row written above
them).

Revision ID: 0037
Revises: 0036
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHIFT = 20  # app.db.engine.RV_SHIFT
VERSIONED = (
    "namespaces",
    "nodes",
    "gpu_devices",
    "pods",
    "leases",
    "events",
    "objects",
    "prices",
    "commitments",
    "statements",
)
# the first version above every version this transaction may take
ABOVE_OURS = (
    f"SELECT ((pg_current_xact_id()::text::bigint + 1) << {SHIFT}) + value INTO above"
    " FROM counters WHERE name = 'rv_offset';"
)
RETRY = (
    "RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'a transaction that began later "
    "changed this object first: run again (its versions would be below that change)';"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION tessera_change_order() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE above bigint;
        BEGIN
          {ABOVE_OURS}
          IF EXISTS (
            SELECT 1 FROM added a JOIN changes c
              ON c.kind = a.kind AND c.name = a.name
             AND c.namespace IS NOT DISTINCT FROM a.namespace
             AND c.resource_version >= above
          ) THEN
            {RETRY}
          END IF;
          RETURN NULL;
        END $$;
        CREATE FUNCTION tessera_row_order() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE above bigint;
        BEGIN
          {ABOVE_OURS}
          IF EXISTS (SELECT 1 FROM earlier WHERE resource_version >= above) THEN
            {RETRY}
          END IF;
          RETURN NULL;
        END $$;
        CREATE TRIGGER tessera_change_order AFTER INSERT ON changes
          REFERENCING NEW TABLE AS added FOR EACH STATEMENT
          EXECUTE FUNCTION tessera_change_order();
        """
    )
    for table in VERSIONED:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER tessera_row_order_{verb.lower()} AFTER {verb} ON {table}"
                " REFERENCING OLD TABLE AS earlier FOR EACH STATEMENT"
                " EXECUTE FUNCTION tessera_row_order()"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in VERSIONED:
        for verb in ("update", "delete"):
            op.execute(f"DROP TRIGGER tessera_row_order_{verb} ON {table}")
    op.execute("DROP TRIGGER tessera_change_order ON changes")
    op.execute("DROP FUNCTION tessera_row_order()")
    op.execute("DROP FUNCTION tessera_change_order()")
