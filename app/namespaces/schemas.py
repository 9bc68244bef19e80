"""The Namespace as the API returns it (the Kubernetes `v1/Namespace` shape)."""

from __future__ import annotations

from typing import Literal

from app.kube.meta import KubeModel, ListMeta, ObjectMeta


class NamespaceSpec(KubeModel):
    finalizers: list[str] | None = None


class NamespaceStatus(KubeModel):
    phase: Literal["Active", "Terminating"]


class Namespace(KubeModel):
    """A tenant's namespace: every namespaced object belongs to exactly one tenant through it."""

    api_version: Literal["v1"] = "v1"
    kind: Literal["Namespace"] = "Namespace"
    metadata: ObjectMeta
    spec: NamespaceSpec | None = None
    status: NamespaceStatus | None = None


class NamespaceList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["NamespaceList"] = "NamespaceList"
    metadata: ListMeta
    items: list[Namespace]
