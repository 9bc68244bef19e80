"""HTTP for scheduler-plugins' coscheduling pod groups:
`/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups`, so manifests written for
that scheduler (Kubeflow, Volcano-style gangs) apply unchanged. The same gangs as tessera.io's
(app/podgroups/service.py); pods join with the label `scheduling.x-k8s.io/pod-group: NAME`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.constants import SCHEDULING_GROUP, SCHEDULING_VERSION
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import apply_patch, decode, decode_object, patch_type_of, section
from app.kube.listing import Current, serve_list
from app.kube.params import DryRunQ, FieldValidationQ, ListQueryDep, PrettyQ
from app.namespaces.service import NamespaceInfo
from app.podgroups import service
from app.podgroups.schemas import CoschedulingPodGroup, CoschedulingPodGroupList
from app.pods.validation import decode_model

router = APIRouter(tags=["podgroups"], responses=STATUS_RESPONSES)
BASE = f"/apis/{SCHEDULING_GROUP}/{SCHEDULING_VERSION}"
RESOURCE = "podgroups"
GROUP = SCHEDULING_GROUP
KIND = service.CHANGE_KIND[GROUP]
BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CoschedulingPodGroup"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/CoschedulingPodGroup"}},
        },
    }
}


def _current(principal: Principal, namespace: str | None) -> Current:
    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        tenant = None if principal.is_admin else principal.tenant_id
        groups = service.list_groups(session, tenant_id=tenant, namespace=namespace, group=GROUP)
        return groups, rv

    return read


async def _authorize(
    services: Any, principal: Principal, namespace: str, verb: str, name: str = ""
) -> NamespaceInfo:
    return await authorize_namespace(
        services, principal, namespace, verb=verb, resource=RESOURCE, name=name, group=GROUP
    )


@router.get(
    f"{BASE}/podgroups",
    responses={200: {"model": CoschedulingPodGroupList}},
    summary="List coscheduling pod groups in every namespace the caller may see",
)
async def list_all_coscheduling_groups(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    require(principal, verb="watch" if query.watch else "list", resource=RESOURCE, group=GROUP)
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind=KIND,
        api_version=service.COSCHEDULING_API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, None),
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/podgroups",
    responses={200: {"model": CoschedulingPodGroupList}},
    summary="List coscheduling pod groups",
)
async def list_coscheduling_groups(
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
        kind=KIND,
        api_version=service.COSCHEDULING_API_VERSION,
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, namespace),
        namespace=namespace,
    )


@router.post(
    f"{BASE}/namespaces/{{namespace}}/podgroups",
    status_code=201,
    responses={201: {"model": CoschedulingPodGroup}},
    openapi_extra=BODY,
    summary="Create a coscheduling pod group (a gang)",
)
async def create_coscheduling_group(
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
    body, warnings = decode_model(
        CoschedulingPodGroup, document, kind="PodGroup", mode=field_validation or "Warn"
    )
    obj = await services.write_unless_dry(
        dry_run, lambda s: service.create_coscheduling(s, namespace=ns, body=body)
    )
    return json_response(obj, 201, warnings)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": CoschedulingPodGroup}},
    summary="Read a coscheduling pod group",
)
async def get_coscheduling_group(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await _authorize(services, principal, namespace, "get", name)
    return respond(
        request,
        await services.read(lambda s: service.get(s, namespace=namespace, name=name, group=GROUP)),
    )


def _replace(
    session: Session, namespace: str, name: str, desired: dict[str, Any], mode: Any
) -> tuple[dict[str, Any], list[str]]:
    desired.pop("status", None)
    body, warnings = decode_model(
        CoschedulingPodGroup, desired, kind="PodGroup", mode=mode or "Warn"
    )
    obj = service.update_coscheduling(session, namespace=namespace, name=name, body=body)
    return obj, warnings


@router.put(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": CoschedulingPodGroup}},
    openapi_extra=BODY,
    summary="Replace a coscheduling pod group's labels, annotations and spec",
)
async def replace_coscheduling_group(
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
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": CoschedulingPodGroup}},
    summary="Change a coscheduling pod group",
)
async def patch_coscheduling_group(
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
        current = service.get(session, namespace=namespace, name=name, group=GROUP)
        desired = apply_patch(current, patch, patch_type)
        return _replace(session, namespace, name, desired, field_validation)

    obj, warnings = await services.write_unless_dry(dry_run, work)
    return json_response(obj, warnings=warnings)


@router.delete(
    f"{BASE}/namespaces/{{namespace}}/podgroups/{{name}}",
    responses={200: {"model": CoschedulingPodGroup}},
    summary="Delete a coscheduling pod group that has no pods",
)
async def delete_coscheduling_group(
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
            dry_run, lambda s: service.delete_group(s, namespace=namespace, name=name, group=GROUP)
        )
    )
