"""HTTP for pod groups: `/apis/tessera.io/v1/namespaces/{namespace}/podgroups` (`kubectl get pg`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.constants import TESSERA_GROUP
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import apply_patch, decode, decode_object, patch_type_of, section
from app.kube.listing import Current, serve_list
from app.kube.params import DryRunQ, FieldValidationQ, ListQueryDep, PrettyQ
from app.podgroups import service
from app.podgroups.schemas import PodGroup, PodGroupList
from app.pods.validation import decode_model

router = APIRouter(tags=["podgroups"], responses=STATUS_RESPONSES)
BASE = f"/apis/{TESSERA_GROUP}/v1"
RESOURCE = "podgroups"
BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/PodGroup"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/PodGroup"}},
        },
    }
}


def _current(principal: Principal, namespace: str | None) -> Current:
    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        tenant = None if principal.is_admin else principal.tenant_id
        return service.list_groups(session, tenant_id=tenant, namespace=namespace), rv

    return read


@router.get(
    f"{BASE}/podgroups",
    responses={200: {"model": PodGroupList}},
    summary="List pod groups in every namespace the caller may see",
)
async def list_all_groups(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    require(
        principal, verb="watch" if query.watch else "list", resource=RESOURCE, group=TESSERA_GROUP
    )
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="PodGroup",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, None),
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/podgroups",
    responses={200: {"model": PodGroupList}},
    summary="List pod groups",
)
async def list_groups(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb="watch" if query.watch else "list",
        resource=RESOURCE,
        group=TESSERA_GROUP,
    )
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="PodGroup",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, namespace),
        namespace=namespace,
    )


@router.post(
    f"{BASE}/namespaces/{{namespace}}/podgroups",
    status_code=201,
    responses={201: {"model": PodGroup}},
    openapi_extra=BODY,
    summary="Create a pod group (a gang)",
)
async def create_group(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    ns = await authorize_namespace(
        services, principal, namespace, verb="create", resource=RESOURCE, group=TESSERA_GROUP
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    if section(document, "metadata").get("namespace") not in (None, "", namespace):
        raise BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    body, warnings = decode_model(
        PodGroup, document, kind="PodGroup", mode=field_validation or "Warn"
    )
    obj = await services.write_unless_dry(
        dry_run, lambda s: service.create(s, namespace=ns, body=body)
    )
    return json_response(obj, 201, warnings)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": PodGroup}},
    summary="Read a pod group",
)
async def get_group(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb="get",
        resource=RESOURCE,
        name=name,
        group=TESSERA_GROUP,
    )
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


@router.patch(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": PodGroup}},
    summary="Change a pod group",
)
async def patch_group(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb="patch",
        resource=RESOURCE,
        name=name,
        group=TESSERA_GROUP,
    )
    patch_type = patch_type_of(request.headers.get("content-type"))
    patch = decode(await request.body(), patch_type)

    warnings: list[str] = []

    def work(session: Session) -> dict[str, Any]:
        current = service.get(session, namespace=namespace, name=name)
        desired = apply_patch(current, patch, patch_type)
        desired.pop("status", None)
        body, found = decode_model(
            PodGroup, desired, kind="PodGroup", mode=field_validation or "Warn"
        )
        warnings[:] = found
        return service.update_group(session, namespace=namespace, name=name, body=body)

    return json_response(await services.write_unless_dry(dry_run, work), warnings=warnings)


@router.delete(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": PodGroup}},
    summary="Delete a pod group that has no pods",
)
async def delete_group(
    namespace: str,
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb="delete",
        resource=RESOURCE,
        name=name,
        group=TESSERA_GROUP,
    )
    return json_response(
        await services.write_unless_dry(
            dry_run, lambda s: service.delete_group(s, namespace=namespace, name=name)
        )
    )
