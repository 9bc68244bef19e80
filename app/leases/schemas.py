"""The Lease as the API accepts it (`coordination.k8s.io/v1`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta

# One year: longer than any heartbeat or leader term is a mistake, and bounds the arithmetic.
MAX_LEASE_SECONDS = 365 * 86400


class LeaseSpec(KubeModel):
    holder_identity: str | None = Field(
        default=None, max_length=253, description="Who holds the lease (a node agent: its node)."
    )
    lease_duration_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LEASE_SECONDS,
        description="How long after renewTime the holder is presumed gone.",
    )
    acquire_time: str | None = Field(
        default=None, max_length=64, description="When the current holder took the lease."
    )
    renew_time: str | None = Field(
        default=None, max_length=64, description="When the holder last renewed it."
    )
    lease_transitions: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="How many times the holder changed."
    )
    preferred_holder: str | None = Field(default=None, max_length=253)
    strategy: str | None = Field(default=None, max_length=64)


class Lease(KubeModel):
    """A lease: a node's heartbeat (namespace kube-node-lease, named like the node), or a
    claim to leadership held by renewing it."""

    api_version: Literal["coordination.k8s.io/v1"] | None = "coordination.k8s.io/v1"
    kind: Literal["Lease"] | None = "Lease"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LeaseSpec = Field(default_factory=LeaseSpec)


class LeaseList(KubeModel):
    api_version: Literal["coordination.k8s.io/v1"] = "coordination.k8s.io/v1"
    kind: Literal["LeaseList"] = "LeaseList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Lease]
