"""Kinds Tessera serves always empty, because clients expect them of any cluster.

- PodDisruptionBudgets (`policy/v1`): Tessera keeps no budgets, so an eviction is never refused
  for one. The `policy` group must list a resource for `kubectl drain` to evict through
  `pods/eviction` (kubectl's discovery refuses a group-version with no resources).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import Response

from app.constants import POLICY_GROUP
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, respond
from app.errors import STATUS_RESPONSES, not_found
from app.kube.listing import list_object
from app.kube.meta import KubeModel, ListMeta

router = APIRouter(tags=["empty kinds"], responses=STATUS_RESPONSES)


class PodDisruptionBudgetList(KubeModel):
    """Always empty: Tessera keeps no disruption budgets."""

    api_version: Literal["policy/v1"] = "policy/v1"
    kind: Literal["PodDisruptionBudgetList"] = "PodDisruptionBudgetList"
    metadata: ListMeta
    items: list[dict[str, Any]] = Field(max_length=0)


def serve_empty(
    plural: str,
    list_model: type[KubeModel],
    *,
    group: str = "",
    words: str,
) -> None:
    """GET of the list (in one namespace and across all) and of one object (always 404)."""
    prefix = f"/apis/{group}/v1" if group else "/api/v1"
    kind, api_version = list_model.__name__, f"{group}/v1" if group else "v1"

    async def empty(request: Request, services: ServicesDep) -> Response:
        version = await services.read(current_resource_version)
        return respond(request, list_object(kind, api_version, [], version, None))

    async def list_all(
        request: Request, services: ServicesDep, principal: PrincipalDep
    ) -> Response:
        return await empty(request, services)

    async def list_in(
        namespace: str, request: Request, services: ServicesDep, principal: PrincipalDep
    ) -> Response:
        await authorize_namespace(
            services, principal, namespace, verb="list", resource=plural, group=group
        )
        return await empty(request, services)

    async def get_one(
        namespace: str, name: str, services: ServicesDep, principal: PrincipalDep
    ) -> Response:
        await authorize_namespace(
            services, principal, namespace, verb="get", resource=plural, name=name, group=group
        )
        raise not_found(plural, name, group=group)

    item = f"{prefix}/namespaces/{{namespace}}/{plural}"
    router.add_api_route(
        f"{prefix}/{plural}",
        list_all,
        methods=["GET"],
        responses={200: {"model": list_model}},
        summary=f"{words} in every namespace (always none)",
        name=f"list_all_{plural}",
    )
    router.add_api_route(
        item,
        list_in,
        methods=["GET"],
        responses={200: {"model": list_model}},
        summary=f"{words} (always none)",
        name=f"list_{plural}",
    )
    router.add_api_route(
        item + "/{name}",
        get_one,
        methods=["GET"],
        status_code=404,
        summary=f"One of the {words} (there are none: always 404)",
        name=f"get_{plural}",
    )


serve_empty(
    "poddisruptionbudgets",
    PodDisruptionBudgetList,
    group=POLICY_GROUP,
    words="PodDisruptionBudgets",
)
