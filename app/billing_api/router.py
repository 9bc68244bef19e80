"""HTTP for billing: `/apis/billing.tessera.io/v1` prices, statements and usage (a tenant's
Commitment is a kind of the registry: app/registry/kinds/commitments.py).

`kubectl get prices`, `kubectl get commitments`, `kubectl get statements` and `kubectl get usage`
work as for any kind; a usage report takes `from`, `to`, `granularity` and `groupBy` and answers
JSON, or CSV with `Accept: text/csv` (both streamed, so a long per-second report never sits in
memory whole).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.responses import Response, StreamingResponse

from app.auth.rules import require
from app.auth.service import Principal
from app.billing_api import service
from app.billing_api.schemas import (
    Price,
    PriceList,
    Statement,
    StatementList,
    UsageList,
)
from app.constants import BILLING_GROUP
from app.db.engine import current_resource_version
from app.deps import (
    PrincipalDep,
    Services,
    ServicesDep,
    authorize_namespace,
    json_response,
    respond,
)
from app.errors import STATUS_RESPONSES, BadRequest, NotAcceptable
from app.kube.bodies import (
    apply_patch,
    decode,
    decode_object,
    patch_body,
    patch_type_of,
)
from app.kube.listing import serve_list
from app.kube.meta import now, timestamp
from app.kube.params import DryRunQ, FieldValidationQ, ListQuery, ListQueryDep, PrettyQ
from app.kube.tables import TABLE, TABLE_MEDIA_TYPE
from app.pods.validation import drop_unknown_fields
from billing.rating import RESOURCES, UNITS
from billing.reports import csv_lines, fmt_amount, fmt_quantity, row_json

router = APIRouter(tags=["billing"], responses=STATUS_RESPONSES)
BASE = f"/apis/{BILLING_GROUP}/v1"
FIELDS = ("metadata.name", "metadata.namespace")


def _money(services: Services) -> service.Money:
    settings = services.settings
    return service.Money(settings.billing_currency, settings.billing_minor_digits)


def _body(schema: str) -> dict[str, Any]:
    content = {"schema": {"$ref": f"#/components/schemas/{schema}"}}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": content, "application/yaml": content},
        }
    }


def _patched(
    current: dict[str, Any],
    patch: Any,
    patch_type: str,
    model: type[Any],
    field_validation: Literal["Strict", "Warn", "Ignore"] | None,
    warnings: list[str],
) -> dict[str, Any]:
    """The object a PATCH asks for (its status left out: the server's), unknown fields dropped
    or refused as `fieldValidation` says; `warnings` gets the dropped ones."""
    desired = apply_patch(current, patch, patch_type)
    desired.pop("status", None)
    document, found = drop_unknown_fields(
        model, desired, kind=model.__name__, mode=field_validation or "Warn"
    )
    warnings[:] = found
    return document


def _document(
    raw: bytes, content_type: str | None, model: type[Any], kind: str, mode: str | None
) -> tuple[dict[str, Any], list[str]]:
    document = decode_object(raw, content_type)
    if document.get("kind") not in (None, kind):
        raise BadRequest(f"the object is a {document.get('kind')}, this endpoint takes a {kind}")
    document.pop("status", None)  # the server owns status
    return drop_unknown_fields(model, document, kind=kind, mode=mode or "Warn")  # type: ignore[arg-type]


def _tenant_scope(principal: Principal) -> int | None:
    return None if principal.is_admin else principal.tenant_id


# --- prices ---------------------------------------------------------------------------------


@router.get(f"{BASE}/prices", responses={200: {"model": PriceList}}, summary="The price book")
async def list_prices(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    require(
        principal, verb="watch" if query.watch else "list", resource="prices", group=BILLING_GROUP
    )

    def current(session: Session) -> tuple[list[dict[str, Any]], int]:
        return service.list_prices(session, at=now()), current_resource_version(session)

    return await serve_list(
        request,
        services,
        principal,
        query,
        kind="Price",
        api_version=service.API_VERSION,
        field_selectors=("metadata.name",),
        current=current,
    )


@router.post(
    f"{BASE}/prices",
    status_code=201,
    responses={201: {"model": Price}},
    openapi_extra=_body("Price"),
    summary="Add a price version (admin): it takes effect at spec.effectiveFrom",
)
async def create_price(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    require(principal, verb="create", resource="prices", group=BILLING_GROUP)
    document, warnings = _document(
        await request.body(), request.headers.get("content-type"), Price, "Price", field_validation
    )
    money = _money(services)

    def work(session: Session) -> dict[str, Any]:
        return service.create_price(session, body=document, money=money, at=now())

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 201, [*warnings, *obj["status"].get("warnings", [])])


@router.get(
    f"{BASE}/prices/{{name}}", responses={200: {"model": Price}}, summary="Read a price version"
)
async def get_price(
    name: str, request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    require(principal, verb="get", resource="prices", group=BILLING_GROUP, name=name)
    return respond(
        request, await services.read(lambda s: service.get_price(s, name=name, at=now()))
    )


@router.patch(
    f"{BASE}/prices/{{name}}",
    responses={200: {"model": Price}},
    openapi_extra=patch_body(),
    summary="Change a price version's labels and annotations (admin); its spec never changes",
)
async def patch_price(
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    require(principal, verb="patch", resource="prices", group=BILLING_GROUP, name=name)
    patch_type = patch_type_of(request.headers.get("content-type"))
    patch = decode(await request.body(), patch_type)
    money = _money(services)
    warnings: list[str] = []

    def work(session: Session) -> dict[str, Any]:
        at = now()
        current = service.get_price(session, name=name, at=at)
        document = _patched(current, patch, patch_type, Price, field_validation, warnings)
        return service.update_price(session, name=name, desired=document, money=money, at=at)

    return json_response(await services.write_unless_dry(dry_run, work), warnings=warnings)


@router.delete(
    f"{BASE}/prices/{{name}}",
    responses={200: {"model": Price}},
    summary="Withdraw a price version that has not taken effect yet (admin)",
)
async def delete_price(
    name: str, services: ServicesDep, principal: PrincipalDep, dry_run: DryRunQ = None
) -> Response:
    require(principal, verb="delete", resource="prices", group=BILLING_GROUP, name=name)
    return json_response(
        await services.write_unless_dry(
            dry_run, lambda s: service.delete_price(s, name=name, at=now())
        )
    )


# --- lists of statements ---------------------------------------------------------------------


async def _listed(
    request: Request,
    services: Services,
    principal: Principal,
    query: ListQuery,
    *,
    resource: str,
    kind: str,
    items: Callable[..., list[dict[str, Any]]],
    namespace: str | None = None,
) -> Response:
    """A list (or watch) of statements, in one namespace or every one the caller may see;
    `items` is the service's list function."""
    money = _money(services)

    def read(session: Session) -> tuple[list[dict[str, Any]], int]:
        rv = current_resource_version(session)
        found = items(
            session, tenant_id=_tenant_scope(principal), namespace=namespace, money=money, at=now()
        )
        return found, rv

    verb = "watch" if query.watch else "list"
    if namespace is None:
        require(principal, verb=verb, resource=resource, group=BILLING_GROUP)
    else:
        await authorize_namespace(
            services, principal, namespace, verb=verb, resource=resource, group=BILLING_GROUP
        )
    return await serve_list(
        request,
        services,
        principal,
        query,
        kind=kind,
        api_version=service.API_VERSION,
        field_selectors=FIELDS,
        current=read,
        namespace=namespace,
    )


# --- statements -----------------------------------------------------------------------------


@router.get(
    f"{BASE}/statements",
    responses={200: {"model": StatementList}},
    summary="Closed daily statements of every tenant the caller may see",
)
async def list_all_statements(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    return await _listed(
        request,
        services,
        principal,
        query,
        resource="statements",
        kind="Statement",
        items=service.list_statements,
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/statements",
    responses={200: {"model": StatementList}},
    summary="A tenant's daily statements (in the namespace named after it), open days included",
)
async def list_statements(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    return await _listed(
        request,
        services,
        principal,
        query,
        resource="statements",
        kind="Statement",
        items=service.list_statements,
        namespace=namespace,
    )


@router.get(
    f"{BASE}/namespaces/{{namespace}}/statements/{{name}}",
    responses={200: {"model": Statement}},
    summary="The statement of one UTC day (named YYYY-MM-DD)",
)
async def get_statement(
    namespace: str, name: str, request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    await authorize_namespace(
        services,
        principal,
        namespace,
        verb="get",
        resource="statements",
        name=name,
        group=BILLING_GROUP,
    )
    money = _money(services)
    obj = await services.read(
        lambda s: service.get_statement(s, namespace=namespace, name=name, money=money, at=now())
    )
    return respond(request, obj)


# --- usage ----------------------------------------------------------------------------------

FromQ = Annotated[
    str | None,
    Query(alias="from", max_length=64, description="RFC 3339; default: the start of today (UTC)"),
]
ToQ = Annotated[str | None, Query(alias="to", max_length=64, description="RFC 3339; default: now")]
GranularityQ = Annotated[
    str | None, Query(max_length=16, description="second, minute, hour (default) or day")
]
GroupByQ = Annotated[
    str | None,
    Query(
        alias="groupBy",
        max_length=128,
        description=(
            "Comma-separated: pod, namespace, workload, resource (default), class, qos, gpuModel"
        ),
    ),
]
TenantQ = Annotated[str | None, Query(max_length=63, description="Admin only: one tenant's usage")]
PodQ = Annotated[
    str | None,
    Query(
        max_length=253,
        description="One pod's usage, by name (the live pod, else the last one of that name)",
    ),
]


GROUPING_DESCRIPTION = (
    "What the rows are grouped by, as groupBy: `kubectl get usage workload` is `groupBy=workload`"
)
GroupingP = Annotated[str, Path(max_length=128, description=GROUPING_DESCRIPTION)]


@dataclass(frozen=True)
class UsageAsked:
    """A usage report's query parameters as given (`service.report_query` checks them)."""

    start: str | None
    end: str | None
    granularity: str | None
    group_by: str | None

    def named(self, grouping: str) -> UsageAsked:
        """The report named `grouping` (`workload`, `pod+resource`: `+` joins as `,`), whose
        name is its groupBy: a groupBy beside it must say the same."""
        named = grouping.replace("+", ",")
        if self.group_by is not None and self.group_by != named:
            raise BadRequest(
                f'groupBy "{self.group_by[:64]}" and the report\'s name "{grouping[:64]}" '
                "disagree: the name is the grouping (usage/workload is groupBy=workload); give "
                "one of them"
            )
        return replace(self, group_by=named)


def _usage_asked(
    start: FromQ = None,
    end: ToQ = None,
    granularity: GranularityQ = None,
    group_by: GroupByQ = None,
) -> UsageAsked:
    return UsageAsked(start, end, granularity, group_by)


UsageAskedDep = Annotated[UsageAsked, Depends(_usage_asked)]


@router.get(
    f"{BASE}/usage",
    responses={200: {"model": UsageList}},
    summary="Usage across namespaces: a tenant's own, or (admin) every tenant's",
)
async def usage_everywhere(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    asked: UsageAskedDep,
    tenant: TenantQ = None,
) -> Response:
    require(principal, verb="list", resource="usage", group=BILLING_GROUP)
    tenant_id = _tenant_scope(principal)
    if tenant is not None:
        if not principal.is_admin:
            raise BadRequest("tenant= is for the admin; a tenant always sees its own usage")
        tenant_id = await services.read(lambda s: service.tenant_id(s, tenant))
    return await _usage(request, services, asked, tenant_id=tenant_id, namespace=None)


@router.get(
    f"{BASE}/usage/{{grouping}}",
    responses={200: {"model": UsageList}},
    summary="Usage across namespaces grouped by what the name says (`kubectl get usage pod`)",
)
async def usage_everywhere_by(
    grouping: GroupingP,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    asked: UsageAskedDep,
    tenant: TenantQ = None,
) -> Response:
    return await usage_everywhere(request, services, principal, asked.named(grouping), tenant)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/usage",
    responses={200: {"model": UsageList}},
    summary="Usage of a namespace's pods by time bucket and group (JSON, or CSV for text/csv)",
)
async def usage_of_namespace(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    asked: UsageAskedDep,
    pod: PodQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="list", resource="usage", group=BILLING_GROUP
    )
    return await _usage(request, services, asked, tenant_id=None, namespace=namespace, pod=pod)


@router.get(
    f"{BASE}/namespaces/{{namespace}}/usage/{{grouping}}",
    responses={200: {"model": UsageList}},
    summary="Usage of a namespace grouped by what the name says (`kubectl get usage workload`)",
)
async def usage_of_namespace_by(
    namespace: str,
    grouping: GroupingP,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    asked: UsageAskedDep,
    pod: PodQ = None,
) -> Response:
    return await usage_of_namespace(
        namespace, request, services, principal, asked.named(grouping), pod
    )


CSV, JSON = "csv", "json"
_MEDIA = {
    "text/csv": CSV,
    "text/*": CSV,
    "application/json": JSON,
    "application/*": JSON,
    "*/*": JSON,
}


def _usage_media(accept: str | None) -> str:
    """What a usage report is written as: `CSV`, `JSON` or the `TABLE` kubectl asks for, by
    the media types of `Accept` in the order of their q (ties: as listed); a type with q=0 is
    one the client does not take. Nothing acceptable is a 406."""
    if not accept:
        return JSON
    ranked = []
    for index, item in enumerate(accept.split(",")[:32]):
        media, _, raw = item.partition(";")
        params: dict[str, str] = {}
        for part in raw.split(";"):
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip()
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0  # a q that is no number accepts nothing
        if q > 0:
            ranked.append((-q, index, media.strip().lower(), params))
    for _, _, media, params in sorted(ranked, key=lambda r: (r[0], r[1])):
        if "as" in params:
            if (params["as"], params.get("g"), params.get("v")) == (TABLE, "meta.k8s.io", "v1"):
                return TABLE
            continue
        if media in _MEDIA:
            return _MEDIA[media]
    raise NotAcceptable(
        f'none of the media types accepted ("{accept[:128]}") is one a usage report is written '
        "as: application/json, text/csv, or a Table (application/json;as=Table;v=v1;"
        "g=meta.k8s.io); q=0 refuses a type"
    )


async def _usage(
    request: Request,
    services: Services,
    asked: UsageAsked,
    *,
    tenant_id: int | None,
    namespace: str | None,
    pod: str | None = None,
) -> Response:
    at = now()
    media = _usage_media(request.headers.get("accept"))
    query = service.report_query(
        start=asked.start,
        end=asked.end,
        granularity=asked.granularity,
        group_by=asked.group_by,
        at=at,
    )
    money = _money(services)
    report = await services.read(
        lambda s: service.usage_report(
            s, query=query, tenant_id=tenant_id, namespace=namespace, money=money, at=at, pod=pod
        )
    )
    if media == CSV:
        return StreamingResponse(
            csv_lines(report.rows, query.group_by), media_type="text/csv; charset=utf-8"
        )
    if media == TABLE:
        return Response(orjson.dumps(_usage_table(report)), media_type=TABLE_MEDIA_TYPE)
    return StreamingResponse(_usage_json(report, money), media_type="application/json")


def _usage_json(report: service.Report, money: service.Money) -> Iterator[bytes]:
    """The UsageList, written as it is produced: head, rows, then the total."""
    q = report.query
    head: dict[str, Any] = {
        "apiVersion": service.API_VERSION,
        "kind": "UsageList",
        "metadata": {},
        "currency": money.currency,
        "from": timestamp(q.start),
        "to": timestamp(q.end),
        "granularity": q.granularity,
        "groupBy": list(q.group_by),
    }
    yield orjson.dumps(head)[:-1] + b',"items":['
    quantities: dict[str, Decimal] = {}
    amount = Decimal(0)
    chunk: list[bytes] = []
    for i, row in enumerate(report.rows):
        for resource, value in row.quantities.items():
            quantities[resource] = quantities.get(resource, Decimal(0)) + value
        amount += row.amount
        chunk.append((b"," if i else b"") + orjson.dumps(row_json(row, q.group_by)))
        if len(chunk) >= 1000:
            yield b"".join(chunk)
            chunk.clear()
    total = {
        "quantities": {r: fmt_quantity(quantities[r]) for r in RESOURCES if r in quantities},
        "units": {r: UNITS[r] for r in RESOURCES if r in quantities},
        "amount": fmt_amount(amount),
    }
    yield b"".join(chunk) + b'],"total":' + orjson.dumps(total) + b"}"


def _usage_table(report: service.Report) -> dict[str, Any]:
    """`kubectl get usage`: one row per bucket and group, what it used and cost."""
    group_by = report.query.group_by
    columns = [("Start", "Bucket start (UTC)."), ("End", "Bucket end (UTC).")]
    columns += [(key[0].upper() + key[1:], f"Grouped by {key}.") for key in group_by]
    columns += [("Usage", "Unit-seconds per resource."), ("Amount", "At list price.")]
    rows = []
    for row in report.rows:
        start = timestamp(row.start)
        usage = ", ".join(
            f"{r}={fmt_quantity(v)} {UNITS[r]}" for r, v in sorted(row.quantities.items())
        )
        cells = [start, timestamp(row.end)]
        cells += ["<none>" if v is None else v for v in row.group]  # as kubectl prints none
        cells += [usage, fmt_amount(row.amount)]
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"name": start},
                },
            }
        )
        if len(rows) >= 10_000:  # kubectl prints a table whole; CSV streams any length
            break
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": [
            {"name": name, "type": "string", "format": "", "description": text, "priority": 0}
            for name, text in columns
        ],
        "rows": rows,
    }
