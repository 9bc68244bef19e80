"""The `scale` subresource (autoscaling/v1 Scale): a kind's replicas, read and written alone,
as `kubectl scale` and autoscalers do (a kind declares where its replicas are: `scale_path`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.errors import BadRequest, Cause, invalid
from app.kube.meta import KubeModel, ObjectMeta
from app.registry.strategy import Obj, Strategy

MAX_REPLICAS = 2**31 - 1


class ScaleSpec(KubeModel):
    replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)


class ScaleStatus(KubeModel):
    replicas: int = 0
    selector: str | None = None


class Scale(KubeModel):
    """The replicas of a scalable object."""

    api_version: Literal["autoscaling/v1"] | None = "autoscaling/v1"
    kind: Literal["Scale"] | None = "Scale"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ScaleSpec | None = None
    status: ScaleStatus | None = None


def _at(obj: Obj, path: tuple[str, ...]) -> Any:
    node: Any = obj
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def scale_of(strategy: Strategy, obj: Obj) -> Obj:
    meta = obj["metadata"]
    kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {"replicas": int(_at(obj, strategy.scale_path or ()) or 0)},
        "status": {
            "replicas": int((obj.get("status") or {}).get("replicas") or 0),
            "selector": strategy.scale_selector(obj),
        },
    }


def replicas_of(scale: Any, strategy: Strategy) -> int:
    """The replicas a Scale body asks for (422 unless a whole number from 0)."""
    if not isinstance(scale, dict):
        raise BadRequest("a Scale must be a JSON object")
    if scale.get("kind") not in (None, "Scale"):
        raise BadRequest(
            f"the object is a {scale.get('kind')}, the scale subresource takes a Scale"
        )
    replicas = (scale.get("spec") or {}).get("replicas")
    if (
        isinstance(replicas, bool)
        or not isinstance(replicas, int)
        or not (0 <= replicas <= MAX_REPLICAS)
    ):
        name = str((scale.get("metadata") or {}).get("name") or "")
        raise invalid(
            "Scale",
            name,
            [
                Cause(
                    "spec.replicas",
                    f"Invalid value: {replicas!r}: must be a whole number from 0",
                )
            ],
            group="autoscaling",
        )
    return replicas
