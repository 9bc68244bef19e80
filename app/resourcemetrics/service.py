"""Usage reports of node agents, and the NodeMetrics and PodMetrics made of them.

Each node's agent reports, every `agent_metrics_seconds`, its pods' usage per container (CPU in
nanocores, memory working set in bytes: the engine's stats; the virtual runtime reports what
each container requests) and the node's (the sum of its pods'). The last report of each node
is kept (one row); a report older than three windows (or a minute) is no longer served, as
metrics-server drops a node it cannot scrape.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.constants import METRICS_GROUP
from app.db.models import ResourceUsage
from app.errors import NotFound, ResourceRef
from app.kube.meta import timestamp

API_VERSION = f"{METRICS_GROUP}/v1beta1"
MAX_PODS = 2000
MAX_CONTAINERS = 64


class Usage(BaseModel):
    cpu: int = Field(ge=0, le=10**15)  # nanocores
    memory: int = Field(ge=0, le=10**16)  # bytes


class ContainerUsage(Usage):
    name: str = Field(max_length=63)


class PodUsage(BaseModel):
    namespace: str = Field(max_length=63)
    name: str = Field(max_length=253)
    containers: list[ContainerUsage] = Field(max_length=MAX_CONTAINERS)


class UsageReport(BaseModel):
    window: float = Field(gt=0, le=3600)  # seconds the usage was measured over
    node: Usage
    pods: list[PodUsage] = Field(default_factory=list, max_length=MAX_PODS)


def record(session: Session, *, node: str, report: UsageReport, at: datetime) -> None:
    session.execute(delete(ResourceUsage).where(ResourceUsage.node == node))
    session.add(
        ResourceUsage(
            node=node,
            reported_at=at,
            window_seconds=report.window,
            body=report.model_dump(),
        )
    )


def _fresh(session: Session, at: datetime) -> list[ResourceUsage]:
    rows = session.scalars(select(ResourceUsage)).all()
    return [
        r for r in rows if at - r.reported_at <= timedelta(seconds=max(3 * r.window_seconds, 60.0))
    ]


def _usage(values: dict[str, Any]) -> dict[str, str]:
    return {"cpu": f"{int(values['cpu'])}n", "memory": f"{int(values['memory']) // 1024}Ki"}


def _window(seconds: float) -> str:
    return f"{seconds:g}s"


def node_metrics(
    session: Session, *, at: datetime, name: str | None = None
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for row in sorted(_fresh(session, at), key=lambda r: r.node):
        if name is not None and row.node != name:
            continue
        items.append(
            {
                "kind": "NodeMetrics",
                "apiVersion": API_VERSION,
                "metadata": {"name": row.node, "creationTimestamp": timestamp(at)},
                "timestamp": timestamp(row.reported_at),
                "window": _window(row.window_seconds),
                "usage": _usage(row.body["node"]),
            }
        )
    if name is not None and not items:
        raise NotFound(
            f'nodemetrics.metrics.k8s.io "{name}" not found',
            ref=ResourceRef("nodes", name, METRICS_GROUP),
        )
    return items


def pod_metrics(
    session: Session,
    *,
    at: datetime,
    namespaces: set[str] | None,
    name: str | None = None,
) -> list[dict[str, Any]]:
    """PodMetrics of the pods in `namespaces` (None: every namespace)."""
    items: list[dict[str, Any]] = []
    for row in _fresh(session, at):
        for pod in row.body.get("pods", []):
            if namespaces is not None and pod["namespace"] not in namespaces:
                continue
            if name is not None and pod["name"] != name:
                continue
            items.append(
                {
                    "kind": "PodMetrics",
                    "apiVersion": API_VERSION,
                    "metadata": {
                        "name": pod["name"],
                        "namespace": pod["namespace"],
                        "creationTimestamp": timestamp(at),
                    },
                    "timestamp": timestamp(row.reported_at),
                    "window": _window(row.window_seconds),
                    "containers": [
                        {"name": c["name"], "usage": _usage(c)} for c in pod["containers"]
                    ],
                }
            )
    if name is not None and not items:
        raise NotFound(
            f'podmetrics.metrics.k8s.io "{name}" not found',
            ref=ResourceRef("pods", name, METRICS_GROUP),
        )
    items.sort(key=lambda i: (i["metadata"]["namespace"], i["metadata"]["name"]))
    return items


def metrics_list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": f"{kind}List", "apiVersion": API_VERSION, "metadata": {}, "items": items}
