"""Tenants, tokens and authentication.

A tenant owns namespaces named `<tenant>` or `<tenant>-<anything>`; tenant names are chosen so
that no two tenants' namespace spaces overlap (`acme` and `acme-dev` cannot both exist), so a
tenant can create namespaces without ever learning whether another tenant's namespace exists.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.auth import tokens
from app.db.models import Tenant, Token
from app.errors import (
    AlreadyExists,
    Cause,
    Conflict,
    Invalid,
    NotFound,
    ResourceRef,
    Unauthorized,
)
from app.kube.meta import now, validate_name
from app.namespaces import service as namespaces

RESERVED_NAMES = frozenset(
    {"default", "kube-system", "kube-public", "kube-node-lease", "tessera-system", "admin"}
)

# A tenant owns `<name>` and `<name>-*`: `kube` or `tessera` would own kube-system or
# tessera-billing, so these are reserved too, with every name that starts with them and "-".
RESERVED_PREFIXES = ("kube", "tessera")

Role = Literal["admin", "tenant", "node", "controller"]


@dataclass(frozen=True)
class Principal:
    role: Role
    tenant_id: int | None
    tenant_name: str | None
    key_id: str
    node_name: str | None = None  # a node token's node (its agent acts for it alone)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_node(self) -> bool:
        return self.role == "node"

    @property
    def is_controller(self) -> bool:
        """The controller manager's token: workload kinds, their pods and events in every
        tenant namespace, its Lease in kube-system (app/auth/rules.py)."""
        return self.role == "controller"

    @property
    def sees_every_tenant(self) -> bool:
        """Lists and watches across namespaces show every tenant's objects (what the rules let
        it list), not one tenant's."""
        return self.role in ("admin", "controller")

    @property
    def username(self) -> str:
        if self.is_admin:
            return "tessera:admin"
        if self.is_node:
            return f"system:node:{self.node_name}"  # as Kubernetes names a kubelet
        if self.is_controller:
            return "system:tessera-controller-manager"
        return f"tessera:tenant:{self.tenant_name}"

    @property
    def groups(self) -> tuple[str, ...]:
        role = {
            "admin": "tessera:admins",
            "node": "system:nodes",
            "controller": "tessera:controllers",
        }.get(self.role, "tessera:tenants")
        return (role, "system:authenticated")


MAX_WEIGHT = 1000


def check_weight(name: str, weight: object) -> int:
    """A tenant's fair-share weight: a whole number from 1 to `MAX_WEIGHT`."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise Invalid(
            f'Tenant "{name}" is invalid: spec.weight: Invalid value: {weight!r}: must be a '
            f"whole number from 1 to {MAX_WEIGHT}",
            causes=[Cause("spec.weight", f"must be a whole number from 1 to {MAX_WEIGHT}")],
        )
    return weight


def create_tenant(session: Session, *, name: str, weight: int = 1) -> Tenant:
    """Create a tenant and its first namespace (named like the tenant). `weight`: its share
    of a contended pool against the other tenants' (`scheduler/fairshare.py`)."""
    weight = check_weight(name, weight)
    causes = validate_name(name, "metadata.name", label=True)
    if causes:
        raise Invalid(f'Tenant "{name}" is invalid: {causes[0].message}', causes=causes)
    if (
        name in RESERVED_NAMES
        or name in RESERVED_PREFIXES
        or name.startswith(tuple(f"{p}-" for p in RESERVED_PREFIXES))
        or any(reserved.startswith(name + "-") for reserved in RESERVED_NAMES)
    ):
        raise Invalid(
            f'Tenant "{name}" is invalid: the name is reserved; choose another',
            causes=[Cause("metadata.name", "reserved name")],
        )
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise AlreadyExists(f'tenants "{name}" already exists', ref=ResourceRef("tenants", name))
    for other in session.scalars(select(Tenant.name)):
        if name.startswith(other + "-") or other.startswith(name + "-"):
            raise Invalid(
                f'Tenant "{name}" is invalid: its namespaces ("{name}", "{name}-*") would '
                f'overlap those of tenant "{other}"; choose a name that is not a "-" prefix '
                "of an existing tenant (or the reverse)",
                causes=[Cause("metadata.name", f"overlaps tenant {other}")],
            )
    if namespaces.exists(session, name):
        raise AlreadyExists(
            f'namespaces "{name}" already exists; choose another tenant name',
            ref=ResourceRef("namespaces", name),
        )
    tenant = Tenant(name=name, uid=str(uuid.uuid4()), created_at=now(), weight=weight)
    session.add(tenant)
    session.flush()
    namespaces.create(session, name=name, tenant_id=tenant.id)
    return tenant


def get_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f'tenants "{name}" not found', ref=ResourceRef("tenants", name))
    return tenant


