"""HTTP for what a Callback has beside the verbs the registry serves for it
(app/registry/kinds/callbacks.py): its `rotate` subresource (a new signing secret) and its
`deliveries`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.service import Principal
from app.callbacks import service
from app.callbacks.schemas import Callback, CallbackDeliveryList
from app.constants import TESSERA_GROUP
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, Services, ServicesDep, authorize_namespace, json_response
from app.errors import STATUS_RESPONSES
from app.kube.params import DryRunQ, PrettyQ
from app.registry.kinds.callbacks import CallbackStrategy
from app.registry.store import Store

router = APIRouter(tags=["callbacks"], responses=STATUS_RESPONSES)
ITEM = f"/apis/{TESSERA_GROUP}/v1/namespaces/{{namespace}}/callbacks/{{name}}"
STORE = Store(CallbackStrategy())


async def _authorize(
    services: Services, principal: Principal, namespace: str, verb: str, name: str, sub: str
) -> None:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb=verb,
        resource=f"callbacks/{sub}",
        name=name,
        group=TESSERA_GROUP,
    )


@router.post(
    f"{ITEM}/rotate",
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
    await _authorize(services, principal, namespace, "create", name, "rotate")

    def work(session: Session) -> dict[str, Any]:
        callback = STORE.get(session, namespace=namespace, name=name)
        return service.rotate_secret(session, callback=callback)

    return json_response(await services.write_unless_dry(dry_run, work), 201)


@router.get(
    f"{ITEM}/deliveries",
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
    await _authorize(services, principal, namespace, "get", name, "deliveries")

    def read(session: Session) -> dict[str, Any]:
        uid = STORE.get(session, namespace=namespace, name=name)["metadata"]["uid"]
        return {
            "apiVersion": service.API_VERSION,
            "kind": "CallbackDeliveryList",
            "metadata": {"resourceVersion": str(current_resource_version(session))},
            "items": service.list_deliveries(session, uid=uid, limit=limit),
        }

    return json_response(await services.read(read))
