"""Serving lists and watches of objects that are filtered and paged in memory (every kind but
pods, whose lists are paged in SQL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import Request
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.kube.lists import ContinueToken
from app.kube.params import ListQuery
from app.kube.selectors import FieldRequirement, LabelSelector, field_filter

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.deps import Services

Current = Callable[[Session], tuple[list[dict[str, Any]], int]]


def object_field(obj: dict[str, Any], path: str) -> str | None:
    """The value a field selector compares: `spec.nodeName` -> obj["spec"]["nodeName"]."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, dict):  # e.g. an Event's "source" selects source.component
        node = node.get("component")
    return None if node is None else str(node)


OrderKey = Callable[[dict[str, Any]], tuple[str, str]]


def by_name(obj: dict[str, Any]) -> tuple[str, str]:
    """Lists are in (namespace, name) order, as Kubernetes keeps them."""
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def page_objects(
    objects: Sequence[dict[str, Any]],
    *,
    labels: LabelSelector,
    fields: list[FieldRequirement],
    limit: int | None,
    continue_token: str | None,
    resource_version: int,
    key: OrderKey = by_name,
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Filter by selectors, order by `key` ((namespace, a text unique in it); a continue token
    holds the last), and cut a page after the token."""

    after = None
    if continue_token:
        token = ContinueToken.decode(continue_token)
        after = (token.namespace, token.name)
        resource_version = token.resource_version
    selected = [
        obj
        for obj in sorted(objects, key=key)
        if (after is None or key(obj) > after)
        and (labels.empty or labels.matches(obj["metadata"].get("labels") or {}))
        and field_filter(fields, lambda path, obj=obj: object_field(obj, path))  # type: ignore[misc]
    ]
    if limit and len(selected) > limit:
        last = key(selected[limit - 1])
        token = ContinueToken(last[0], last[1], resource_version)
        return selected[:limit], resource_version, token.encode()
    return selected, resource_version, None


def list_object(
    kind: str,
    api_version: str,
    items: list[dict[str, Any]],
    resource_version: int,
    continue_token: str | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": str(resource_version)}
    if continue_token:
        metadata["continue"] = continue_token
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items}


async def serve_list(
    request: Request,
    services: Services,
    principal: Principal,
    query: ListQuery,
    *,
    kind: str,
    api_version: str,
    field_selectors: tuple[str, ...],
    current: Current,
    namespace: str | None = None,
    scoped: bool = True,
    order: OrderKey = by_name,
) -> Response:
    """Answer a list request, or a watch when `?watch=true`.

    `current` reads every object the caller may see and the resourceVersion they are at;
    `scoped` means a tenant's watch sees only its own rows of the change log.
    """
    from app.deps import respond
    from app.watch.stream import watch_response

    fields = query.fields(field_selectors)
    if query.watch:
        return await watch_response(
            request,
            services,
            principal,
            kind=kind,
            namespace=namespace,
            labels=query.labels,
            fields=fields,
            resource_version=query.resource_version,
            timeout_seconds=query.timeout_seconds,
            bookmarks=query.bookmarks,
            scoped=scoped,
            initial=current,
            api_version=api_version,
        )
    objects, rv = await services.read(current)
    items, rv, token = page_objects(
        objects,
        labels=query.labels,
        fields=fields,
        limit=query.limit,
        continue_token=query.continue_token,
        resource_version=rv,
        key=order,
    )
    # `kind` names the change log's kind, which a second group's kind of the same name qualifies
    # ("PodGroup.scheduling.x-k8s.io"); the list is "PodGroupList" in either group.
    list_kind = kind.partition(".")[0] + "List"
    return respond(request, list_object(list_kind, api_version, items, rv, token))
