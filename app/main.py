"""The FastAPI application: `create_app(settings)` wires services, routers and error handling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from sqlalchemy.orm import Session
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__, agent, ui
from app.auth import rules
from app.auth.router import router as tenants_router
from app.billing_api.router import router as billing_router
from app.callbacks.router import router as callbacks_router
from app.db.engine import end_stuck_writers_forever
from app.deps import PrincipalDep, Services, json_response
from app.errors import STATUS_RESPONSES, Forbidden, install_handlers
from app.events.router import router as events_router
from app.faults.router import router as faults_router
from app.inventory.router import router as inventory_router
from app.kube.meta import now
from app.kube.router import router as discovery_router
from app.kube.services import router as services_router
from app.kube.websocket import WebSocketAsHttp
from app.metrics import RequestMetrics
from app.metrics import exposition as metrics_exposition
from app.namespaces.router import router as namespaces_router
from app.namespaces.service import ensure_system_namespaces
from app.pods.router import router as pods_router
from app.process import collector_for_serving
from app.registry.crypto import keyring_for
from app.registry.router import first_router as registry_first_router
from app.registry.router import router as registry_router
from app.resourcemetrics.router import router as resourcemetrics_router
from app.reviews.router import router as reviews_router
from app.server import SERVER_STOPPING
from app.sessions.router import router as sessions_router
from app.settings import Settings
from app.watch.log import newest_after
from billing import ledger

log = logging.getLogger("tessera.api")


def _reconcile(session: Session) -> None:
    """On (re)start: make the usage ledger agree with live pods (see billing.ledger)."""
    result = ledger.reconcile(session, at=now())
    if result.closed or result.opened:
        log.warning(
            "billing reconciled after a restart: %d usage closed, %d opened",
            len(result.closed),
            len(result.opened),
        )


class _NoUpgradeWarning(logging.Filter):
    """kubectl's older exec protocol asks to upgrade a POST to SPDY; uvicorn warns about each
    one, though the request is answered (with a Status saying exec is not offered)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Unsupported upgrade request."


