"""HTTP for events: `/api/v1/namespaces/{namespace}/events` and `/api/v1/events`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.auth.service import Principal
from app.db.engine import current_resource_version
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, json_response
from app.errors import STATUS_RESPONSES, Cause, NotFound, ResourceRef, invalid
from app.events import service
from app.events.schemas import EventIn, EventList
from app.kube.bodies import decode_object
from app.kube.listing import Current, serve_list
from app.kube.meta import parse_timestamp
from app.kube.params import FieldValidationQ, ListQueryDep
from app.pods import repository as pod_rows
from app.registry.kinds import KINDS
from app.registry.store import Store
from app.registry.strategy import Strategy

router = APIRouter(tags=["events"], responses=STATUS_RESPONSES)

# the kinds the controller manager writes events about, besides pods
WORKLOAD_KINDS = tuple(k for k in KINDS if k.workload and k.namespaced)


def _workload_kind(kind: str, api_version: str | None) -> Strategy | None:
    return next(
        (k for k in WORKLOAD_KINDS if k.kind == kind and api_version in (None, "", k.api_version)),
        None,
    )


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


@router.post(
    "/api/v1/namespaces/{namespace}/events",
    status_code=201,
    summary="Record an event about a pod (its node's agent, as the kubelet does) or a workload "
    "(the controller manager)",
)
async def create_event(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
) -> Response:
    """The event's fields Tessera does not keep (series, related, ...) are ignored, whatever
    `fieldValidation` says."""
    try:
        body = EventIn.model_validate(
            decode_object(await request.body(), request.headers.get("content-type"))
        )
    except ValidationError as exc:
        causes = [Cause(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors()]
        raise invalid("Event", "", causes) from exc
    involved = body.involved_object
    kind = None
    if involved.kind != "Pod":
        kind = _workload_kind(involved.kind, involved.api_version)
        if kind is None:
            raise invalid(
                "Event",
                "",
                [
                    Cause(
                        "involvedObject.kind",
                        f'Unsupported value: "{involved.kind}": events are taken about pods and '
                        f"the workload kinds ({', '.join(sorted(k.kind for k in WORKLOAD_KINDS))})",
                        "FieldValueNotSupported",
                    )
                ],
            )
    pod = involved.name if kind is None else ""
    # the tenancy check of the pod the event is about: a node only for a pod bound to it (and
    # never about another kind); the controller manager in a tenant's namespace
    info = await authorize_namespace(
        services, principal, namespace, verb="create", resource="events", about_pod=pod
    )
    at = None
    if body.first_timestamp:
        try:
            at = parse_timestamp(body.first_timestamp)
        except ValueError:
            raise invalid(
                "Event",
                "",
                [Cause("firstTimestamp", "Invalid value: write it like 2026-12-03T10:00:00Z")],
            ) from None
    component = body.reporting_component or (body.source.component if body.source else None)

    def work(session: Session) -> dict[str, Any]:
        if kind is None:
            uid = pod_rows.uid_of(session, namespace=namespace, name=pod)
            if uid is None or (involved.uid and involved.uid != uid):
                raise NotFound(f'pods "{pod}" not found', ref=ResourceRef("pods", pod))
            about = service.Involved("Pod", pod, uid, namespace)
        else:
            obj = Store(kind).get(session, namespace=namespace, name=involved.name)
            uid = obj["metadata"]["uid"]
            if involved.uid and involved.uid != uid:
                raise NotFound(
                    f'{kind.qualified} "{involved.name}" not found',
                    ref=ResourceRef(kind.resource, involved.name, kind.group),
                )
            about = service.Involved(
                kind.kind, involved.name, uid, namespace, api_version=kind.api_version
            )
        return service.record(
            session,
            involved=about,
            reason=body.reason,
            message=body.message,
            type=body.type,
            component=component or ("tessera-agent" if kind is None else "tessera-controllers"),
            tenant_id=info.tenant_id,
            at=at,
        )

    # Clean: it raises (NotFound) only before it writes; no savepoint in a shared batch.
    return json_response(await services.write(work, clean=True), status_code=201)
