"""The Event as the API returns it (the Kubernetes `v1/Event` shape)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta
from app.pods.schemas import ObjectReference


class EventSource(KubeModel):
    component: str | None = None
    host: str | None = None


class Event(KubeModel):
    """Something that happened to an object: created, spec rounded, scheduled, evicted, ..."""

    api_version: Literal["v1"] = "v1"
    kind: Literal["Event"] = "Event"
    metadata: ObjectMeta
    involved_object: ObjectReference = Field(description="The object the event is about.")
    reason: str = Field(description="Short machine-readable cause, e.g. Scheduled.")
    message: str = Field(description="What happened, for a person.")
    type: Literal["Normal", "Warning"]
    source: EventSource
    reporting_component: str
    reporting_instance: str
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    count: int = Field(ge=1)


class EventList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["EventList"] = "EventList"
    metadata: ListMeta
    items: list[Event]
