"""The PodGroup as the API accepts it (`tessera.io/v1`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.kube.meta import KubeModel, ListMeta, ObjectMeta

Level = Literal["nvlink", "node", "rack", "zone"]


class Topology(KubeModel):
    required: Level | None = Field(
        default=None, description="Every member inside one domain of this level, or none placed."
    )
    preferred: Level | None = Field(
        default=None, description="Inside one domain of this level where possible."
    )


class PodGroupSpec(KubeModel):
    min_member: int = Field(ge=1, le=4096, description="Pods that must be placed together.")
    topology: Topology = Field(
        default_factory=Topology, description="Where the members must or should be, together."
    )


class PodGroup(KubeModel):
    """A gang: pods labelled tessera.io/pod-group=<name> are placed all together or not at
    all, once minMember of them exist."""

    api_version: Literal["tessera.io/v1"] | None = "tessera.io/v1"
    kind: Literal["PodGroup"] | None = "PodGroup"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodGroupSpec
    status: dict[str, object] | None = None


class PodGroupList(KubeModel):
    api_version: Literal["tessera.io/v1"] = "tessera.io/v1"
    kind: Literal["PodGroupList"] = "PodGroupList"
    metadata: ListMeta
    items: list[PodGroup]


class CoschedulingPodGroupSpec(KubeModel):
    """scheduler-plugins' `PodGroupSpec` (scheduling.x-k8s.io/v1alpha1)."""

    min_member: int = Field(
        default=1, ge=1, le=4096, description="Pods that must be placed together."
    )
    schedule_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=86400,
        description="Seconds the complete gang may wait to be placed before the group is "
        "marked Failed (not placed later unless the PodGroup is changed); unset: no limit.",
    )
    min_resources: dict[str, str | int] | None = Field(
        default=None,
        max_length=32,
        description="Accepted as written and checked to be quantities; Tessera places the "
        "members by their own requests, so it adds no constraint.",
    )


class CoschedulingPodGroup(KubeModel):
    """A gang in scheduler-plugins' form: pods labelled scheduling.x-k8s.io/pod-group=<name>
    are placed all together or not at all, once minMember of them exist. Topology through the
    annotations tessera.io/topology-required and tessera.io/topology-preferred."""

    api_version: Literal["scheduling.x-k8s.io/v1alpha1"] | None = "scheduling.x-k8s.io/v1alpha1"
    kind: Literal["PodGroup"] | None = "PodGroup"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: CoschedulingPodGroupSpec = Field(default_factory=CoschedulingPodGroupSpec)
    status: dict[str, object] | None = None


class CoschedulingPodGroupList(KubeModel):
    api_version: Literal["scheduling.x-k8s.io/v1alpha1"] = "scheduling.x-k8s.io/v1alpha1"
    kind: Literal["PodGroupList"] = "PodGroupList"
    metadata: ListMeta
    items: list[CoschedulingPodGroup]
