"""HTTP for namespaces: a tenant lists and creates its own; the admin sees all."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import decode_object, section
from app.kube.listing import serve_list
from app.kube.params import ListQueryDep, PrettyQ
from app.namespaces import service
from app.namespaces.schemas import Namespace, NamespaceList

router = APIRouter(tags=["namespaces"], responses=STATUS_RESPONSES)
FIELDS = ("metadata.name", "status.phase")


@router.get(
    "/api/v1/namespaces",
    responses={200: {"model": NamespaceList}},
    summary="List the namespaces the caller may see",
)
async def list_namespaces(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    def current(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        return [service.to_api(r) for r in service.list_visible(session, principal)], rv

    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Namespace",
        api_version="v1",
        field_selectors=FIELDS,
        current=current,
    )


@router.post(
    "/api/v1/namespaces",
    status_code=201,
    responses={201: {"model": Namespace}},
    summary="Create a namespace (a tenant: named <tenant> or <tenant>-<suffix>)",
)
async def create_namespace(
    request: Request, services: ServicesDep, principal: PrincipalDep, pretty: PrettyQ = None
) -> Response:
    body = decode_object(await request.body(), request.headers.get("content-type"))
    if body.get("kind") not in (None, "Namespace"):
        raise BadRequest(f"the object is a {body.get('kind')}, this endpoint takes a Namespace")
    meta = section(body, "metadata")
    name = str(meta.get("name") or "")
    obj = await services.write(
        lambda s: service.to_api(
            service.create_for(
                s,
                principal,
                name=name,
                labels=section(meta, "labels"),
                annotations=section(meta, "annotations"),
            )
        )
    )
    services.namespaces.forget(name)
    return json_response(obj, 201)


@router.get(
    "/api/v1/namespaces/{name}", responses={200: {"model": Namespace}}, summary="Read a namespace"
)
async def get_namespace(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    return respond(
        request, await services.read(lambda s: service.to_api(service.get(s, principal, name)))
    )


@router.delete(
    "/api/v1/namespaces/{name}",
    responses={200: {"model": Namespace}},
    summary="Delete an empty namespace",
)
async def delete_namespace(
    name: str, services: ServicesDep, principal: PrincipalDep, pretty: PrettyQ = None
) -> Response:
    obj = await services.write(lambda s: service.to_api(service.delete(s, principal, name)))
    services.namespaces.forget(name)
    return json_response(obj)
