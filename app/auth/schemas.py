"""Tenants and their tokens as the admin API returns them (`tessera.io/v1`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta


class TenantSpec(KubeModel):
    """What the admin sets on a tenant."""

    weight: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Fair share: when the pool is contended the scheduler divides the tenant's "
        "dominant share (of vCPU, memory, GPU VRAM and SMs) by this; a tenant of weight 2 is "
        "entitled to twice the share of one of weight 1.",
    )


class Tenant(KubeModel):
    """A customer: owns the namespace of its name and any `<name>-<suffix>` namespaces."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["Tenant"] = "Tenant"
    metadata: ObjectMeta
    spec: TenantSpec | None = None


class TenantList(KubeModel):
    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["TenantList"] = "TenantList"
    metadata: ListMeta
    items: list[Tenant]


class TenantToken(KubeModel):
    """A new token. The secret is shown only in this answer; Tessera keeps only its hash."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["TenantToken"] = "TenantToken"
    tenant: str
    key_id: str = Field(description="The token's public part; `tessera token revoke` takes it.")
    token: str = Field(description="The bearer token: tsr_<key id>_<secret>.")


class NodeTokenRequest(KubeModel):
    """Ask for a node agent's token: it acts for `node` alone."""

    api_version: Literal["tessera.io/v1"] | None = "tessera.io/v1"
    kind: Literal["NodeToken"] | None = "NodeToken"
    node: str = Field(max_length=253, description="The node the token acts for.")
    description: str = Field(default="", max_length=255)


class NodeToken(KubeModel):
    """A new node token. The secret is shown only in this answer; Tessera keeps only its hash."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["NodeToken"] = "NodeToken"
    node: str
    key_id: str = Field(description="The token's public part; `tessera token revoke` takes it.")
    token: str = Field(description="The bearer token: tsr_<key id>_<secret>.")
