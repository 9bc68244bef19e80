"""The controller role: tokens of the controller manager (`tessera controllers`), which act in
every tenant namespace on the workload kinds only (app/auth/rules.py).

Revision ID: 0027
Revises: 0026
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE_KNOWN = "role IN ('admin', 'tenant', 'node', 'controller')"
ROLE_MATCHES = (
    "(role IN ('admin', 'controller') AND tenant_id IS NULL AND node_name IS NULL) OR "
    "(role = 'tenant' AND tenant_id IS NOT NULL AND node_name IS NULL) OR "
    "(role = 'node' AND tenant_id IS NULL AND node_name IS NOT NULL)"
)
OLD_ROLE_KNOWN = "role IN ('admin', 'tenant', 'node')"
OLD_ROLE_MATCHES = (
    "(role = 'admin' AND tenant_id IS NULL AND node_name IS NULL) OR "
    "(role = 'tenant' AND tenant_id IS NOT NULL AND node_name IS NULL) OR "
    "(role = 'node' AND tenant_id IS NULL AND node_name IS NOT NULL)"
)


def _constraints(known: str, matches: str) -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_tokens_role_known"), type_="check")
        batch_op.drop_constraint(op.f("ck_tokens_role_matches_tenant"), type_="check")
        batch_op.create_check_constraint(op.f("ck_tokens_role_known"), known)
        batch_op.create_check_constraint(op.f("ck_tokens_role_matches_tenant"), matches)


def upgrade() -> None:
    _constraints(ROLE_KNOWN, ROLE_MATCHES)


def downgrade() -> None:
    op.execute("DELETE FROM tokens WHERE role = 'controller'")
    _constraints(OLD_ROLE_KNOWN, OLD_ROLE_MATCHES)
