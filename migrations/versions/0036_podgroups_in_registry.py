"""PodGroups (tessera.io and scheduling.x-k8s.io) move into the generic registry: each row of
`pod_groups` becomes an object of the registry (`objects`, its API group, resource podgroups)
with the same uid, namespace, name, tenant, resourceVersion, creation time and labels, its
annotations, ownerReferences and spec in the body. `pod_groups` stays as what the scheduler
reads beside each object (keyed by the object's uid, ON DELETE CASCADE): namespace, name, API
group, minMember, the topology levels, the schedule timeout, and the scheduler's own writes
(when the gang was first tried, why it timed out); the object's columns leave it.

The downgrade puts every PodGroup object back into the old `pod_groups` table. What the old
table has no column for is left behind: finalizers, managedFields, other metadata, and a
deletionTimestamp (the group comes back live).

Revision ID: 0036
Revises: 0035
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
RESOURCE = "podgroups"
TESSERA, SCHEDULING = "tessera.io", "scheduling.x-k8s.io"

# the columns both forms of the table share (the scheduler's)
SHARED = (
    "uid",
    "namespace",
    "name",
    "api_group",
    "min_member",
    "required_topology",
    "preferred_topology",
    "schedule_timeout_seconds",
    "scheduling_since",
    "failed_reason",
)
old_groups = sa.table(
    "pod_groups",
    *(sa.column(c, sa.String) for c in ("uid", "namespace", "name", "api_group")),
    *(sa.column(c, sa.String) for c in ("required_topology", "preferred_topology")),
    *(sa.column(c, sa.Integer) for c in ("tenant_id", "min_member", "schedule_timeout_seconds")),
    sa.column("resource_version", sa.BigInteger),
    *(sa.column(c, TIME) for c in ("created_at", "scheduling_since")),
    sa.column("failed_reason", sa.Text),
    *(sa.column(c, JSON) for c in ("labels", "annotations", "min_resources", "owner_references")),
)
index = sa.table("pod_groups", *(sa.column(c, old_groups.c[c].type) for c in SHARED))
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


def _body(row: Any) -> dict[str, Any]:
    """The object's stored body, as the registry's store writes it (app/registry/store.py:
    everything but apiVersion, kind and the metadata it keeps in columns)."""
    spec: dict[str, Any] = {"minMember": row.min_member}
    if row.api_group == SCHEDULING:
        if row.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = row.schedule_timeout_seconds
        if row.min_resources:
            spec["minResources"] = dict(row.min_resources)
    else:
        levels = (("required", row.required_topology), ("preferred", row.preferred_topology))
        spec["topology"] = {k: v for k, v in levels if v}
    body: dict[str, Any] = {"spec": spec}
    metadata: dict[str, Any] = {}
    if row.annotations:
        metadata["annotations"] = dict(row.annotations)
    if row.owner_references:
        metadata["ownerReferences"] = list(row.owner_references)
    if metadata:
        body["metadata"] = metadata
    return body


def _create_index_table() -> None:
    op.create_table(
        "pod_groups",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("api_group", sa.String(length=63), nullable=False),
        sa.Column("min_member", sa.Integer(), nullable=False),
        sa.Column("required_topology", sa.String(length=16), nullable=True),
        sa.Column("preferred_topology", sa.String(length=16), nullable=True),
        sa.Column("schedule_timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("scheduling_since", TIME, nullable=True),
        sa.Column("failed_reason", sa.Text(), nullable=True),
        sa.CheckConstraint("min_member >= 1", name=op.f("ck_pod_groups_min_member_positive")),
        sa.ForeignKeyConstraint(
            ["uid"], ["objects.uid"], name=op.f("fk_pod_groups_uid_objects"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_pod_groups")),
        sa.UniqueConstraint("namespace", "name", name="uq_pod_groups_namespace_name"),
    )


def _create_old_table() -> None:
    """`pod_groups` as migrations 0002, 0016 and 0032 left it."""
    op.create_table(
        "pod_groups",
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("min_member", sa.Integer(), nullable=False),
        sa.Column("required_topology", sa.String(length=16), nullable=True),
        sa.Column("preferred_topology", sa.String(length=16), nullable=True),
        sa.Column("api_group", sa.String(length=63), nullable=False, server_default=TESSERA),
        sa.Column("schedule_timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("min_resources", JSON, nullable=True),
        sa.Column("scheduling_since", TIME, nullable=True),
        sa.Column("failed_reason", sa.Text(), nullable=True),
        sa.Column("owner_references", JSON, nullable=True),
        sa.CheckConstraint("min_member >= 1", name=op.f("ck_pod_groups_min_member_positive")),
        sa.ForeignKeyConstraint(
            ["namespace"],
            ["namespaces.name"],
            name=op.f("fk_pod_groups_namespace_namespaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_pod_groups_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_pod_groups")),
        sa.UniqueConstraint("namespace", "name", name="uq_pod_groups_namespace_name"),
    )
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pod_groups_tenant_id"), ["tenant_id"], unique=False)


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(old_groups).order_by(old_groups.c.uid)).all()
    with op.batch_alter_table("pod_groups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pod_groups_tenant_id"))
    op.drop_table("pod_groups")
    _create_index_table()
    for row in rows:
        conn.execute(
            objects.insert().values(
                uid=row.uid,
                api_group=row.api_group or TESSERA,
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
            index.insert().values(
                **{c: getattr(row, c) for c in SHARED if c != "api_group"},
                api_group=row.api_group or TESSERA,
            )
        )


def downgrade() -> None:
    conn = op.get_bind()
    kept = sa.and_(objects.c.resource == RESOURCE, objects.c.api_group.in_((TESSERA, SCHEDULING)))
    own = [c for c in SHARED if c not in ("uid", "namespace", "name", "api_group")]
    rows = conn.execute(
        sa.select(objects, *(index.c[c] for c in own))
        .select_from(objects.join(index, index.c.uid == objects.c.uid))
        .where(kept)
        .order_by(objects.c.uid)
    ).all()
    op.drop_table("pod_groups")
    _create_old_table()
    for row in rows:
        body = row.body or {}
        spec, metadata = body.get("spec") or {}, body.get("metadata") or {}
        resources = spec.get("minResources") if row.api_group == SCHEDULING else None
        conn.execute(
            old_groups.insert().values(
                uid=row.uid,
                namespace=row.namespace,
                name=row.name,
                tenant_id=row.tenant_id,
                resource_version=row.resource_version,
                created_at=row.created_at,
                labels=dict(row.labels or {}),
                annotations=dict(metadata.get("annotations") or {}),
                owner_references=list(metadata.get("ownerReferences") or []) or None,
                min_resources=dict(resources) if resources else None,
                api_group=row.api_group,
                **{c: getattr(row, c) for c in own},
            )
        )
    conn.execute(objects.delete().where(kept))