def set_weight(session: Session, *, name: str, weight: int) -> Tenant:
    """Change a tenant's fair-share weight; the scheduler takes it at its next cycle."""
    weight = check_weight(name, weight)
    tenant = get_tenant(session, name)
    tenant.weight = weight
    session.flush()
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.name)))


def create_token(
    session: Session,
    *,
    role: Role,
    tenant: str | None = None,
    node: str | None = None,
    description: str = "",
) -> tokens.NewToken:
    """Issue a token. Its value is returned once and never stored. A node token (`node`: the
    node's name) lets that node's agent act for the node alone."""
    tenant_id = None
    if (role == "node") != (node is not None):
        raise Invalid("a node token needs a node and only a node token has one: give --node NAME")
    if node is not None:
        causes = validate_name(node, "node")
        if causes:
            raise Invalid(f'node name "{node[:253]}" is invalid: {causes[0].message}')
        if tenant is not None:
            raise Invalid("a node token belongs to no tenant: drop --tenant")
    if role == "tenant":
        if tenant is None:
            raise Invalid("a tenant token needs a tenant: give --tenant NAME")
        tenant_id = get_tenant(session, tenant).id
    elif tenant is not None:
        if role == "admin":
            raise Invalid("an admin token belongs to no tenant: drop --tenant or --admin")
        raise Invalid(f"a {role} token belongs to no tenant: drop --tenant")
    new = tokens.generate()
    session.add(
        Token(
            key_id=new.key_id,
            secret_hash=tokens.hash_secret(new.secret),
            role=role,
            tenant_id=tenant_id,
            node_name=node,
            description=description,
            created_at=now(),
        )
    )
    session.flush()
    return new


def key_id_of(text: str) -> str:
    """The key id in any form an operator may paste: the whole token, `tsr_<key id>`,
    `tsr_<key id>_…` (as `tessera token list` prints it) or the bare 16 hex characters."""
    value = text.strip().rstrip("…").rstrip(".")
    if value.startswith(tokens.PREFIX):
        value = value[len(tokens.PREFIX) :]
    key_id = value.partition("_")[0]
    if len(key_id) != 16 or any(c not in "0123456789abcdef" for c in key_id):
        raise Invalid(
            f'"{text[:40]}" is not a token or key id: give the token, tsr_<key id> or the '
            "16 hex characters of its key id (tessera token list shows them)"
        )
    return key_id


def revoke_token(session: Session, *, key_id: str) -> None:
    """Revoke by key id in any of the forms `key_id_of` accepts."""
    key = key_id_of(key_id)
    result = session.execute(
        update(Token)
        .where(Token.key_id == key, Token.revoked_at.is_(None))
        .values(revoked_at=now())
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        if session.scalar(select(Token.id).where(Token.key_id == key)) is not None:
            raise Conflict(f'token "tsr_{key}" is already revoked')
        raise NotFound(f'token "tsr_{key}" not found')


def list_tokens(session: Session, *, tenant: str | None = None) -> list[tuple[Token, str | None]]:
    query = select(Token, Tenant.name).outerjoin(Tenant, Tenant.id == Token.tenant_id)
    if tenant is not None:
        query = query.where(Tenant.name == tenant)
    return [(t, n) for t, n in session.execute(query.order_by(Token.id))]


class Authenticator:
    """Checks bearer tokens; verified tokens are cached for `ttl` seconds.

    The cache keeps the stored hash, so a cached entry still compares the presented secret in
    constant time. A revoked token stops working within `ttl` seconds.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._cache: dict[str, tuple[str, Principal, float]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Principal | None:
        parts = tokens.split(token)
        if parts is None or self.ttl <= 0:
            return None
        key_id, secret = parts
        entry = self._cache.get(key_id)
        if entry is None or entry[2] < time.monotonic():
            return None
        if not tokens.matches(secret, entry[0]):
            return None
        return entry[1]

    def authenticate(self, session: Session, token: str) -> Principal:
        parts = tokens.split(token)
        if parts is None:
            raise Unauthorized("invalid bearer token: Tessera tokens look like tsr_<key>_<secret>")
        key_id, secret = parts
        row = session.execute(
            select(Token.secret_hash, Token.role, Token.tenant_id, Token.node_name, Tenant.name)
            .outerjoin(Tenant, Tenant.id == Token.tenant_id)
            .where(Token.key_id == key_id, Token.revoked_at.is_(None))
        ).first()
        if row is None or not tokens.matches(secret, row.secret_hash):
            raise Unauthorized("invalid bearer token: unknown, revoked or mistyped")
        principal = Principal(
            role=row.role,
            tenant_id=row.tenant_id,
            tenant_name=row.name,
            key_id=key_id,
            node_name=row.node_name,
        )
        if self.ttl > 0:
            with self._lock:
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[key_id] = (row.secret_hash, principal, time.monotonic() + self.ttl)
        return principal
