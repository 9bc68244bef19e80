"""The Callback as the API accepts it (`tessera.io/v1`), and its deliveries as served."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta


class CallbackSpec(KubeModel):
    url: str = Field(
        description="Where events are POSTed: https://..., or http:// to a loopback address "
        "(127.0.0.0/8, ::1, localhost). At most 2048 characters, no user:password@."
    )
    events: list[str] = Field(
        description="The event types to receive: one or more of GPUFault, PodFinished, "
        "EvictionNotice, BudgetThreshold (a tenant-wide event: sent to every callback of the "
        "tenant that names it)."
    )
    description: str | None = Field(default=None, description="A note, at most 1024 characters.")


class Callback(KubeModel):
    """An HTTP endpoint Tessera calls for events of the pods in this namespace. The signing
    secret is generated on create and returned once, in the create answer's
    status.signingSecret; POST .../callbacks/NAME/rotate issues a new one."""

    api_version: Literal["tessera.io/v1"] | None = "tessera.io/v1"
    kind: Literal["Callback"] | None = "Callback"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: CallbackSpec
    status: dict[str, object] | None = None


class CallbackList(KubeModel):
    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["CallbackList"] = "CallbackList"
    metadata: ListMeta
    items: list[Callback]


class Delivery(KubeModel):
    event_id: str = Field(description="The CloudEvents id: the same on every attempt.")
    type: str
    subject: str
    time: str
    phase: Literal["Pending", "Delivered", "Failed"]
    attempts: int
    last_attempt_time: str | None = None
    next_attempt_time: str | None = None
    last_error: str | None = None
    response_code: int | None = None


class CallbackDeliveryList(KubeModel):
    """A callback's deliveries, newest first (kept for `callbackDeliveryRetentionSeconds`)."""

    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["CallbackDeliveryList"] = "CallbackDeliveryList"
    metadata: ListMeta
    items: list[Delivery]
