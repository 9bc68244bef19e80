"""v1 ResourceQuota: the most a namespace's live pods may use together.

`spec.hard` names the limits (see app/quotas/service.py for what each key counts); the pod
create or resize that would pass one is refused with 403. `status` is not stored: it is
computed as the quota is read, `hard` from the spec and `used` from the namespace's live pods
(so a watch's events carry the status of when the quota last changed, and a get the current
one). Tenants read the quotas of their namespaces; only the admin writes them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field
from sqlalchemy.orm import Session

from app.errors import Cause
from app.kube.meta import KubeModel, ListMeta, ObjectMeta, Quantity
from app.kube.tables import Column, age
from app.quotas import service as quotas
from app.registry.strategy import Obj, Strategy


class ResourceQuotaSpec(KubeModel):
    hard: dict[str, Quantity] | None = Field(
        default=None,
        description="The most the namespace's live pods may use together, by resource: "
        + ", ".join(quotas.KEYS)
        + ", and count/<resource> for every namespaced kind (count/configmaps, count/secrets, "
        "count/resourcequotas, ...). CPU and memory count each pod's sold spec (its requests and limits are both that).",
    )


class ResourceQuotaStatus(KubeModel):
    hard: dict[str, Quantity] | None = Field(default=None, description="As spec.hard.")
    used: dict[str, Quantity] | None = Field(
        default=None, description="What the namespace's live pods use now, by the keys of hard."
    )


class ResourceQuota(KubeModel):
    """Bounds on what a namespace's live pods use together."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["ResourceQuota"] | None = "ResourceQuota"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ResourceQuotaSpec | None = None
    status: ResourceQuotaStatus | None = None


class ResourceQuotaList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["ResourceQuotaList"] = "ResourceQuotaList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[ResourceQuota]


class ResourceQuotaStrategy(Strategy):
    kind = "ResourceQuota"
    resource = "resourcequotas"
    singular = "resourcequota"
    model = ResourceQuota
    list_model = ResourceQuotaList
    short_names = ("quota",)
    has_status = True
    tenants_read_only = True
    summary = "the most a namespace's live pods may use together"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the ResourceQuota.", 0),
        ("Age", "string", "Time since creation.", 0),
        ("Request", "string", "Used and hard of each limit but limits.*.", 0),
        ("Limit", "string", "Used and hard of each limits.* limit.", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        status = obj.get("status") or {}
        used, hard = status.get("used") or {}, status.get("hard") or {}

        def cell(keys: list[str]) -> str:
            return ", ".join(f"{k}: {used.get(k, '0')}/{hard[k]}" for k in keys)

        keys = sorted(hard)
        return [
            obj["metadata"]["name"],
            age(obj["metadata"].get("creationTimestamp")),
            cell([k for k in keys if not k.startswith("limits.")]),
            cell([k for k in keys if k.startswith("limits.")]),
        ]

    def prepare_create(self, obj: Obj) -> None:
        obj.pop("status", None)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        obj.pop("status", None)  # computed as it is read, never stored

    def validate(self, obj: Obj) -> list[Cause]:
        return quotas.hard_causes((obj.get("spec") or {}).get("hard"))

    def present(self, session: Session, obj: Obj) -> None:
        quotas.status(session, obj)
