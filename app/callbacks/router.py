"""HTTP for callbacks: `/apis/tessera.io/v1/namespaces/{namespace}/callbacks` (`kubectl get
callbacks`), their `rotate` subresource (a new signing secret) and their `deliveries`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.callbacks import service
from app.callbacks.schemas import Callback, CallbackDeliveryList, CallbackList
from app.constants import TESSERA_GROUP
from app.db.engine import current_resource_version
from app.deps import (
    PrincipalDep,
    Services,
    ServicesDep,
    authorize_namespace,
    json_response,
    respond,
)
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import apply_patch, decode, decode_object, patch_type_of, section
from app.kube.listing import Current, serve_list
from app.kube.params import DryRunQ, FieldValidationQ, ListQueryDep, PrettyQ
from app.namespaces.service import NamespaceInfo
from app.pods.validation import decode_model

router = APIRouter(tags=["callbacks"], responses=STATUS_RESPONSES)
BASE = f"/apis/{TESSERA_GROUP}/v1"
RESOURCE = "callbacks"
BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Callback"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/Callback"}},
        },
    }
}


def _current(principal: Principal, namespace: str | None) -> Current:
    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        tenant = None if principal.is_admin else principal.tenant_id
        return service.list_callbacks(session, tenant_id=tenant, namespace=namespace), rv

    return read


async def _authorize(
    services: Services,
    principal: Principal,
    namespace: str,
    verb: str,
    name: str = "",
    sub: str = "",
) -> NamespaceInfo:
    return await authorize_namespace(
        services,
        principal,
        namespace,
        verb=verb,
        resource=f"{RESOURCE}/{sub}" if sub else RESOURCE,
        name=name,
        group=TESSERA_GROUP,
    )


@router.get(
    f"{BASE}/callbacks",
    responses={200: {"model": CallbackList}},
    summary="List callbacks in every namespace the caller may see",
)
async def list_all_callbacks(
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
        kind="Callback",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, None),
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/callbacks",
    responses={200: {"model": CallbackList}},
    summary="List callbacks",
)
async def list_callbacks(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    await _authorize(services, principal, namespace, "watch" if query.watch else "list")
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Callback",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, namespace),
        namespace=namespace,
    )


@router.post(
    f"{BASE}/namespaces/{{namespace}}/callbacks",
    status_code=201,
    responses={201: {"model": Callback}},
    openapi_extra=BODY,
    summary="Create a callback; the answer's status.signingSecret is shown this once",
)
async def create_callback(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    ns = await _authorize(services, principal, namespace, "create")
    document = decode_object(await request.body(), request.headers.get("content-type"))
    if section(document, "metadata").get("namespace") not in (None, "", namespace):
        raise BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    document.pop("status", None)
    body, warnings = decode_model(
        Callback, document, kind="Callback", mode=field_validation or "Warn"
    )
    obj = await services.write_unless_dry(
        dry_run, lambda s: service.create(s, namespace=ns, body=body)
    )
    return json_response(obj, 201, warnings)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}",
    responses={200: {"model": Callback}},
    summary="Read a callback (never its secret) with its most recent deliveries",
)
async def get_callback(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "get", name)
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


def _replace(
    session: Session, namespace: str, name: str, desired: dict[str, Any], mode: Any
) -> tuple[dict[str, Any], list[str]]:
    desired.pop("status", None)
    body, warnings = decode_model(Callback, desired, kind="Callback", mode=mode or "Warn")
    return service.update_callback(session, namespace=namespace, name=name, body=body), warnings


@router.put(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}",
    responses={200: {"model": Callback}},
    openapi_extra=BODY,
    summary="Replace a callback's labels, annotations and spec",
)
async def replace_callback(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "update", name)
    document = decode_object(await request.body(), request.headers.get("content-type"))
    obj, warnings = await services.write_unless_dry(
        dry_run, lambda s: _replace(s, namespace, name, document, field_validation)
    )
    return json_response(obj, warnings=warnings)


@router.patch(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}",
    responses={200: {"model": Callback}},
    summary="Change a callback",
)
async def patch_callback(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "patch", name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    patch = decode(await request.body(), patch_type)

    def work(session: Session) -> tuple[dict[str, Any], list[str]]:
        current = service.get(session, namespace=namespace, name=name)
        desired = apply_patch(current, patch, patch_type)
        return _replace(session, namespace, name, desired, field_validation)

    obj, warnings = await services.write_unless_dry(dry_run, work)
    return json_response(obj, warnings=warnings)


@router.delete(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}",
    responses={200: {"model": Callback}},
    summary="Delete a callback and its deliveries (pending ones are not sent)",
)
async def delete_callback(
    namespace: str,
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "delete", name)
    return json_response(
        await services.write_unless_dry(
            dry_run, lambda s: service.delete_callback(s, namespace=namespace, name=name)
        )
    )


@router.post(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}/rotate",
    status_code=201,
    responses={201: {"model": Callback}},
    summary="Issue a new signing secret (in status.signingSecret, shown this once); the old "
    "one stops signing at once",
)
async def rotate_secret(
    namespace: str,
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "create", name, sub="rotate")
    obj = await services.write_unless_dry(
        dry_run, lambda s: service.rotate_secret(s, namespace=namespace, name=name)
    )
    return json_response(obj, 201)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/callbacks/{{name}}/deliveries",
    responses={200: {"model": CallbackDeliveryList}},
    summary="A callback's deliveries, newest first: phase, attempts, last error and response",
)
async def list_deliveries(
    namespace: str,
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    limit: Annotated[
        int, Query(ge=1, le=service.MAX_DELIVERIES_LISTED, description="At most this many.")
    ] = 100,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "get", name, sub="deliveries")

    def read(session: Session) -> dict[str, Any]:
        items = service.list_deliveries(session, namespace=namespace, name=name, limit=limit)
        return {
            "apiVersion": service.API_VERSION,
            "kind": "CallbackDeliveryList",
            "metadata": {"resourceVersion": str(current_resource_version(session))},
            "items": items,
        }

    return json_response(await services.read(read))
