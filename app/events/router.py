"""HTTP for events: `/api/v1/namespaces/{namespace}/events` and `/api/v1/events`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace
from app.errors import STATUS_RESPONSES
from app.events import service
from app.events.schemas import EventList
from app.kube.listing import Current, serve_list
from app.kube.params import ListQueryDep

router = APIRouter(tags=["events"], responses=STATUS_RESPONSES)


def _current(principal: Principal, namespace: str | None) -> Current:
    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        rows = service.list_rows(
            session,
            tenant_id=principal.tenant_id,
            admin=principal.sees_every_tenant,
            namespace=namespace,
        )
        return [service.to_api(r) for r in rows], rv

    return read


@router.get(
    "/api/v1/events",
    responses={200: {"model": EventList}},
    summary="List events in every namespace the caller may see",
)
async def list_all_events(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    require(principal, verb="watch" if query.watch else "list", resource="events")
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Event",
        api_version="v1",
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, None),
        order=service.in_time_order,
    )


@router.get(
    "/api/v1/namespaces/{namespace}/events",
    responses={200: {"model": EventList}},
    summary="List events",
)
async def list_events(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="watch" if query.watch else "list", resource="events"
    )
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Event",
        api_version="v1",
        field_selectors=service.FIELD_SELECTORS,
        current=_current(principal, namespace),
        namespace=namespace,
        order=service.in_time_order,
    )
