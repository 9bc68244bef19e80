"""Request dependencies: the application's services, the caller, and running database work.

Route handlers are `async`; database work runs in the thread pool as ONE transaction through
`Services.write()` / `Services.read()`, so a request costs one thread hop and commits (or rolls
back) as a unit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from app.auth import tokens
from app.auth.service import Authenticator, Principal
from app.db.engine import Database, WriteQueue
from app.errors import Unauthorized
from app.inventory.service import load_pool_catalog
from app.kube.tables import (
    PARTIAL,
    PARTIAL_LIST_MEDIA_TYPE,
    PARTIAL_MEDIA_TYPE,
    TABLE,
    TABLE_MEDIA_TYPE,
    negotiate,
    partial,
    tabulate,
)
from app.namespaces.service import NamespaceDirectory, NamespaceInfo, authorize
from app.pods.admission import PoolCatalog
from app.pods.repository import node_of, node_using
from app.pods.validation import AdmissionContext
from app.ratelimit import RateLimiter
from app.sessions.relay import Broker, LocalBroker, SessionLimits, broker_for
from app.settings import Settings
from app.watch.notify import Notifier
from app.watch.stream import WatchLimiter
from app.workloads import Cache as WorkloadCache
from billing.specs import ComputeSpec, SpecCatalog, load_catalog

T = TypeVar("T")


@dataclass
class Services:
    """Everything a request handler needs, built once per process."""

    settings: Settings
    db: Database
    authenticator: Authenticator
    namespaces: NamespaceDirectory
    specs: SpecCatalog
    default_spec: ComputeSpec
    notifier: Notifier
    limiter: RateLimiter
    writer: WriteQueue
    watches: WatchLimiter
    broker: Broker = field(default_factory=LocalBroker)  # sessions' frames (app/sessions)
    sessions: SessionLimits = field(default_factory=SessionLimits)
    # pods' workloads read lately, per tenant (app/pods/router.py's creates)
    workloads: WorkloadCache = field(default_factory=WorkloadCache)
    _pool: PoolCatalog | None = None
    _pool_expires: float = 0.0
    _pool_lock: threading.Lock = field(default_factory=threading.Lock)
    _pool_reading: bool = False  # a caller is re-reading the pool's GPU models
    _pool_generation: int = 0  # moves on at every `forget_pool`

    @classmethod
    def build(cls, settings: Settings, db: Database | None = None) -> Services:
        database = db or Database(settings.effective_database_url)
        return cls(
            settings=settings,
            db=database,
            authenticator=Authenticator(settings.auth_cache_seconds),
            namespaces=NamespaceDirectory(ttl=settings.auth_cache_seconds),
            specs=load_catalog(settings.spec_table),
            default_spec=ComputeSpec.parse(settings.default_pod_spec),
            notifier=Notifier(settings.redis_url),
            limiter=RateLimiter(
                settings.rate_limit_per_second,
                settings.redis_url,
                auth_failures_per_second=settings.auth_failures_per_second,
                node_per_second=settings.node_rate_limit_per_second,
            ),
            writer=WriteQueue(database),
            watches=WatchLimiter(settings.watch_max_per_tenant),
            broker=broker_for(settings.redis_url),
        )

    async def write(self, fn: Callable[[Session], T], *, clean: bool = False) -> T:
        """Run `fn` in a write transaction shared with concurrent requests (group commit).

        `clean`: `fn` raises only before it has written anything (see `WriteQueue`)."""
        return await self.writer.run(fn, clean=clean)

    async def read(self, fn: Callable[[Session], T]) -> T:
        return await run_in_threadpool(self.db.read, fn)

    async def dry_run(self, fn: Callable[[Session], T]) -> T:
        return await run_in_threadpool(self.db.dry_run, fn)

    async def write_unless_dry(self, dry_run: str | None, fn: Callable[[Session], T]) -> T:
        """`fn` as a write, or for `dryRun=All` in a transaction rolled back: every check
        runs, nothing is kept."""
        return await (self.dry_run(fn) if dry_run else self.write(fn))

    def admission(self, session: Session) -> AdmissionContext:
        """Admission needs the pool's GPU models; they are re-read at most every 5 seconds, by
        one caller at a time (the others go on with the ones read before)."""
        pool = self._cached_pool()
        if pool is None:
            pool = self._read_pool(session)
        return AdmissionContext(self.specs, pool, self.default_spec)

    async def admission_now(self) -> AdmissionContext:
        """`admission` outside a transaction (a read of the pool's GPU models when the cached
        ones are older than 5 seconds and nobody else is reading them)."""
        pool = self._cached_pool()
        if pool is None:
            pool = await self.read(self._read_pool)
        return AdmissionContext(self.specs, pool, self.default_spec)

    def _cached_pool(self) -> PoolCatalog | None:
        """The cached GPU models, or None when this caller is to read them: when none are
        cached, or when they are older than 5 seconds and no other caller is reading them
        already. (Under a burst of creates they expire for every request at once: one reads,
        the others go on with the models read 5 seconds before. An inventory change forgets
        them.)"""
        pool = self._pool
        if pool is not None and time.monotonic() <= self._pool_expires:
            return pool
        with self._pool_lock:
            pool = self._pool
            if pool is not None and self._pool_reading:
                return pool
            self._pool_reading = True
            return None

    def _read_pool(self, session: Session) -> PoolCatalog:
        generation = self._pool_generation
        try:
            pool = load_pool_catalog(session)
            with self._pool_lock:
                if generation == self._pool_generation:  # not forgotten since the read began
                    self._pool, self._pool_expires = pool, time.monotonic() + 5.0
            return pool
        finally:
            self._pool_reading = False

    def forget_pool(self) -> None:
        with self._pool_lock:
            self._pool_generation += 1
            self._pool = None


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def current_principal(request: Request) -> Principal:
    # The services straight from the app, not as a dependency of this one: a nested dependency
    # costs every request a few microseconds of FastAPI's resolution.
    services: Services = request.app.state.services
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    principal = await authenticate(request, services, token.strip(), scheme=scheme)
    await services.limiter.check(principal)
    return principal


async def authenticate(
    request: Request, services: Services, token: str, *, scheme: str = "bearer"
) -> Principal:
    """Who `token` is: from the cache, else the database, with the limit on failed attempts
    per client address (a malformed token from a limited address is refused unread; a token
    that verifies is always served)."""
    principal = services.authenticator.cached(token) if token else None
    if principal is not None:
        return principal
    address = request.client.host if request.client else "unknown"
    limited = await services.limiter.address_limited(address)
    well_formed = scheme.lower() == "bearer" and tokens.split(token) is not None
    if limited and not well_formed:
        raise services.limiter.too_many_failures(limited)
    try:
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized(
                "Unauthorized: send a Tessera token as 'Authorization: Bearer tsr_...' "
                "(tessera token create --tenant NAME makes one)"
            )
        return await services.read(lambda s: services.authenticator.authenticate(s, token))
    except Unauthorized:
        await services.limiter.failed(address)
        if limited:  # a token that verifies is served even so; a wrong one waits
            raise services.limiter.too_many_failures(limited) from None
        raise


PrincipalDep = Annotated[Principal, Depends(current_principal)]


async def authorize_namespace(
    services: Services,
    principal: Principal,
    namespace: str,
    *,
    verb: str,
    resource: str,
    name: str = "",
    group: str = "",
    about_pod: str = "",
) -> NamespaceInfo:
    """The tenancy check: a tenant gets 403 for any namespace not its own, existing or not. A
    node's token gets 403 for any pod not bound to it, existing or not (`about_pod`: the pod a
    request on another resource concerns, such as an event's or a pod's Secret)."""
    hit, info = services.namespaces.lookup_cached(namespace)
    if not hit:
        info = await services.read(lambda s: services.namespaces.lookup(s, namespace))
    object_node = None
    if principal.is_node and name and resource.partition("/")[0] == "pods" and not group:
        object_node = await services.read(lambda s: node_of(s, namespace=namespace, name=name))
    elif principal.is_node and name and resource in ("configmaps", "secrets") and not group:
        object_node = await services.read(
            lambda s: node_using(
                s,
                namespace=namespace,
                node=principal.node_name or "",
                resource=resource,
                name=name,
            )
        )
    elif principal.is_node and about_pod:
        object_node = await services.read(lambda s: node_of(s, namespace=namespace, name=about_pod))
    return authorize(
        principal,
        info,
        verb=verb,
        resource=resource,
        namespace=namespace,
        name=name,
        group=group,
        object_node=object_node,
    )


def respond(request: Request, obj: dict[str, Any]) -> Response:
    """A read's answer: the object or list, or the view the client asks for in `Accept` (a
    Table for `kubectl get`, only the metadata for metadata informers; see app/kube/tables.py)."""
    is_list = str(obj.get("kind", "")).endswith("List")
    view = negotiate(request.headers.get("accept"), is_list=is_list)
    if view == TABLE:
        table = tabulate(obj, request.query_params.get("includeObject", "Metadata"))
        if table is not obj:
            return Response(orjson.dumps(table), media_type=TABLE_MEDIA_TYPE)
    elif view == PARTIAL:
        media_type = PARTIAL_LIST_MEDIA_TYPE if is_list else PARTIAL_MEDIA_TYPE
        return Response(orjson.dumps(partial(obj)), media_type=media_type)
    return json_response(obj)


MAX_WARNINGS = 20
MAX_WARNING_CHARS = 512


def _header_text(text: str) -> str:
    """A warning as header-safe text: printable ASCII only (anything else, CR and LF included,
    is written as \\uXXXX), quotes and backslashes escaped, and cut to a bounded length."""
    out = []
    for char in text[:MAX_WARNING_CHARS]:
        if char in '"\\':
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
    return "".join(out)


def json_response(obj: Any, status_code: int = 200, warnings: list[str] | None = None) -> Response:
    headers = {}
    if warnings:
        headers["Warning"] = ", ".join(
            f'299 - "{_header_text(w)}"' for w in warnings[:MAX_WARNINGS]
        )
    return Response(
        orjson.dumps(obj), status_code=status_code, media_type="application/json", headers=headers
    )
