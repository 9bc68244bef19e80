"""HTTP for namespaces: a tenant lists and creates its own; the admin sees all."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import (
    APPLY_PATCH,
    apply_patch,
    decode,
    decode_object,
    patch_body,
    patch_type_of,
    section,
)
from app.kube.listing import serve_list
from app.kube.params import (
    DryRunQ,
    FieldManagerQ,
    FieldValidationQ,
    ForceQ,
    GracePeriodQ,
    ListQueryDep,
    PrettyQ,
    PropagationPolicyQ,
)
from app.namespaces import service
from app.namespaces.schemas import Namespace, NamespaceList
from app.namespaces.schemas import Namespace as NamespaceModel
from app.pods.validation import decode_model

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
    require(principal, verb="watch" if query.watch else "list", resource="namespaces")

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


NAMESPACE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Namespace"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/Namespace"}},
            "application/vnd.kubernetes.protobuf": {"schema": {"type": "string"}},
        },
    }
}


def _decode(
    raw: bytes, content_type: str | None, mode: str | None, *, name: str | None = None
) -> NamespaceModel:
    body = decode_object(raw, content_type)
    if body.get("kind") not in (None, "Namespace"):
        raise BadRequest(f"the object is a {body.get('kind')}, this endpoint takes a Namespace")
    body.setdefault("metadata", {})
    if name is not None:
        if section(body, "metadata").get("name") not in (None, name):
            raise BadRequest(f'the name in the body must match the URL ("{name}")')
        body["metadata"]["name"] = name
    # The server owns status; a body read back from the server carries it.
    body.pop("status", None)
    namespace, _ = decode_model(NamespaceModel, body, kind="Namespace", mode=mode or "Warn")  # type: ignore[arg-type]
    return namespace


@router.post(
    "/api/v1/namespaces",
    status_code=201,
    responses={201: {"model": Namespace}},
    openapi_extra=NAMESPACE_BODY,
    summary="Create a namespace (a tenant: named <tenant> or <tenant>-<suffix>)",
)
async def create_namespace(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    pretty: PrettyQ = None,
) -> Response:
    namespace = _decode(await request.body(), request.headers.get("content-type"), field_validation)
    meta = namespace.metadata
    name = str(meta.name or "")

    def work(s: Session) -> dict[str, Any]:
        return service.to_api(
            service.create_for(
                s,
                principal,
                name=name,
                labels=meta.labels or {},
                annotations=meta.annotations or {},
            )
        )

    obj = await (services.dry_run(work) if dry_run else services.write(work))
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


@router.patch(
    "/api/v1/namespaces/{name}",
    responses={200: {"model": Namespace}},
    openapi_extra=patch_body(apply=True),
    summary="Change a namespace's labels and annotations (server-side apply creates it)",
)
async def patch_namespace(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    force: ForceQ = None,
    pretty: PrettyQ = None,
) -> Response:
    patch_type = patch_type_of(request.headers.get("content-type"))
    raw = await request.body()
    if patch_type == APPLY_PATCH:
        if not field_manager:
            raise BadRequest(
                "fieldManager is required for apply requests (kubectl sends it; curl: add ?fieldManager=NAME)"
            )
        applied = _decode(raw, patch_type, field_validation or "Strict", name=name)

        def apply(s: Session) -> tuple[dict[str, Any], bool]:
            row, created = service.apply(
                s,
                principal,
                name,
                labels=applied.metadata.labels or {},
                annotations=applied.metadata.annotations or {},
            )
            return service.to_api(row), created

        obj, created = await (services.dry_run(apply) if dry_run else services.write(apply))
        services.namespaces.forget(name)
        return json_response(obj, 201 if created else 200)
    body = decode(raw, patch_type)

    def work(s: Session) -> dict[str, Any]:
        current = service.to_api(service.get(s, principal, name, verb="patch"))
        desired = apply_patch(current, body, patch_type)
        return _update(s, principal, name, desired, field_validation)

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))


@router.put(
    "/api/v1/namespaces/{name}",
    responses={200: {"model": Namespace}},
    openapi_extra=NAMESPACE_BODY,
    summary="Replace a namespace's labels and annotations",
)
async def replace_namespace(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    pretty: PrettyQ = None,
) -> Response:
    desired = decode_object(await request.body(), request.headers.get("content-type"))

    def work(s: Session) -> dict[str, Any]:
        return _update(s, principal, name, desired, field_validation)

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))


def _update(
    session: Session,
    principal: Principal,
    name: str,
    desired: dict[str, Any],
    field_validation: str | None,
) -> dict[str, Any]:
    namespace = _decode(orjson.dumps(desired), "application/json", field_validation, name=name)
    meta = namespace.metadata
    row = service.update_metadata(
        session,
        principal,
        name,
        labels=meta.labels or {},
        annotations=meta.annotations or {},
        resource_version=meta.resource_version,
    )
    return service.to_api(row)


@router.delete(
    "/api/v1/namespaces/{name}",
    responses={200: {"model": Namespace}},
    summary="Delete a namespace: it is Terminating until the pods it holds are gone",
)
async def delete_namespace(
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    grace_period_seconds: GracePeriodQ = None,
    propagation_policy: PropagationPolicyQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    def work(s: Session) -> dict[str, Any]:
        return service.to_api(service.delete(s, principal, name))

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    services.namespaces.forget(name)
    return json_response(obj)
