"""`kubectl exec`, `attach` and `port-forward`: WebSockets relayed to the agent of the pod's node.

The user's side (`/api/v1/namespaces/{ns}/pods/{name}/exec|attach|portforward`) speaks the
Kubernetes channel protocols: `v5.channel.k8s.io` (kubectl 1.30+: a frame on channel 255 closes
stdin) and `v4.channel.k8s.io` (older clients, the official Python client) for exec and attach;
`v4.channel.k8s.io` / `portforward.k8s.io` for port-forward (a data and an error channel per
port, each opened with the port number, as the kubelet does). Each binary frame is one byte of
channel (0 stdin, 1 stdout, 2 stderr, 3 the final Status, 4 terminal resize) then data.

The agent's side: the agent of a node keeps one WebSocket open (`/api/v1/nodes/{node}/sessions`,
with its node token) on which it is offered each session, and opens one more per session
(`.../sessions/{id}`) that carries the session's frames. The two sides meet through the broker
(relay.py), so they need not land on one API process.

The same checks as every pod subresource come first (a tenant's token: only its own
namespaces, 403 otherwise; the pod must be running on a node); then bounds: sessions per tenant
(per API process), per node (the agent's), the size of a frame, idle time; a session ends when
its token is revoked or its pod ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from fastapi import APIRouter, Request, WebSocket
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect

from app.auth.service import Principal
from app.deps import PrincipalDep, Services, ServicesDep, authenticate, authorize_namespace
from app.errors import (
    STATUS_RESPONSES,
    BadRequest,
    Forbidden,
    NotFound,
    TesseraError,
    Unauthorized,
    status_for,
)
from app.pods import service as pods
from app.sessions.relay import END, READY, node_channel, session_channel

log = logging.getLogger("tessera.sessions")
router = APIRouter(tags=["pods"], responses=STATUS_RESPONSES)

STREAM_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
PORTFORWARD_PROTOCOLS = ("v4.channel.k8s.io", "portforward.k8s.io")
KINDS = {"exec": "exec", "attach": "attach", "portforward": "port-forward"}
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 64 * 1024
MAX_PORTS = 16
ERROR_CHANNEL = 3
SPDY_WORDS = (
    " (kubectl port-forward speaks SPDY, tunnelled in a WebSocket or not, which Tessera does not "
    "serve: forward with a client of the v4.channel.k8s.io protocol, such as the official "
    "Python client's portforward())"
)


def _flag(values: list[str], default: bool = False) -> bool:
    if not values:
        return default
    return values[-1].lower() in ("1", "true", "yes")


def status_frame(status: dict[str, Any]) -> bytes:
    return bytes([ERROR_CHANNEL]) + orjson.dumps(status)


def failure(message: str, reason: str = "InternalError", code: int = 500) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def services_of(connection: WebSocket | Request) -> Services:
    return cast(Services, connection.app.state.services)


async def _principal(connection: WebSocket, services: Services) -> Principal:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    principal = await authenticate(
        cast(Request, connection), services, token.strip(), scheme=scheme
    )
    await services.limiter.check(principal)
    return principal


def _token_check(connection: WebSocket, services: Services) -> Callable[[], Awaitable[bool]]:
    token = connection.headers.get("authorization", "").partition(" ")[2].strip()

    async def still_authorized() -> bool:
        try:
            await services.read(lambda s: services.authenticator.authenticate(s, token))
        except Unauthorized:
            return False
        return True

    return still_authorized


async def _deny(websocket: WebSocket, error: TesseraError) -> None:
    """Refuse the upgrade with the Status a plain request would get."""
    status = status_for(error)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(status.response())
    else:  # pragma: no cover - uvicorn's websockets implementation has the extension
        await websocket.close(code=1008, reason=error.message[:120])


# --- the user's side ------------------------------------------------------------------------


async def pod_of(
    services: Services, principal: Principal, *, kind: str, namespace: str, name: str
) -> dict[str, Any]:
    """The pod of a session, after the checks every pod subresource makes (NotFound, Forbidden
    as a plain request gets them), running on a node."""
    command = KINDS[kind]
    await authorize_namespace(
        services, principal, namespace, verb="create", resource=f"pods/{kind}", name=name
    )
    pod = await services.read(lambda s: pods.get(s, namespace=namespace, name=name))
    phase = pod["status"].get("phase")
    if phase in ("Succeeded", "Failed"):
        raise BadRequest(
            f"cannot {command} into a container in a completed pod; current phase is {phase}"
        )
    node = pod["spec"].get("nodeName")
    if not node:
        raise BadRequest(f'pod "{name}" does not have a host assigned')
    return pod


def offer_of(pod: dict[str, Any], *, kind: str, query: Any) -> dict[str, Any]:
    """What the node's agent is offered: the session's parameters, checked (BadRequest)."""
    name = pod["metadata"]["name"]
    offer: dict[str, Any] = {
        "kind": kind,
        "namespace": pod["metadata"]["namespace"],
        "pod": name,
        "uid": pod["metadata"]["uid"],
        "node": pod["spec"]["nodeName"],
    }
    if kind == "portforward":
        ports: list[int] = []
        for value in query.getlist("ports"):
            for part in str(value).split(","):
                if not part.strip():
                    continue
                try:
                    port = int(part)
                except ValueError:
                    raise BadRequest(f'port "{part}" is not a number') from None
                if not 0 < port < 65536:
                    raise BadRequest(f"port {port} must be between 1 and 65535")
                ports.append(port)
        if not ports:
            raise BadRequest("at least one port must be given (?ports=8080)")
        if len(ports) > MAX_PORTS:
            raise BadRequest(f"{len(ports)} ports: forward at most {MAX_PORTS} in one session")
        offer["ports"] = ports
        return offer
    containers = [c["name"] for c in pod["spec"].get("containers", [])]
    container = query.get("container")
    if not container:
        if len(containers) != 1:
            raise BadRequest(
                f"a container name must be specified for pod {name}, choose one of: "
                f"[{' '.join(containers)}]"
            )
        container = containers[0]
    if container not in containers:
        raise BadRequest(f"container {container} is not valid for pod {name}")
    stdin = _flag(query.getlist("stdin"))
    stdout = _flag(query.getlist("stdout"))
    stderr = _flag(query.getlist("stderr"))
    tty = _flag(query.getlist("tty"))
    if tty:
        stderr = False  # a terminal joins them, as the kubelet does
    if not (stdin or stdout or stderr):
        raise BadRequest("you must specify at least one of stdin, stdout, stderr")
    offer.update(container=container, stdin=stdin, stdout=stdout, stderr=stderr, tty=tty)
    if kind == "exec":
        argv = [str(a) for a in query.getlist("command")]
        if not argv:
            raise BadRequest("you must specify at least 1 command")
        if len(argv) > MAX_COMMAND_ARGS or sum(map(len, argv)) > MAX_COMMAND_BYTES:
            raise BadRequest(
                f"the command is too long: at most {MAX_COMMAND_ARGS} arguments and "
                f"{MAX_COMMAND_BYTES} bytes"
            )
        offer["command"] = argv
    return offer


def _pick(offered: list[str], kind: str) -> str | None:
    ours = PORTFORWARD_PROTOCOLS if kind == "portforward" else STREAM_PROTOCOLS
    for protocol in ours:
        if protocol in offered:
            return protocol
    return None


def _user_route(kind: str) -> None:
    command = KINDS[kind]

    async def stream(websocket: WebSocket, namespace: str, name: str) -> None:
        services = services_of(websocket)
        settings = services.settings
        try:
            principal = await _principal(websocket, services)
            pod = await pod_of(services, principal, kind=kind, namespace=namespace, name=name)
            protocol = _pick(list(websocket.scope.get("subprotocols") or []), kind)
            if protocol is None:
                wanted = PORTFORWARD_PROTOCOLS if kind == "portforward" else STREAM_PROTOCOLS
                raise BadRequest(
                    f"{command} is served over WebSocket with the subprotocols "
                    f"{', '.join(wanted)}; this client offered "
                    f"{', '.join(websocket.scope.get('subprotocols') or []) or 'none'}"
                    + (SPDY_WORDS if kind == "portforward" else "")
                )
            offer = offer_of(pod, kind=kind, query=websocket.query_params)
            owner = (
                f'tenant "{principal.tenant_name}"' if principal.tenant_name else principal.username
            )
            release = services.sessions.acquire(owner, settings.session_max_per_tenant)
        except TesseraError as error:
            await _deny(websocket, error)
            return
        try:
            await websocket.accept(subprotocol=protocol)
            await relay_user(websocket, services, offer, _token_check(websocket, services))
        finally:
            release()

    stream.__name__ = f"stream_{kind}"
    router.add_api_websocket_route(
        f"/api/v1/namespaces/{{namespace}}/pods/{{name}}/{kind}", stream, name=f"ws_{kind}_pod"
    )

    async def plain(
        namespace: str, name: str, request: Request, services: ServicesDep, principal: PrincipalDep
    ) -> Response:
        await pod_of(services, principal, kind=kind, namespace=namespace, name=name)
        raise BadRequest(
            f"{command} is served over WebSocket only ({', '.join(STREAM_PROTOCOLS)}; "
            "port-forward: v4.channel.k8s.io), not SPDY: use kubectl 1.30 or newer, or a client "
            "that speaks the WebSocket protocols" + (SPDY_WORDS if kind == "portforward" else "")
        )

    for method in ("GET", "POST"):
        router.add_api_route(
            f"/api/v1/namespaces/{{namespace}}/pods/{{name}}/{kind}",
            plain,
            methods=[method],
            name=f"connect_{method.lower()}_{kind}_pod",
            summary=f"{command}: a WebSocket session ({', '.join(STREAM_PROTOCOLS)}); "
            "a plain request answers 400",
            status_code=400,
            response_description=f"{command} needs a WebSocket: a Status saying so",
        )


for _kind in KINDS:
    _user_route(_kind)


async def relay_user(
    websocket: WebSocket,
    services: Services,
    offer: dict[str, Any],
    authorized: Callable[[], Awaitable[bool]],
) -> None:
    """Offer the session to the node's agent, then carry frames both ways until either side
    ends, the session idles, its token is revoked or its pod ends."""
    settings = services.settings
    broker = services.broker
    session_id = secrets.token_urlsafe(18)
    node = offer["node"]
    offer = {
        **offer,
        "id": session_id,
        # the agent's backstop, for an API process that vanished: later than this side's
        # watchdog, which says why the session ended
        "idleSeconds": backstop(settings),
        "maxFrameBytes": settings.session_max_frame_bytes,
    }
    to_agent = session_channel(node, session_id, "in")
    last = time.monotonic()

    async def fail(message: str, reason: str = "InternalError", code: int = 500) -> None:
        with contextlib.suppress(Exception):
            await websocket.send_bytes(status_frame(failure(message, reason, code)))

    async with broker.subscribe(session_channel(node, session_id, "out")) as from_agent:
        reached = await broker.publish(node_channel(node), orjson.dumps(offer))
        if not reached:
            await fail(
                f'the agent of node "{node}" is not connected: it cannot run {KINDS[offer["kind"]]} '
                "now (is it running, and of a Tessera that serves sessions?)",
                "ServiceUnavailable",
                503,
            )
            await websocket.close()
            return
        first = await from_agent.get(timeout=settings.session_connect_seconds)
        if first != READY:
            await fail(
                f'the agent of node "{node}" did not take the session within '
                f"{settings.session_connect_seconds:g}s",
                "Timeout",
                504,
            )
            await broker.publish(to_agent, END)
            await websocket.close()
            return

        async def upstream() -> None:
            nonlocal last
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes")
                if data is None:
                    data = (message.get("text") or "").encode()
                if len(data) > settings.session_max_frame_bytes:
                    await fail(
                        f"a frame of {len(data)} bytes; send at most "
                        f"{settings.session_max_frame_bytes} bytes a frame",
                        "RequestEntityTooLarge",
                        413,
                    )
                    return
                last = time.monotonic()
                if data:
                    await broker.publish(to_agent, data)

        async def downstream() -> None:
            nonlocal last
            async for data in from_agent:
                if data == END:
                    return
                if data == READY:
                    continue
                last = time.monotonic()
                await websocket.send_bytes(data)

        async def watchdog() -> None:
            every = settings.session_check_seconds
            while True:
                await asyncio.sleep(every)
                if time.monotonic() - last > settings.session_idle_seconds:
                    await fail(
                        f"the session was idle for {settings.session_idle_seconds:g}s "
                        "(TESSERA_SESSION_IDLE_SECONDS)",
                        "Timeout",
                        408,
                    )
                    return
                if not await authorized():
                    await fail("the session's token was revoked", "Unauthorized", 401)
                    return
                ended = await _pod_ended(services, offer)
                if ended:
                    await fail(ended, "NotFound", 404)
                    return

        tasks = [asyncio.create_task(t()) for t in (upstream, downstream, watchdog)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except Exception:  # pragma: no cover - a broken socket: end the session
            log.debug("session %s ended by an error", session_id, exc_info=True)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                    await task
            with contextlib.suppress(Exception):
                await broker.publish(to_agent, END)
            with contextlib.suppress(Exception):
                await websocket.close()


def backstop(settings: Any) -> float:
    """How long the agent's side of a session waits without traffic: past the user's side's
    idle limit (whose watchdog ends the session and says why) by a margin."""
    return (
        settings.session_idle_seconds
        + settings.session_connect_seconds
        + 2 * max(settings.session_check_seconds, 1.0)
    )


async def _pod_ended(services: Services, offer: dict[str, Any]) -> str | None:
    try:
        pod = await services.read(
            lambda s: pods.get(s, namespace=offer["namespace"], name=offer["pod"])
        )
    except NotFound:
        return f'pod "{offer["pod"]}" was deleted'
    if pod["metadata"]["uid"] != offer["uid"]:
        return f'pod "{offer["pod"]}" was deleted'
    phase = pod["status"].get("phase")
    if phase in ("Succeeded", "Failed"):
        return f'pod "{offer["pod"]}" ended ({phase})'
    return None


# --- the agent's side -----------------------------------------------------------------------


async def _node_principal(websocket: WebSocket, node: str) -> tuple[Services, Principal] | None:
    services = services_of(websocket)
    try:
        principal = await _principal(websocket, services)
        if not (principal.is_node and principal.node_name == node):
            raise Forbidden(
                f'forbidden: only the agent of node "{node}", with its node token, takes '
                "its sessions"
            )
    except TesseraError as error:
        await _deny(websocket, error)
        return None
    return services, principal


@router.websocket("/api/v1/nodes/{node}/sessions", name="ws_node_sessions")
async def node_sessions(websocket: WebSocket, node: str) -> None:
    """The agent's control connection: each session offered to its node, as a JSON text
    message. It lasts until the agent goes or its token is revoked."""
    found = await _node_principal(websocket, node)
    if found is None:
        return
    services = found[0]
    authorized = _token_check(websocket, services)
    async with services.broker.subscribe(node_channel(node)) as offers:
        await websocket.accept()  # subscribed first: an offer made once it is open reaches it

        async def forward() -> None:
            async for offer in offers:
                await websocket.send_text(offer.decode())

        async def listen() -> None:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass

        async def check() -> None:
            while True:
                await asyncio.sleep(services.settings.session_check_seconds)
                if services.notifier.stopping or not await authorized():
                    return

        tasks = [asyncio.create_task(t()) for t in (forward, listen, check)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                    await task
            with contextlib.suppress(Exception):
                await websocket.close()


@router.websocket("/api/v1/nodes/{node}/sessions/{session_id}", name="ws_node_session")
async def node_session(websocket: WebSocket, node: str, session_id: str) -> None:
    """The agent's side of one session: frames from the container to the user and back."""
    found = await _node_principal(websocket, node)
    if found is None:
        return
    services = found[0]
    settings = services.settings
    broker = services.broker
    await websocket.accept()
    to_user = session_channel(node, session_id, "out")
    async with broker.subscribe(session_channel(node, session_id, "in")) as from_user:
        await broker.publish(to_user, READY)

        last = time.monotonic()

        async def upstream() -> None:
            nonlocal last
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes") or (message.get("text") or "").encode()
                if len(data) > settings.session_max_frame_bytes + 1:
                    return
                last = time.monotonic()
                if data:
                    await broker.publish(to_user, data)

        async def downstream() -> None:
            nonlocal last
            idle = backstop(settings)  # the user's side says "idle" first, in words
            while True:
                data = await from_user.get(timeout=idle)
                if data is None:
                    if time.monotonic() - last < idle:
                        continue  # the container's output flowed meanwhile: not idle
                    return  # the user's side is gone without a word (its process died)
                if data == END:
                    return
                last = time.monotonic()
                await websocket.send_bytes(data)

        tasks = [asyncio.create_task(t()) for t in (upstream, downstream)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                    await task
            with contextlib.suppress(Exception):
                await broker.publish(to_user, END)
            with contextlib.suppress(Exception):
                await websocket.close()
