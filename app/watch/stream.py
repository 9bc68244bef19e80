"""Serving `?watch=true`: a stream of `{"type": ..., "object": ...}` lines.

The stream starts with the current objects (as ADDED) when no resourceVersion is given, or with
the changes after the given resourceVersion; a version older than the retained log answers an
ERROR event carrying a 410 `Expired` Status, as Kubernetes does, and clients re-list.
Between changes the stream waits on the notifier (a commit in this process, or in another one
through Redis) and looks at the log at least every second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import Request
from starlette.responses import StreamingResponse

from app.errors import BadRequest
from app.kube.listing import object_field
from app.kube.lists import parse_resource_version
from app.kube.selectors import FieldRequirement, LabelSelector, field_filter
from app.kube.tables import to_table, wants_table
from app.watch import log

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.deps import Services

DEFAULT_TIMEOUT = 1800

Initial = Callable[[Any], tuple[list[dict[str, Any]], int]]


async def watch_response(
    request: Request,
    services: Services,
    principal: Principal,
    *,
    kind: str,
    namespace: str | None,
    labels: LabelSelector,
    fields: list[FieldRequirement],
    resource_version: str | None,
    timeout_seconds: int | None,
    bookmarks: bool,
    scoped: bool = True,
    initial: Initial | None = None,
    api_version: str = "v1",
) -> StreamingResponse:
    """`scoped`: a tenant sees only its own objects of this kind (False for nodes and GPUs)."""
    tenant_id = principal.tenant_id
    scoped = scoped and not principal.is_admin
    start = parse_resource_version(resource_version) or None  # "0": from the current state

    table = wants_table(request.headers.get("accept"))
    include_object = request.query_params.get("includeObject", "Metadata")

    def line(event_type: str, obj: dict[str, Any]) -> bytes:
        if table and event_type in ("ADDED", "MODIFIED", "DELETED"):
            obj = to_table(
                kind,
                [obj],
                resource_version=obj["metadata"].get("resourceVersion"),
                include_object=include_object,
            )
        return _line(event_type, obj)

    def matches(obj: dict[str, Any]) -> bool:
        return (
            labels.empty or labels.matches(obj["metadata"].get("labels") or {})
        ) and field_filter(fields, lambda path: object_field(obj, path))

    async def events() -> AsyncIterator[bytes]:
        deadline = time.monotonic() + (timeout_seconds or DEFAULT_TIMEOUT)
        if start is None:
            if initial is None:
                raise BadRequest("a watch of this kind needs a resourceVersion")
            objects, last = await services.read(initial)
            for obj in objects:
                if matches(obj):
                    yield line("ADDED", obj)
        else:
            oldest = await services.read(log.compacted_before)
            if start < oldest:
                yield _line("ERROR", _expired(start, oldest))
                return
            last = start
        last_bookmark = time.monotonic()
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                return
            rows, upto = await services.read(
                lambda s, after=last: log.read_after(  # type: ignore[misc]
                    s,
                    after=after,
                    kind=kind,
                    namespace=namespace,
                    tenant_id=tenant_id,
                    scoped=scoped,
                )
            )
            for row in rows:
                seen_as = as_selected(row, matches)
                if seen_as is not None:
                    yield line(*seen_as)
            seen = upto
            if rows:
                last = max(last, rows[-1]["resource_version"])
            if (
                bookmarks
                and time.monotonic() - last_bookmark >= services.settings.watch_bookmark_seconds
            ):
                last = max(last, seen)
                yield _line(
                    "BOOKMARK",
                    {
                        "kind": kind,
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(last)},
                    },
                )
                last_bookmark = time.monotonic()
            if not rows:
                last = max(last, seen)
                await services.notifier.wait(
                    last,
                    min(
                        services.settings.watch_poll_seconds, max(0.0, deadline - time.monotonic())
                    ),
                )
            else:
                await asyncio.sleep(0)

    return StreamingResponse(events(), media_type="application/json;stream=watch")


def as_selected(
    row: Mapping[str, Any], matches: Callable[[dict[str, Any]], bool]
) -> tuple[str, dict[str, Any]] | None:
    """The event a watch with a selector sends for a change-log row, or None to skip it.

    As in Kubernetes: an object modified into the selection is ADDED, one modified out of it is
    DELETED (its previous state, at the change's resourceVersion), so a client's cache of "what
    matches" stays right. The log keeps `previous` only when labels or selectable fields changed;
    otherwise the object matched before exactly when it matches now.
    """
    obj, previous = row["object"], row.get("previous")
    now = matches(obj)
    if row["type"] != "MODIFIED" or previous is None:
        return (row["type"], obj) if now else None
    before = matches(previous)
    if now:
        return ("MODIFIED" if before else "ADDED"), obj
    if before:
        gone = {**previous, "metadata": {**previous["metadata"]}}
        gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
        return "DELETED", gone
    return None


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def _expired(start: int, oldest: int) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {start} ({oldest})",
        "reason": "Expired",
        "code": 410,
    }
