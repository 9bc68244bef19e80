"""HTTP for the pool: `/api/v1/nodes` and `/apis/tessera.io/v1/gpudevices`.

Everyone may read the pool (capacity, free amounts, health); only the admin changes it. A tenant
reading a GPU sees which of ITS pods hold it, never another tenant's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.constants import TESSERA_GROUP
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, Services, ServicesDep, json_response, respond
from app.errors import STATUS_RESPONSES, BadRequest, NotFound, ResourceRef
from app.faults import service as faults
from app.inventory import service
from app.inventory.schemas import GPUDevice, GPUDeviceList, Node, NodeList
from app.kube.bodies import apply_patch, decode, decode_object, patch_type_of
from app.kube.listing import serve_list
from app.kube.params import DryRunQ, FieldValidationQ, ListQueryDep, PrettyQ
from app.pods.validation import drop_unknown_fields

router = APIRouter(tags=["inventory"], responses=STATUS_RESPONSES)
GPUS = f"/apis/{TESSERA_GROUP}/v1/gpudevices"


def _allow(principal: Principal, verb: str, resource: str, name: str = "", group: str = "") -> None:
    require(principal, verb=verb, resource=resource, name=name, group=group)


async def _allow_gpu(services: Services, principal: Principal, verb: str, name: str) -> None:
    """A node's token may touch only the GPUs on its node (403 for others, existing or not)."""
    node = None
    if principal.is_node:
        node = await services.read(lambda s: service.gpu_node(s, name))
    require(
        principal,
        verb=verb,
        resource="gpudevices",
        name=name,
        group=TESSERA_GROUP,
        object_node=node,
    )


