"""Serving `?watch=true`: a stream of `{"type": ..., "object": ...}` lines.

The stream starts with the current objects (as ADDED) when no resourceVersion is given, or with
the changes after the given resourceVersion; a version older than the retained log answers an
ERROR event carrying a 410 `Expired` Status, as Kubernetes does, and clients re-list.
Between changes the stream waits on the notifier (a commit in this process, or in another one
through Redis; what neither told of, the notifier's one follower of the log per process finds
within `watch_poll_seconds`), and wakes on its own only to check its token and send bookmarks.
It reads the log only up to the store's horizon (`current_resource_version`): a change
committed above it is looked for again within milliseconds, once the write transactions that
began before it have ended.

Limits, as a Kubernetes API server has them: a watch lasts its `timeoutSeconds` or a random time
between `watch_min_timeout_seconds` and twice that, whichever is shorter (so that clients
reconnect spread out, and no stream lives forever); a tenant (and each node agent) holds at most
`watch_max_per_tenant` streams, watches and `logs -f` follows together, on one API process (429
beyond); and a stream ends within the auth cache time of its token being revoked (a watch with
an ERROR event carrying `401 Unauthorized`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import Request
from starlette.requests import HTTPConnection
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.db.engine import current_resource_version
from app.errors import BadRequest, TooManyRequests, Unauthorized
from app.kube.listing import object_field
from app.kube.lists import parse_resource_version
from app.kube.selectors import FieldRequirement, LabelSelector, field_filter
from app.kube.tables import PARTIAL, TABLE, negotiate, partial, to_table
from app.watch import log

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.deps import Services

Initial = Callable[[Any], tuple[list[dict[str, Any]], int]]


def stream_owner(principal: Principal) -> str | None:
    """Whose quota of open streams a principal's watch or log follow counts against: its
    tenant's, or its node's (node agents are bounded too); None for the admin."""
    if principal.sees_every_tenant:
        return None
    if principal.is_node:
        return f"node/{principal.node_name}"
    return f"tenant/{principal.tenant_id}"


class WatchLimiter:
    """Open streams (watches and log follows) per tenant and per node agent in this process
    (the admin is not limited)."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._open: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def acquire(self, owner: str | None) -> Callable[[], None]:
        """Count one more stream of `owner` (see stream_owner); returns its (idempotent)
        release. 429 when at the limit."""
        with self._lock:
            if owner is not None:
                if self._open.get(owner, 0) >= self.per_tenant:
                    raise TooManyRequests(
                        f"too many watches: a tenant may hold {self.per_tenant} watches and log "
                        "follows open at once; close one, or watch a whole namespace or kind "
                        "instead of many single objects",
                        retry_after=1,
                    )
                self._open[owner] = self._open.get(owner, 0) + 1
            self._total += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._total -= 1
                if owner is not None:
                    left = self._open.get(owner, 1) - 1
                    if left:
                        self._open[owner] = left
                    else:
                        self._open.pop(owner, None)
                idle = self._total == 0
            if idle:
                _return_memory()

        return release

    def open_watches(self, owner: str | None = None) -> int:
        with self._lock:
            return self._total if owner is None else self._open.get(owner, 0)


_libc_name = ctypes.util.find_library("c")
_malloc_trim = getattr(ctypes.CDLL(_libc_name), "malloc_trim", None) if _libc_name else None


