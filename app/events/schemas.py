"""The Event as the API returns it (the Kubernetes `v1/Event` shape)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

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


class _In(KubeModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class InvolvedIn(_In):
    kind: Annotated[str, Field(min_length=1, max_length=63)]  # a Pod, or a workload kind
    api_version: Annotated[str, Field(max_length=253)] | None = None
    name: Annotated[str, Field(max_length=253)]
    namespace: Annotated[str, Field(max_length=63)] | None = None
    uid: Annotated[str, Field(max_length=64)] | None = None
    field_path: Annotated[str, Field(max_length=256)] | None = None


class EventSourceIn(_In):
    component: Annotated[str, Field(max_length=64)] | None = None


class EventIn(_In):
    """An event a node's agent writes about a pod bound to it (`POST .../events`, as the
    kubelet does: Pulling, Pulled, Failed, Unhealthy, Killing, ...), or the controller manager
    about a workload (SuccessfulCreate, ScalingReplicaSet, Completed, ...)."""

    involved_object: InvolvedIn
    reason: Annotated[str, Field(min_length=1, max_length=64)]
    message: Annotated[str, Field(max_length=1024)] = ""
    type: Literal["Normal", "Warning"] = "Normal"
    reporting_component: Annotated[str, Field(max_length=64)] | None = None
    source: EventSourceIn | None = None
    first_timestamp: Annotated[str, Field(max_length=64)] | None = None
