"""HTTP for leases: `/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.constants import COORDINATION_GROUP
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import APPLY_PATCH, apply_patch, decode, decode_object, patch_type_of, section
from app.kube.listing import Current, serve_list
from app.kube.params import DryRunQ, FieldValidationQ, ListQueryDep, PrettyQ
from app.leases import service
from app.leases.schemas import Lease, LeaseList
from app.pods.validation import decode_model

router = APIRouter(tags=["leases"], responses=STATUS_RESPONSES)
BASE = f"/apis/{COORDINATION_GROUP}/v1"
RESOURCE = "leases"
BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Lease"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/Lease"}},
        },
    }
}


def _current(namespace: str | None) -> Current:
    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        return service.list_leases(session, namespace=namespace), rv

    return read


def _check_body(document: dict[str, Any], namespace: str) -> None:
    if document.get("kind") not in (None, "Lease"):
        raise BadRequest(f"the object is a {document.get('kind')}, this endpoint takes a Lease")
    if section(document, "metadata").get("namespace") not in (None, "", namespace):
        raise BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


@router.get(
    f"{BASE}/leases",
    responses={200: {"model": LeaseList}},
    summary="List leases in every namespace (admin)",
)
async def list_all_leases(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    verb = "watch" if query.watch else "list"
    require(principal, verb=verb, resource=RESOURCE, group=COORDINATION_GROUP)
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Lease",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(None),
        scoped=False,
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/leases",
    responses={200: {"model": LeaseList}},
    summary="List leases (kube-node-lease: one per agent-managed node)",
)
async def list_leases(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    verb = "watch" if query.watch else "list"
    await authorize_namespace(
        services, principal, namespace, verb=verb, resource=RESOURCE, group=COORDINATION_GROUP
    )
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Lease",
        api_version=service.API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(namespace),
        namespace=namespace,
        scoped=False,
    )


@router.post(
    f"{BASE}/namespaces/{{namespace}}/leases",
    status_code=201,
    responses={201: {"model": Lease}},
    openapi_extra=BODY,
    summary="Create a lease (a node agent: its own, in kube-node-lease)",
)
async def create_lease(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    document = decode_object(await request.body(), request.headers.get("content-type"))
    name = str(section(document, "metadata").get("name") or "")[:253]
    ns = await authorize_namespace(
        services,
        principal,
        namespace,
        verb="create",
        resource=RESOURCE,
        group=COORDINATION_GROUP,
        name=name,
    )
    _check_body(document, namespace)
    body, warnings = decode_model(Lease, document, kind="Lease", mode=field_validation or "Warn")

    def work(session: Session) -> dict[str, Any]:
        return service.create(session, namespace=ns, body=body)

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 201, warnings)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/leases/{{name}}",
    responses={200: {"model": Lease}},
    summary="Read a lease",
)
async def get_lease(
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
        group=COORDINATION_GROUP,
    )
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


@router.put(
    f"{BASE}/namespaces/{{namespace}}/leases/{{name}}",
    responses={200: {"model": Lease}},
    openapi_extra=BODY,
    summary="Replace a lease (renew it); metadata.resourceVersion makes it conditional",
)
async def replace_lease(
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
        verb="update",
        resource=RESOURCE,
        name=name,
        group=COORDINATION_GROUP,
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    _check_body(document, namespace)
    body, warnings = decode_model(Lease, document, kind="Lease", mode=field_validation or "Warn")

    def work(session: Session) -> dict[str, Any]:
        return service.update_lease(session, namespace=namespace, name=name, body=body)

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 200, warnings)


@router.patch(
    f"{BASE}/namespaces/{{namespace}}/leases/{{name}}",
    responses={200: {"model": Lease}},
    summary="Change a lease (merge, strategic merge or JSON patch)",
)
async def patch_lease(
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
        group=COORDINATION_GROUP,
    )
    patch_type = patch_type_of(request.headers.get("content-type"))
    if patch_type == APPLY_PATCH:
        raise BadRequest("server-side apply is not offered for leases: use a merge patch or PUT")
    patch = decode(await request.body(), patch_type)
    warnings: list[str] = []

    def work(session: Session) -> dict[str, Any]:
        current = service.get(session, namespace=namespace, name=name)
        desired = apply_patch(current, patch, patch_type)
        body, found = decode_model(Lease, desired, kind="Lease", mode=field_validation or "Warn")
        warnings[:] = found
        return service.update_lease(session, namespace=namespace, name=name, body=body)

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, warnings=warnings)


@router.delete(
    f"{BASE}/namespaces/{{namespace}}/leases/{{name}}",
    responses={200: {"model": Lease}},
    summary="Delete a lease (a node without one is no longer agent-managed)",
)
async def delete_lease(
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
        group=COORDINATION_GROUP,
    )

    def work(session: Session) -> dict[str, Any]:
        return service.delete_lease(session, namespace=namespace, name=name)

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))