@router.get("/api/v1/nodes", responses={200: {"model": NodeList}}, summary="List nodes")
async def list_nodes(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    _allow(principal, "watch" if query.watch else "list", "nodes")

    def current(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        return service.list_nodes(session), rv

    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Node",
        api_version="v1",
        field_selectors=service.NODE_FIELD_SELECTORS,
        current=current,
        scoped=False,
    )


@router.post(
    "/api/v1/nodes",
    status_code=201,
    responses={201: {"model": Node}},
    summary="Register a node with its GPUs (admin)",
)
async def create_node(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
    field_validation: FieldValidationQ = None,
) -> Response:
    body = decode_object(await request.body(), request.headers.get("content-type"))
    # A node's agent registers its own node: the name is in the body.
    meta = body.get("metadata")
    _allow(
        principal,
        "create",
        "nodes",
        str(meta.get("name") or "")[:253] if isinstance(meta, dict) else "",
    )
    if body.get("kind") not in (None, "Node"):
        raise BadRequest(f"the object is a {body.get('kind')}, this endpoint takes a Node")
    body, warnings = drop_unknown_fields(Node, body, kind="Node", mode=field_validation or "Warn")
    spec = service.node_spec_from_api(body)
    obj = await services.write_unless_dry(dry_run, lambda s: service.create_node(s, spec))
    services.forget_pool()
    return json_response(obj, 201, warnings)


@router.get("/api/v1/nodes/{name}", responses={200: {"model": Node}}, summary="Read a node")
async def get_node(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    _allow(principal, "get", "nodes", name)
    return respond(request, await services.read(lambda s: service.get_node(s, name)))


@router.patch(
    "/api/v1/nodes/{name}",
    responses={200: {"model": Node}},
    summary="Change a node's labels or cordon it (admin)",
)
async def patch_node(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
    field_validation: FieldValidationQ = None,
) -> Response:
    _allow(principal, "patch", "nodes", name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    body = decode(await request.body(), patch_type)
    warnings: list[str] = []

    def work(session: Any) -> dict[str, Any]:
        current = service.get_node(session, name)
        desired, found = drop_unknown_fields(
            Node,
            apply_patch(current, body, patch_type),
            kind="Node",
            mode=field_validation or "Warn",
        )
        warnings[:] = found
        return service.update_node(session, name, desired, by_node=principal.is_node)

    return json_response(await services.write_unless_dry(dry_run, work), 200, warnings)


@router.put(
    "/api/v1/nodes/{name}",
    responses={200: {"model": Node}},
    summary="Replace a node's labels, annotations and cordon (admin)",
)
async def replace_node(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
    field_validation: FieldValidationQ = None,
) -> Response:
    _allow(principal, "update", "nodes", name)
    body = decode_object(await request.body(), request.headers.get("content-type"))
    warnings: list[str] = []

    def work(session: Any) -> dict[str, Any]:
        # A replace need not carry the status (it cannot change it): check the fields of the
        # object as it would be, with the stored status where the body has none.
        current = service.get_node(session, name)
        desired, found = drop_unknown_fields(
            Node,
            {"status": current["status"], **body},
            kind="Node",
            mode=field_validation or "Warn",
        )
        warnings[:] = found
        return service.update_node(session, name, desired, by_node=principal.is_node)

    return json_response(await services.write_unless_dry(dry_run, work), 200, warnings)


@router.delete(
    "/api/v1/nodes/{name}", responses={200: {"model": Node}}, summary="Remove an empty node (admin)"
)
async def delete_node(
    name: str,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
    dry_run: DryRunQ = None,
) -> Response:
    _allow(principal, "delete", "nodes", name)
    obj = await services.write_unless_dry(dry_run, lambda s: service.delete_node(s, name))
    services.forget_pool()
    return json_response(obj)


@router.get(
    GPUS,
    responses={200: {"model": GPUDeviceList}},
    summary="List GPU devices (the pool, one object per GPU)",
)
async def list_gpus(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    _allow(principal, "watch" if query.watch else "list", "gpudevices", group=TESSERA_GROUP)

    def current(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        pods = service.gpu_pods(
            session, None, tenant_id=principal.tenant_id, admin=principal.is_admin
        )
        rows = service.list_gpu_rows(session)
        if principal.is_node:  # a node's agent sees only its own GPUs
            rows = [r for r in rows if r["node_name"] == principal.node_name]
        return [service.gpu_to_api(r, pods.get(r["name"], [])) for r in rows], rv

    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="GPUDevice",
        api_version=f"{TESSERA_GROUP}/v1",
        field_selectors=service.GPU_FIELD_SELECTORS,
        current=current,
        scoped=False,
    )


@router.get(GPUS + "/{name}", responses={200: {"model": GPUDevice}}, summary="Read a GPU device")
async def get_gpu(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await _allow_gpu(services, principal, "get", name)

    def work(session: Any) -> dict[str, Any]:
        rows = service.list_gpu_rows(session, name)
        if not rows:
            raise NotFound(
                f'gpudevices.{TESSERA_GROUP} "{name}" not found',
                ref=ResourceRef("gpudevices", name, TESSERA_GROUP),
            )
        pods = service.gpu_pods(
            session, [name], tenant_id=principal.tenant_id, admin=principal.is_admin
        )
        return service.gpu_to_api(rows[0], pods.get(name, []))

    return respond(request, await services.read(work))


@router.patch(
    GPUS + "/{name}",
    responses={200: {"model": GPUDevice}},
    summary="Mark a GPU Healthy or Unhealthy, or drain it with a NoSchedule taint (admin)",
)
async def patch_gpu(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
    field_validation: FieldValidationQ = None,
) -> Response:
    await _allow_gpu(services, principal, "patch", name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    body = decode(await request.body(), patch_type)
    warnings: list[str] = []

    def work(session: Any) -> dict[str, Any]:
        rows = service.list_gpu_rows(session, name)
        if not rows:
            raise NotFound(
                f'gpudevices.{TESSERA_GROUP} "{name}" not found',
                ref=ResourceRef("gpudevices", name, TESSERA_GROUP),
            )
        desired, found = drop_unknown_fields(
            GPUDevice,
            apply_patch(service.gpu_to_api(rows[0]), body, patch_type),
            kind="GPUDevice",
            mode=field_validation or "Warn",
        )
        warnings[:] = found
        service.update_gpu(session, name, desired)
        # An admin's NoSchedule taints (a drain); a fault's NoExecute taint is kept as it is.
        faults.set_taints(
            session, name=name, taints=(desired.get("spec") or {}).get("taints") or []
        )
        return faults.get(session, name=name)

    return json_response(await services.write_unless_dry(dry_run, work), 200, warnings)
