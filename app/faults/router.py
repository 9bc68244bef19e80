"""HTTP for GPU faults: `POST /apis/tessera.io/v1/gpudevices/{name}/fault` (a GPU failed) and
`.../repair` (it is back). Only the admin may call them today; who else may is decided in one
place, `app.auth.rules.require_gpu_report`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import select
from starlette.responses import Response

from app.auth.rules import require_gpu_report
from app.constants import TESSERA_GROUP
from app.db.models import GPUDevice as GPURow
from app.deps import PrincipalDep, ServicesDep, json_response
from app.errors import STATUS_RESPONSES
from app.faults import service
from app.inventory.schemas import GPUDevice, GPUFault
from app.kube.bodies import decode_object
from app.kube.params import PrettyQ
from app.pods.validation import decode_model

router = APIRouter(tags=["inventory"], responses=STATUS_RESPONSES)
GPUS = f"/apis/{TESSERA_GROUP}/v1/gpudevices"
_FAULT_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/GPUFault"}}},
    }
}


def _node_of(session: Any, name: str) -> str | None:
    return session.scalar(select(GPURow.node_name).where(GPURow.name == name))


@router.post(
    GPUS + "/{name}/fault",
    responses={200: {"model": GPUDevice}},
    openapi_extra=_FAULT_BODY,
    summary="Report a GPU fault: Unhealthy at once, its pods stop after the grace period (admin)",
)
async def report_fault(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    body = await request.body()

    def work(session: Any) -> dict[str, Any]:
        require_gpu_report(principal, action="fault", gpu=name, gpu_node=_node_of(session, name))
        report, _ = decode_model(
            GPUFault,
            decode_object(body, request.headers.get("content-type")),
            kind="GPUFault",
            mode="Strict",
        )
        return service.report_fault(
            session,
            name=name,
            kind=report.spec.kind,
            xid=report.spec.xid,
            message=report.spec.message,
            grace_seconds=services.settings.gpu_fault_grace_seconds,
        )

    obj = await services.write(work)
    services.forget_pool()
    return json_response(obj)


@router.post(
    GPUS + "/{name}/repair",
    responses={200: {"model": GPUDevice}},
    summary="The GPU is repaired: Healthy and placeable again (admin)",
)
async def repair(
    name: str, services: ServicesDep, principal: PrincipalDep, pretty: PrettyQ = None
) -> Response:
    def work(session: Any) -> dict[str, Any]:
        require_gpu_report(principal, action="repair", gpu=name, gpu_node=_node_of(session, name))
        return service.repair(session, name=name)

    obj = await services.write(work)
    services.forget_pool()
    return json_response(obj)
