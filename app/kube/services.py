"""Services: Tessera exposes no pods through cluster networking, so it holds no Services.

The kind is listed (always empty) because kubectl expects it of any cluster: `kubectl
cluster-info` lists the Services of `kube-system` and fails outright when the kind is missing; with
an empty list it prints the control plane's address, as against a minimal cluster.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import Response

from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, respond
from app.errors import STATUS_RESPONSES, not_found
from app.kube.listing import list_object
from app.kube.meta import KubeModel, ListMeta

router = APIRouter(tags=["services"], responses=STATUS_RESPONSES)

# Where kubectl looks for cluster services; it is no tenant's, and it is empty for everyone.
SYSTEM_NAMESPACE = "kube-system"


class ServiceList(KubeModel):
    """Always empty: Tessera has no Services."""

    api_version: Literal["v1"] = "v1"
    kind: Literal["ServiceList"] = "ServiceList"
    metadata: ListMeta
    items: list[dict[str, Any]] = Field(max_length=0)


async def _empty(request: Request, services: ServicesDep) -> Response:
    version = await services.read(current_resource_version)
    return respond(request, list_object("ServiceList", "v1", [], version, None))


@router.get(
    "/api/v1/services",
    responses={200: {"model": ServiceList}},
    summary="Services in every namespace (always none)",
)
async def list_all_services(
    request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    return await _empty(request, services)


@router.get(
    "/api/v1/namespaces/{namespace}/services",
    responses={200: {"model": ServiceList}},
    summary="Services (always none)",
)
async def list_services(
    namespace: str, request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    if namespace != SYSTEM_NAMESPACE:
        await authorize_namespace(services, principal, namespace, verb="list", resource="services")
    return await _empty(request, services)


@router.get(
    "/api/v1/namespaces/{namespace}/services/{name}",
    status_code=404,
    summary="A service (there are none: always 404)",
)
async def get_service(
    namespace: str, name: str, services: ServicesDep, principal: PrincipalDep
) -> Response:
    if namespace != SYSTEM_NAMESPACE:
        await authorize_namespace(
            services, principal, namespace, verb="get", resource="services", name=name
        )
    raise not_found("services", name)
