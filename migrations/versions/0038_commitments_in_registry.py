"""Commitments move into the generic registry: each row of `commitments` becomes an object of
the registry (`objects`, group billing.tessera.io, resource commitments) with the same uid,
namespace, name, tenant, resourceVersion, creation time and labels, its annotations and its
spec (`amountPerDay`, written in the server's currency: the minor digits of its settings,
`TESSERA_BILLING_MINOR_DIGITS`, as the API wrote it) in the body. `commitments` stays as what
is kept beside each object, keyed by its uid (ON DELETE CASCADE): the tenant whose one plan it
is (unique) and the amount in minor units. `commitment_terms`, which billing rates with, is
unchanged.

The downgrade puts every Commitment object back into the old `commitments` table. What the old
table has no column for is left behind: finalizers, managedFields, other metadata, and a
deletionTimestamp (the plan comes back live).

Revision ID: 0038
Revises: 0037
"""

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
GROUP, RESOURCE = "billing.tessera.io", "commitments"

old_plans = sa.table(
    "commitments",
    *(sa.column(c, sa.String) for c in ("uid", "namespace", "name")),
    sa.column("tenant_id", sa.Integer),
    *(sa.column(c, sa.BigInteger) for c in ("resource_version", "amount_minor")),
    sa.column("created_at", TIME),
    *(sa.column(c, JSON) for c in ("labels", "annotations")),
)
plans = sa.table(
    "commitments",
    sa.column("uid", sa.String),
    sa.column("tenant_id", sa.Integer),
    sa.column("amount_minor", sa.BigInteger),
)
objects = sa.table(
    "objects",
    sa.column("uid", sa.String),
    sa.column("api_group", sa.String),
    sa.column("resource", sa.String),
    sa.column("namespace", sa.String),
    sa.column("name", sa.String),
    sa.column("tenant_id", sa.Integer),
    sa.column("resource_version", sa.BigInteger),
    sa.column("created_at", TIME),
    sa.column("deletion_timestamp", TIME),
    sa.column("labels", JSON),
    sa.column("body", JSON),
)


def _minor_digits() -> int:
    """The currency's minor digits, as the server that wrote the amounts is configured."""
    from app.settings import Settings

    return Settings().billing_minor_digits


def _body(row: Any, digits: int) -> dict[str, Any]:
    """The object's stored body, as the registry's store writes it (everything but apiVersion,
    kind and the metadata it keeps in columns)."""
    amount = format(Decimal(row.amount_minor).scaleb(-digits), "f")
    body: dict[str, Any] = {"spec": {"amountPerDay": amount}}
    if row.annotations:
        body["metadata"] = {"annotations": dict(row.annotations)}
    return body


def _create_plans_table() -> None:
    op.create_table(
        "commitments",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("amount_minor > 0", name=op.f("ck_commitments_amount_positive")),
        sa.ForeignKeyConstraint(
            ["uid"], ["objects.uid"], name=op.f("fk_commitments_uid_objects"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_commitments_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_commitments")),
        sa.UniqueConstraint("tenant_id", name=op.f("uq_commitments_tenant_id")),
    )


def _create_old_table() -> None:
    """`commitments` as migrations 0006 and 0037 left it (on PostgreSQL, 0037's triggers that
    refuse an update or delete of a row versioned above the transaction's versions; the table
    beside the objects has no versions, and the objects table has those triggers)."""
    op.create_table(
        "commitments",
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("amount_minor > 0", name="amount_positive"),
        sa.ForeignKeyConstraint(["namespace"], ["namespaces.name"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("uid"),
        sa.UniqueConstraint("namespace", "name", name="uq_commitments_namespace_name"),
        sa.UniqueConstraint("tenant_id"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER tessera_row_order_{verb.lower()} AFTER {verb} ON commitments"
                " REFERENCING OLD TABLE AS earlier FOR EACH STATEMENT"
                " EXECUTE FUNCTION tessera_row_order()"
            )


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(old_plans).order_by(old_plans.c.uid)).all()
    digits = _minor_digits() if rows else 0
    op.drop_table("commitments")
    _create_plans_table()
    for row in rows:
        conn.execute(
            objects.insert().values(
                uid=row.uid,
                api_group=GROUP,
                resource=RESOURCE,
                namespace=row.namespace,
                name=row.name,
                tenant_id=row.tenant_id,
                resource_version=row.resource_version,
                created_at=row.created_at,
                deletion_timestamp=None,
                labels=dict(row.labels or {}),
                body=_body(row, digits),
            )
        )
        conn.execute(
            plans.insert().values(
                uid=row.uid, tenant_id=row.tenant_id, amount_minor=row.amount_minor
            )
        )


def downgrade() -> None:
    conn = op.get_bind()
    kept = sa.and_(objects.c.api_group == GROUP, objects.c.resource == RESOURCE)
    rows = conn.execute(
        sa.select(objects, plans.c.amount_minor, plans.c.tenant_id.label("plan_tenant"))
        .select_from(objects.join(plans, plans.c.uid == objects.c.uid))
        .where(kept)
        .order_by(objects.c.uid)
    ).all()
    op.drop_table("commitments")
    _create_old_table()
    for row in rows:
        metadata = (row.body or {}).get("metadata") or {}
        conn.execute(
            old_plans.insert().values(
                uid=row.uid,
                namespace=row.namespace,
                name=row.name,
                tenant_id=row.plan_tenant,
                resource_version=row.resource_version,
                created_at=row.created_at,
                labels=dict(row.labels or {}),
                annotations=dict(metadata.get("annotations") or {}),
                amount_minor=row.amount_minor,
            )
        )
    conn.execute(objects.delete().where(kept))
