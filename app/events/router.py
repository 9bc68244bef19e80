"""HTTP for events: `/api/v1/namespaces/{namespace}/events` and `/api/v1/events`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.auth.service import Principal
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, Services, ServicesDep, authorize_namespace, respond
from app.errors import STATUS_RESPONSES
from app.events import service
from app.kube.listing import list_object, page_objects
from app.kube.lists import check_limit
from app.kube.params import (
    AllowBookmarksQ,
    ContinueQ,
    FieldSelectorQ,
    LabelSelectorQ,
    LimitQ,
    PrettyQ,
    ResourceVersionQ,
    TimeoutSecondsQ,
    WatchQ,
)
from app.kube.selectors import parse_field_selector, parse_label_selector
from app.watch.stream import watch_response

router = APIRouter(tags=["events"], responses=STATUS_RESPONSES)


@router.get("/api/v1/events", summary="List events in every namespace the caller may see")
async def list_all_events(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    label_selector: LabelSelectorQ = None,
    field_selector: FieldSelectorQ = None,
    limit: LimitQ = None,
    continue_: ContinueQ = None,
    watch: WatchQ = None,
    resource_version: ResourceVersionQ = None,
    timeout_seconds: TimeoutSecondsQ = None,
    allow_watch_bookmarks: AllowBookmarksQ = None,
    pretty: PrettyQ = None,
) -> Response:
    return await _list(
        request,
        services,
        principal,
        None,
        label_selector,
        field_selector,
        limit,
        continue_,
        watch,
        resource_version,
        timeout_seconds,
        allow_watch_bookmarks,
    )


@router.get("/api/v1/namespaces/{namespace}/events", summary="List events")
async def list_events(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    label_selector: LabelSelectorQ = None,
    field_selector: FieldSelectorQ = None,
    limit: LimitQ = None,
    continue_: ContinueQ = None,
    watch: WatchQ = None,
    resource_version: ResourceVersionQ = None,
    timeout_seconds: TimeoutSecondsQ = None,
    allow_watch_bookmarks: AllowBookmarksQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(services, principal, namespace, verb="list", resource="events")
    return await _list(
        request,
        services,
        principal,
        namespace,
        label_selector,
        field_selector,
        limit,
        continue_,
        watch,
        resource_version,
        timeout_seconds,
        allow_watch_bookmarks,
    )


async def _list(
    request: Request,
    services: Services,
    principal: Principal,
    namespace: str | None,
    label_selector: str | None,
    field_selector: str | None,
    limit: int | None,
    continue_: str | None,
    watch: bool | None,
    resource_version: str | None,
    timeout_seconds: int | None,
    allow_watch_bookmarks: bool | None,
) -> Response:
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, service.FIELD_SELECTORS)

    def current(session: Any) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        rows = service.list_rows(
            session, tenant_id=principal.tenant_id, admin=principal.is_admin, namespace=namespace
        )
        return [service.to_api(r) for r in rows], rv

    if watch:
        return await watch_response(
            request,
            services,
            principal,
            kind="Event",
            namespace=namespace,
            labels=labels,
            fields=fields,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            bookmarks=bool(allow_watch_bookmarks),
            initial=current,
        )
    objects, rv = await services.read(current)
    items, rv, token = page_objects(
        objects,
        labels=labels,
        fields=fields,
        limit=check_limit(limit),
        continue_token=continue_,
        resource_version=rv,
    )
    return respond(request, list_object("EventList", "v1", items, rv, token))
