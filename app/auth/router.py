"""HTTP for tenants (admin only): `/apis/tessera.io/v1/tenants`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth import service
from app.auth.rules import require
from app.auth.schemas import NodeToken, NodeTokenRequest, Tenant, TenantList, TenantToken
from app.auth.service import Principal
from app.budgets import service as budgets
from app.constants import TESSERA_GROUP
from app.db import models
from app.deps import PrincipalDep, Services, ServicesDep, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest
from app.kube.bodies import apply_patch, decode, decode_object, patch_type_of, section
from app.kube.meta import now, timestamp
from app.kube.params import DryRunQ, FieldValidationQ
from app.pods.validation import decode_model, drop_unknown_fields

router = APIRouter(tags=["tenants"], responses=STATUS_RESPONSES)
BASE = f"/apis/{TESSERA_GROUP}/v1/tenants"
NODE_TOKENS = f"/apis/{TESSERA_GROUP}/v1/nodetokens"


def _allow(principal: Principal, verb: str, name: str = "", resource: str = "tenants") -> None:
    # A tenant may get its own Tenant and patch it (app/auth/rules.py); budgets.check_write
    # says which fields it may change. Everything else about tenants is the admin's.
    require(principal, verb=verb, resource=resource, name=name, group=TESSERA_GROUP)


def _money(services: Services) -> budgets.Money:
    return budgets.Money(services.settings.billing_currency, services.settings.billing_minor_digits)


def to_api(
    tenant: models.Tenant, session: Session | None = None, money: budgets.Money | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": f"{TESSERA_GROUP}/v1",
        "kind": "Tenant",
        "metadata": {
            "name": tenant.name,
            "uid": tenant.uid,
            "creationTimestamp": timestamp(tenant.created_at),
        },
    }
    obj["spec"] = {**(tenant.spec or {}), "weight": tenant.weight}
    if session is not None and money is not None and tenant.spec:
        found = budgets.status(session, tenant, money=money, today=now().date())
        if found:
            obj["status"] = found
    return obj


@router.get(BASE, responses={200: {"model": TenantList}}, summary="List tenants (admin)")
async def list_tenants(
    request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    _allow(principal, "list")
    money = _money(services)
    items = await services.read(lambda s: [to_api(t, s, money) for t in service.list_tenants(s)])
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
    spec = body.get("spec")
    money = _money(services)

    def create(s: Session) -> dict[str, Any]:
        tenant = service.create_tenant(s, name=name)
        if spec is not None:
            tenant = budgets.set_spec(s, name=name, spec=spec, admin=True, money=money)
        return to_api(tenant, s, money)

    return json_response(await services.write_unless_dry(dry_run, create), 201, warnings)


@router.get(BASE + "/{name}", responses={200: {"model": Tenant}}, summary="Read a tenant (admin)")
async def get_tenant(name: str, services: ServicesDep, principal: PrincipalDep) -> Response:
    _allow(principal, "get", name)
    money = _money(services)
    return json_response(
        await services.read(lambda s: to_api(service.get_tenant(s, name), s, money))
    )


@router.put(
    BASE + "/{name}",
    responses={200: {"model": Tenant}},
    summary="Replace a tenant's spec: its quota and spend limits (admin), its budget (tenant)",
)
async def replace_tenant(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
) -> Response:
    _allow(principal, "update", name)
    body = decode_object(await request.body(), request.headers.get("content-type"))
    if body.get("kind") not in (None, "Tenant"):
        raise BadRequest(f"the object is a {body.get('kind')}, this endpoint takes a Tenant")
    body, warnings = drop_unknown_fields(
        Tenant, body, kind="Tenant", mode=field_validation or "Strict"
    )
    if section(body, "metadata").get("name") not in (None, "", name):
        raise BadRequest(f'the object is named "{body["metadata"]["name"]}", the URL "{name}"')
    return json_response(
        await services.write_unless_dry(
            dry_run, _set_spec(name, body.get("spec"), principal, _money(services))
        ),
        200,
        warnings,
    )


@router.patch(
    BASE + "/{name}",
    responses={200: {"model": Tenant}},
    summary="Change a tenant's spec (merge, strategic merge or JSON patch)",
)
async def patch_tenant(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    field_validation: FieldValidationQ = None,
) -> Response:
    _allow(principal, "patch", name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    patch = decode(await request.body(), request.headers.get("content-type"))
    money = _money(services)

    def change(s: Session) -> dict[str, Any]:
        current = to_api(service.get_tenant(s, name))
        patched = apply_patch(current, patch, patch_type)
        meta = patched.get("metadata") or {}
        if meta.get("name") != name or meta.get("uid") != current["metadata"]["uid"]:
            raise BadRequest("a patch may not change a Tenant's metadata.name or uid")
        patched, found = drop_unknown_fields(
            Tenant, patched, kind="Tenant", mode=field_validation or "Strict"
        )
        warnings.extend(found)
        return _set_spec(name, patched.get("spec"), principal, money)(s)

    warnings: list[str] = []
    result = await services.write_unless_dry(dry_run, change)
    return json_response(result, 200, warnings)


def _set_spec(
    name: str, spec: Any, principal: Principal, money: budgets.Money
) -> Callable[[Session], dict[str, Any]]:
    def write(s: Session) -> dict[str, Any]:
        tenant = budgets.set_spec(s, name=name, spec=spec, admin=principal.is_admin, money=money)
        return to_api(tenant, s, money)

    return write


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