def _return_memory() -> None:
    """When the last watch closes, hand freed heap back to the system (glibc keeps it
    otherwise, and a burst of watches would leave the process large)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class WatchResponse(StreamingResponse):
    """A stream that gives back its place in the tenant's quota however it ends (even when the
    client goes before the first event)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[], None],
        media_type: str = "application/json;stream=watch",
    ) -> None:
        super().__init__(content, media_type=media_type)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def watch_duration(settings_min: float, timeout_seconds: int | None) -> float:
    """`timeoutSeconds`, capped at a random time in [min, 2*min) as Kubernetes caps watches."""
    cap = settings_min * (1 + random.random())
    return min(float(timeout_seconds), cap) if timeout_seconds else cap


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
    decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> StreamingResponse:
    """`scoped`: a tenant sees only its own objects of this kind (False for nodes and GPUs).
    `decode`: the object as the API shows it from the change log's form (a Secret's data is
    logged sealed)."""
    tenant_id = principal.tenant_id
    scoped = scoped and not principal.sees_every_tenant
    start = parse_resource_version(resource_version) or None  # "0": from the current state

    settings = services.settings
    duration = watch_duration(settings.watch_min_timeout_seconds, timeout_seconds)
    recheck_every = max(1.0, settings.auth_cache_seconds)
    view = negotiate(request.headers.get("accept"), is_list=True, watch=True)
    include_object = request.query_params.get("includeObject", "Metadata")

    def line(event_type: str, obj: dict[str, Any]) -> bytes:
        if view == TABLE and event_type in ("ADDED", "MODIFIED", "DELETED"):
            obj = to_table(
                kind,
                [obj],
                resource_version=obj["metadata"].get("resourceVersion"),
                include_object=include_object,
            )
        elif view == PARTIAL and event_type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            obj = partial(obj)
        return _line(event_type, obj)

    def matches(obj: dict[str, Any]) -> bool:
        return (
            labels.empty or labels.matches(obj["metadata"].get("labels") or {})
        ) and field_filter(fields, lambda path: object_field(obj, path))

    still_authorized = token_check(request, services)

    async def horizon() -> int:
        return int(await services.read(current_resource_version))

    async def events() -> AsyncIterator[bytes]:
        deadline = time.monotonic() + duration
        next_auth_check = time.monotonic() + recheck_every
        if start is None:
            if initial is None:
                raise BadRequest("a watch of this kind needs a resourceVersion")
            objects, last = await services.read(initial)
            for obj in objects:
                if matches(obj):
                    yield line("ADDED", obj)
            del objects  # not kept for the life of the stream
        else:
            oldest = await services.read(log.compacted_before)
            if start < oldest:
                yield _line("ERROR", _expired(start, oldest))
                return
            last = start
        last_bookmark = time.monotonic()
        notifier = services.notifier
        bookmark_every = services.settings.watch_bookmark_seconds

        async def pause(last: int) -> bool:
            """Wait for a change of `kind` after `last`; whether the log is worth reading
            now (always when no follower of the log finds what was not announced)."""
            now = time.monotonic()
            if notifier.follows_log:
                # nothing to read until woken: wait until the next check of the token, the
                # next bookmark or the stream's end
                due = [deadline, next_auth_check]
                if bookmarks:
                    due.append(last_bookmark + bookmark_every)
                left = max(0.0, min(due) - now)
            else:
                left = min(services.settings.watch_poll_seconds, max(0.0, deadline - now))
            if notifier.newest((kind,)) > last:
                # Committed, but above the horizon: a write transaction that began earlier
                # still runs, and may yet commit below it. Look again once the horizon moves.
                await notifier.past_horizon(last, horizon, left)
            else:
                await notifier.wait(last, left, kinds=(kind,))
            return not notifier.follows_log or notifier.newest((kind,)) > last

        look = True
        while time.monotonic() < deadline and not notifier.stopping:
            if await request.is_disconnected():
                return
            if time.monotonic() >= next_auth_check:
                if not await still_authorized():
                    yield _line("ERROR", _unauthorized())
                    return
                next_auth_check = time.monotonic() + recheck_every
            if not look and not (bookmarks and time.monotonic() - last_bookmark >= bookmark_every):
                look = await pause(last)  # woken to check the token: nothing new to read
                continue
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
                if decode is not None:
                    row = _decoded(row, decode)
                seen_as = as_selected(row, matches)
                if seen_as is not None:
                    yield line(*seen_as)
            seen = upto
            if rows:
                last = max(last, rows[-1]["resource_version"])
            if bookmarks and time.monotonic() - last_bookmark >= bookmark_every:
                last = max(last, seen)
                yield _line(
                    "BOOKMARK",
                    {
                        # a kind two groups serve is logged as kind.group
                        "kind": kind.partition(".")[0],
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(last)},
                    },
                )
                last_bookmark = time.monotonic()
            if rows:
                await asyncio.sleep(0)
                continue
            last = max(last, seen)
            notifier.horizon = max(notifier.horizon, seen)
            look = await pause(last)

    release = services.watches.acquire(stream_owner(principal))
    return WatchResponse(events(), release)


def token_check(connection: HTTPConnection, services: Services) -> Callable[[], Awaitable[bool]]:
    """For a long stream or session: whether the connection's token still authenticates
    (revoked: no). A token verified within the auth cache time is taken as verified, as every
    request's is: a revoked token's streams end within that time, as its requests stop being
    served, and a hundred streams of tokens their agents use anyway cost no read each."""
    token = connection.headers.get("authorization", "").partition(" ")[2].strip()

    async def still_authorized() -> bool:
        if services.authenticator.cached(token) is not None:
            return True
        try:
            await services.read(lambda s: services.authenticator.authenticate(s, token))
        except Unauthorized:
            return False
        return True

    return still_authorized


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


def _decoded(
    row: Mapping[str, Any], decode: Callable[[dict[str, Any]], dict[str, Any]]
) -> Mapping[str, Any]:
    previous = row.get("previous")
    return {
        **row,
        "object": decode(row["object"]),
        "previous": decode(previous) if previous is not None else None,
    }


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def _unauthorized() -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the watch's token is no longer valid (revoked or removed): authenticate again",
        "reason": "Unauthorized",
        "code": 401,
    }


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


Alive = Callable[[], Awaitable[bool]]


def follow_response(
    request: Request,
    services: Services,
    principal: Principal,
    content: Callable[[Alive], AsyncIterator[bytes]],
    media_type: str = "text/plain",
) -> WatchResponse:
    """A stream other than a watch (`logs -f`): counted with the owner's watches, and ended when
    its token is revoked. `content` gets `alive()`, to await between chunks: False once the
    token no longer authenticates (checked at most every auth cache time)."""
    still_authorized = token_check(request, services)
    every = max(1.0, services.settings.auth_cache_seconds)
    next_check = time.monotonic() + every

    async def alive() -> bool:
        nonlocal next_check
        if time.monotonic() < next_check:
            return True
        next_check = time.monotonic() + every
        return await still_authorized()

    release = services.watches.acquire(stream_owner(principal))
    return WatchResponse(content(alive), release, media_type=media_type)