class TrailingSlash:
    """`/api/`, `/apis/`, `/version/` and every other path with one trailing slash answer as
    the path without it (as the Kubernetes API does), rather than with a redirect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] in ("http", "websocket") and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path[:-1]}
            raw = scope.get("raw_path")
            if raw and raw.endswith(b"/"):
                scope["raw_path"] = raw[:-1]
        await self.app(scope, receive, send)


KUBERNETES_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0"}

# A request is matched against the routers in this order, route by route: pods, by far the most
# requested, come first; node leases (every node's heartbeat) soon after. No path is served by two routers (tests/test_main.py), so the order
# decides only how soon a request finds its route.
ROUTERS = (
    pods_router,
    discovery_router,
    callbacks_router,
    registry_first_router,
    namespaces_router,
    events_router,
    services_router,
    inventory_router,
    faults_router,
    tenants_router,
    reviews_router,
    billing_router,
    registry_router,
    sessions_router,
    resourcemetrics_router,
)


async def _virtual_agent(settings: Settings) -> None:
    """`tessera dev`: the demo pool's node agents, through this server's API."""
    from agent.main import load_inventory, run, timing_from
    from app.bootstrap import virtual_nodes_path

    path = virtual_nodes_path(settings)
    if not path.exists():
        return
    inventory = load_inventory(path)
    if not settings.dev_docker_node:  # no engine answered at start: its node waits for one
        inventory = replace(
            inventory, nodes=tuple(n for n in inventory.nodes if n.runtime != "docker")
        )
    await run(inventory, timing_from(settings, "virtual"))


def create_app(
    settings: Settings | None = None, services: Services | None = None, *, embedded: bool = False
) -> FastAPI:
    """`embedded`: also run the scheduler, the node agent and the controller manager in this
    process (`tessera dev`)."""
    settings = settings or Settings()
    if settings.secret_keys:  # a malformed key stops the start, not the first Secret's write
        keyring_for(settings)
    services = services or Services.build(settings)
    services.db.on_changes = services.notifier.publish

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await services.notifier.start()
        services.notifier.follow_log(
            lambda after: services.read(lambda s: newest_after(s, after)),
            every=settings.watch_poll_seconds,
        )
        await asyncio.to_thread(services.db.write, _reconcile)
        # A database migrated by an older Tessera lacks the newer system namespaces
        # (kube-node-lease): create them at start.
        await asyncio.to_thread(services.db.write, ensure_system_namespaces)
        tasks = []
        agents: asyncio.Task[None] | None = None
        managing: asyncio.Task[None] | None = None
        if not services.db.is_sqlite:
            tasks.append(asyncio.create_task(end_stuck_writers_forever(services.db)))
        if settings.callback_delivery:
            from app.callbacks import delivery

            tasks.append(asyncio.create_task(delivery.start(services.db, settings)()))
        if embedded:
            from scheduler.loop import LoopConfig, SchedulingLoop

            tasks.append(
                asyncio.create_task(
                    agent.run_forever(
                        services.db, keep_changes=settings.watch_log_retention, settings=settings
                    )
                )
            )
            config = LoopConfig.from_settings(settings)
            scheduling = SchedulingLoop(services.db, config, notifier=services.notifier)
            tasks.append(asyncio.create_task(scheduling.run_forever()))
            if settings.dev_virtual_agent:
                agents = asyncio.create_task(_virtual_agent(settings))
                tasks.append(agents)
            kubeconfig = settings.effective_controllers_kubeconfig
            if settings.controllers_embedded and kubeconfig.exists():
                from app import controllers

                managing = asyncio.create_task(
                    controllers.run(kubeconfig, lease_seconds=settings.controllers_lease_seconds)
                )
                tasks.append(managing)

        def stopping() -> None:
            """The server has stopped accepting connections (see `app.server`): the embedded
            node agents go first (their requests would only fail from now on), then every
            open stream ends, so that the stop waits for no watch."""
            if agents is not None:
                agents.cancel()
            if managing is not None:
                managing.cancel()
            services.notifier.end_streams()

        try:
            with collector_for_serving():
                yield {SERVER_STOPPING: stopping}
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await services.notifier.stop()
            await services.limiter.close()
            await services.broker.close()
            await asyncio.to_thread(services.writer.close)

    app = FastAPI(
        title="Tessera",
        version=__version__,
        summary="Kubernetes-compatible API of a serverless GPU/CPU compute pool.",
        lifespan=lifespan,
        docs_url=None,  # served by the console, with no CDN (app/ui)
        redoc_url=None,
    )
    app.state.services = services
    install_handlers(app)
    app.add_middleware(RequestMetrics)  # innermost: it reads the route the router matched
    app.add_middleware(WebSocketAsHttp)
    app.add_middleware(TrailingSlash)
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoUpgradeWarning) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_NoUpgradeWarning())
    for router in ROUTERS:
        app.include_router(router)
    ui.install(app, settings)

    @app.get("/version", tags=["discovery"], summary="Server version (Kubernetes-compatible)")
    async def version() -> Response:
        info: dict[str, Any] = {
            **KUBERNETES_VERSION,
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "",
            "goVersion": "",
            "compiler": "",
            "platform": "linux/amd64",
            "tessera": __version__,
        }
        return json_response(info)

    @app.get("/healthz", tags=["health"], response_class=PlainTextResponse, summary="Liveness")
    @app.get("/livez", tags=["health"], response_class=PlainTextResponse, include_in_schema=False)
    async def healthz() -> str:
        return "ok"

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=PlainTextResponse,
        responses={
            code: {
                "description": STATUS_RESPONSES[code]["description"],
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/StatusModel"}}
                },
            }
            for code in (401, 403, 429)
        },
        summary="Prometheus metrics (admins only: kubectl get --raw /metrics)",
    )
    async def prometheus_metrics(principal: PrincipalDep) -> Response:
        decision = rules.decide_path(principal, "get", "/metrics")
        if not decision.allowed:
            raise Forbidden(
                f'forbidden: User "{principal.username}" cannot get path "/metrics": '
                f"{decision.reason}"
            )
        body, content_type = await asyncio.to_thread(metrics_exposition, services.db)
        return Response(body, media_type=content_type)

    @app.get(
        "/readyz",
        tags=["health"],
        response_class=PlainTextResponse,
        summary="Readiness: the database answers",
    )
    async def readyz() -> str:
        from sqlalchemy import text

        await services.read(lambda s: s.execute(text("SELECT 1")))
        return "ok"

    return app
