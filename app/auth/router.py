"""HTTP for tenants (admin only): `/apis/tessera.io/v1/tenants`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth import service
from app.auth.rules import require
from app.auth.schemas import NodeToken, NodeTokenRequest, Tenant, TenantList, TenantToken
from app.auth.service import Principal
from app.constants import TESSERA_GROUP
from app.db import models
from app.deps import PrincipalDep, ServicesDep, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest, UnsupportedMediaType
from app.kube.bodies import (
    APPLY_PATCH,
    apply_patch,
    decode,
    decode_object,
    patch_type_of,
    section,
)
from app.kube.meta import timestamp
from app.kube.params import DryRunQ, FieldValidationQ
from app.namespaces.router import PATCH_BODY
from app.pods.validation import decode_model, drop_unknown_fields

router = APIRouter(tags=["tenants"], responses=STATUS_RESPONSES)
BASE = f"/apis/{TESSERA_GROUP}/v1/tenants"
NODE_TOKENS = f"/apis/{TESSERA_GROUP}/v1/nodetokens"


def _allow(principal: Principal, verb: str, name: str = "", resource: str = "tenants") -> None:
    require(principal, verb=verb, resource=resource, name=name, group=TESSERA_GROUP)


def to_api(tenant: models.Tenant) -> dict[str, Any]:
    return {
        "apiVersion": f"{TESSERA_GROUP}/v1",
        "kind": "Tenant",
        "metadata": {
            "name": tenant.name,
            "uid": tenant.uid,
            "creationTimestamp": timestamp(tenant.created_at),
        },
        "spec": {"weight": tenant.weight},
    }


@router.get(BASE, responses={200: {"model": TenantList}}, summary="List tenants (admin)")
async def list_tenants(
    request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    _allow(principal, "list")
    items = await services.read(lambda s: [to_api(t) for t in service.list_tenants(s)])
    return respond(
        request,
        {"apiVersion": f"{TESSERA_GROUP}/v1", "kind": "TenantList", "metadata": {}, "items": items},
    )


@router.post(
    BASE,
    status_code=201,
    responses={201: {"model": Tenant}},
    summary="Create a tenant and its first namespace (admin)",
)
async def create_tenant(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
) -> Response:
    _allow(principal, "create")
    body = decode_object(await request.body(), request.headers.get("content-type"))
    if body.get("kind") not in (None, "Tenant"):
        raise BadRequest(f"the object is a {body.get('kind')}, this endpoint takes a Tenant")
    body, warnings = drop_unknown_fields(
        Tenant, body, kind="Tenant", mode=field_validation or "Warn"
    )
    name = str(section(body, "metadata").get("name") or "")
    weight = section(body, "spec").get("weight", 1)
    return json_response(
        await services.write_unless_dry(
            dry_run, lambda s: to_api(service.create_tenant(s, name=name, weight=weight))
        ),
        201,
        warnings,
    )


@router.patch(
    BASE + "/{name}",
    responses={200: {"model": Tenant}},
    openapi_extra=PATCH_BODY,
    summary="Change a tenant's spec (admin): its fair-share weight",
)
async def patch_tenant(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
) -> Response:
    _allow(principal, "patch", name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    if patch_type == APPLY_PATCH:
        raise UnsupportedMediaType(
            "tenants take merge, strategic merge and JSON patches, not server-side apply"
        )
    body = decode(await request.body(), patch_type)

    warnings: list[str] = []

    def work(s: Session) -> dict[str, Any]:
        desired = apply_patch(to_api(service.get_tenant(s, name)), body, patch_type)
        desired, dropped = drop_unknown_fields(
            Tenant, desired, kind="Tenant", mode=field_validation or "Warn"
        )
        warnings[:] = dropped
        if section(desired, "metadata").get("name") != name:
            raise BadRequest("a tenant's name cannot be changed")
        weight = section(desired, "spec").get("weight", 1)
        return to_api(service.set_weight(s, name=name, weight=weight))

    return json_response(await services.write_unless_dry(dry_run, work), 200, warnings)


@router.get(BASE + "/{name}", responses={200: {"model": Tenant}}, summary="Read a tenant (admin)")
async def get_tenant(name: str, services: ServicesDep, principal: PrincipalDep) -> Response:
    _allow(principal, "get", name)
    return json_response(await services.read(lambda s: to_api(service.get_tenant(s, name))))


@router.post(
    BASE + "/{name}/tokens",
    status_code=201,
    responses={201: {"model": TenantToken}},
    summary="Issue a token for a tenant (admin); shown only in this answer",
)
async def create_tenant_token(
    name: str, request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    _allow(principal, "create", name, "tenants/tokens")
    raw = await request.body()
    description = ""
    if raw.strip():
        description = str(
            decode_object(raw, request.headers.get("content-type")).get("description", "")
        )
    new = await services.write(
        lambda s: service.create_token(s, role="tenant", tenant=name, description=description)
    )
    return json_response(
        {
            "apiVersion": f"{TESSERA_GROUP}/v1",
            "kind": "TenantToken",
            "tenant": name,
            "keyId": new.key_id,
            "token": new.value,
        },
        201,
    )


@router.post(
    NODE_TOKENS,
    status_code=201,
    responses={201: {"model": NodeToken}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/NodeTokenRequest"}}
            },
        }
    },
    summary="Issue a node agent's token (admin); shown only in this answer",
)
async def create_node_token(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
) -> Response:
    _allow(principal, "create", resource="nodetokens")
    body, warnings = decode_model(
        NodeTokenRequest,
        decode_object(await request.body(), request.headers.get("content-type")),
        kind="NodeToken",
        mode=field_validation or "Strict",
    )
    new = await services.write(
        lambda s: service.create_token(s, role="node", node=body.node, description=body.description)
    )
    return json_response(
        {
            "apiVersion": f"{TESSERA_GROUP}/v1",
            "kind": "NodeToken",
            "node": body.node,
            "keyId": new.key_id,
            "token": new.value,
        },
        201,
        warnings,
    )
