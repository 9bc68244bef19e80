"""Tenants and their tokens as the admin API returns them (`tessera.io/v1`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta, Quantity


class TenantQuota(KubeModel):
    hard: dict[str, Quantity] | None = Field(
        default=None,
        description="The most all the tenant's namespaces use together, with the keys of a "
        "ResourceQuota's spec.hard (requests.cpu, nvidia.com/gpu, count/pods, count/<kind>...).",
    )


class SpendLimits(KubeModel):
    daily: str | None = Field(
        default=None, description="The most the tenant's statements of a UTC day may come to."
    )
    monthly: str | None = Field(
        default=None, description="The most its statements of a UTC month may come to."
    )


class Budget(SpendLimits):
    thresholds: list[int] | None = Field(
        default=None,
        description="Percentages of each limit at which an Event and a BudgetThreshold "
        "callback are sent, once per period (100 always is).",
    )
    stop_running_pods: bool | None = Field(
        default=None,
        description="true: at 100 % the tenant's running pods are stopped too, BestEffort first.",
    )


class TenantSpec(KubeModel):
    weight: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Fair share (the admin's; 1 when unset): when the pool is contended the "
        "scheduler divides the tenant's dominant share (of vCPU, memory, GPU VRAM and SMs) by "
        "this; a tenant of weight 2 is entitled to twice the share of one of weight 1.",
    )
    quota: TenantQuota | None = Field(default=None, description="Set by the admin.")
    spend_limits: SpendLimits | None = Field(
        default=None, description="The admin's ceilings, in the billing currency."
    )
    budget: Budget | None = Field(
        default=None,
        description="The tenant's own limits (at most the admin's ceilings) and thresholds.",
    )


class Tenant(KubeModel):
    """A customer: owns the namespace of its name and any `<name>-<suffix>` namespaces."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["Tenant"] = "Tenant"
    metadata: ObjectMeta
    spec: TenantSpec | None = None
    status: dict[str, object] | None = Field(
        default=None, description="Computed: the quota's used, the spend by the last meter."
    )


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
