"""Leases are served by the generic registry (app/registry/kinds/leases.py) from their own
table: `leases` takes the columns the registry's store writes for every kind (`tenant_id`,
`deletion_timestamp`, and `body`: the metadata and spec no column holds, as JSON). Each row's
annotations move into its body (`metadata.annotations`), and its tenant is its namespace's.
The spec's fields that leader election and the node loop read stay in their columns.

The downgrade puts the annotations back in their column; what the old table has no column for
(finalizers, ownerReferences, managedFields, spec.preferredHolder, spec.strategy, a
deletionTimestamp) is left behind.

Revision ID: 0039
Revises: 0038
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0039"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)

leases = sa.table(
    "leases",
    sa.column("uid", sa.String),
    sa.column("namespace", sa.String),
    sa.column("tenant_id", sa.Integer),
    sa.column("annotations", JSON),
    sa.column("body", JSON),
)
namespaces = sa.table(
    "namespaces", sa.column("name", sa.String), sa.column("tenant_id", sa.Integer)
)


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("tenant_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("deletion_timestamp", TIME, nullable=True))
        batch.add_column(sa.Column("body", JSON, nullable=True))
    conn = op.get_bind()
    tenants = dict(conn.execute(sa.select(namespaces.c.name, namespaces.c.tenant_id)).all())
    for uid, namespace, annotations in conn.execute(
        sa.select(leases.c.uid, leases.c.namespace, leases.c.annotations)
    ).all():
        body: dict[str, Any] = (
            {"metadata": {"annotations": dict(annotations)}} if annotations else {}
        )
        conn.execute(
            leases.update()
            .where(leases.c.uid == uid)
            .values(body=body, tenant_id=tenants.get(namespace))
        )
    with op.batch_alter_table("leases") as batch:
        batch.alter_column("body", existing_type=JSON, nullable=False)
        batch.drop_column("annotations")


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("annotations", JSON, nullable=True))
    conn = op.get_bind()
    for uid, body in conn.execute(sa.select(leases.c.uid, leases.c.body)).all():
        annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
        conn.execute(
            leases.update().where(leases.c.uid == uid).values(annotations=dict(annotations))
        )
    with op.batch_alter_table("leases") as batch:
        batch.alter_column("annotations", existing_type=JSON, nullable=False)
        batch.drop_column("body")
        batch.drop_column("deletion_timestamp")
        batch.drop_column("tenant_id")
