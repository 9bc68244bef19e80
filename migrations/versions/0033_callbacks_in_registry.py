"""Callbacks move into the generic registry: each row of `callbacks` becomes an object of the
registry (`objects`, group tessera.io, resource callbacks) with the same uid, namespace, name,
tenant, resourceVersion, creation time and labels, its annotations and spec in the body; its
signing secret and the time it was made move to `callback_secrets`; the deliveries now belong to
the object (their foreign key points at `objects.uid`, ON DELETE CASCADE as before).

The downgrade puts every Callback object back into `callbacks` with its secret (one without a
secret row, which Tessera never makes, gets a new secret). What the old table has no column for
is left behind: finalizers, ownerReferences, managedFields, and a deletionTimestamp (the
callback comes back live).

Revision ID: 0033
Revises: 0032
"""

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
GROUP, RESOURCE = "tessera.io", "callbacks"

callbacks = sa.table(
    "callbacks",
    sa.column("uid", sa.String),
    sa.column("namespace", sa.String),
    sa.column("name", sa.String),
    sa.column("tenant_id", sa.Integer),
    sa.column("resource_version", sa.BigInteger),
    sa.column("created_at", TIME),
    sa.column("labels", JSON),
    sa.column("annotations", JSON),
    sa.column("url", sa.String),
    sa.column("events", JSON),
    sa.column("description", sa.String),
    sa.column("secret", sa.String),
    sa.column("secret_rotated_at", TIME),
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
secrets_t = sa.table(
    "callback_secrets",
    sa.column("callback_uid", sa.String),
    sa.column("secret", sa.String),
    sa.column("rotated_at", TIME),
)


def _body(row: Any) -> dict[str, Any]:
    """The object's stored body, as the registry's store writes it (app/registry/store.py:
    everything but apiVersion, kind and the metadata it keeps in columns)."""
    spec: dict[str, Any] = {"url": row.url, "events": list(row.events or [])}
    if row.description:
        spec["description"] = row.description
    body: dict[str, Any] = {"spec": spec}
    if row.annotations:
        body["metadata"] = {"annotations": dict(row.annotations)}
    return body


def upgrade() -> None:
    op.create_table(
        "callback_secrets",
        sa.Column("callback_uid", sa.String(length=36), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("rotated_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["callback_uid"],
            ["objects.uid"],
            name=op.f("fk_callback_secrets_callback_uid_objects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("callback_uid", name=op.f("pk_callback_secrets")),
    )
    conn = op.get_bind()
    rows = conn.execute(sa.select(callbacks).order_by(callbacks.c.uid)).all()
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
                body=_body(row),
            )
        )
        conn.execute(
            secrets_t.insert().values(
                callback_uid=row.uid, secret=row.secret, rotated_at=row.secret_rotated_at
            )
        )
    with op.batch_alter_table("callback_deliveries", schema=None) as batch_op:
        batch_op.drop_constraint(
            "fk_callback_deliveries_callback_uid_callbacks", type_="foreignkey"
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_callback_deliveries_callback_uid_objects"),
            "objects",
            ["callback_uid"],
            ["uid"],
            ondelete="CASCADE",
        )
    with op.batch_alter_table("callbacks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_callbacks_tenant_id"))
    op.drop_table("callbacks")


def downgrade() -> None:
    op.create_table(
        "callbacks",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", JSON, nullable=False),
        sa.Column("description", sa.String(length=1024), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("secret_rotated_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_callbacks_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_callbacks_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_callbacks")),
        sa.UniqueConstraint("namespace", "name", name="uq_callbacks_namespace_name"),
    )
    with op.batch_alter_table("callbacks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_callbacks_tenant_id"), ["tenant_id"], unique=False)
    conn = op.get_bind()
    kept = sa.and_(objects.c.api_group == GROUP, objects.c.resource == RESOURCE)
    rows = conn.execute(
        sa.select(objects, secrets_t.c.secret, secrets_t.c.rotated_at)
        .select_from(objects.outerjoin(secrets_t, secrets_t.c.callback_uid == objects.c.uid))
        .where(kept)
        .order_by(objects.c.uid)
    ).all()
    for row in rows:
        body = row.body or {}
        spec = body.get("spec") or {}
        conn.execute(
            callbacks.insert().values(
                uid=row.uid,
                namespace=row.namespace,
                name=row.name,
                tenant_id=row.tenant_id,
                resource_version=row.resource_version,
                created_at=row.created_at,
                labels=dict(row.labels or {}),
                annotations=dict((body.get("metadata") or {}).get("annotations") or {}),
                url=spec.get("url") or "",
                events=list(spec.get("events") or []),
                description=spec.get("description") or "",
                secret=row.secret or "whsec_" + secrets.token_urlsafe(32),
                secret_rotated_at=row.rotated_at or datetime.now(UTC),
            )
        )
    with op.batch_alter_table("callback_deliveries", schema=None) as batch_op:
        batch_op.drop_constraint("fk_callback_deliveries_callback_uid_objects", type_="foreignkey")
        batch_op.create_foreign_key(
            batch_op.f("fk_callback_deliveries_callback_uid_callbacks"),
            "callbacks",
            ["callback_uid"],
            ["uid"],
            ondelete="CASCADE",
        )
    op.drop_table("callback_secrets")
    conn.execute(objects.delete().where(kept))
