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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from fastapi import APIRouter, Request, WebSocket
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect

from app import errors
from app.auth.service import Principal
from app.deps import PrincipalDep, Services, ServicesDep, authenticate, authorize_namespace
from app.errors import (
    STATUS_RESPONSES,
    BadRequest,
    Forbidden,
    NotFound,
    TesseraError,
    status_for,
)
from app.pods import service as pods
from app.sessions import spdy
from app.sessions.relay import END, READY, Subscription, node_channel, session_channel
from app.watch.stream import token_check

log = logging.getLogger("tessera.sessions")
router = APIRouter(tags=["pods"], responses=STATUS_RESPONSES)

STREAM_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
PORTFORWARD_PROTOCOLS = ("v4.channel.k8s.io", "portforward.k8s.io")
SPDY_TUNNEL = "SPDY/3.1+portforward.k8s.io"  # kubectl 1.31+: SPDY inside the WebSocket
MAX_FORWARDS = 32  # local connections one kubectl port-forward carries at once
KINDS = {"exec": "exec", "attach": "attach", "portforward": "port-forward"}
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 64 * 1024
MAX_PORTS = 16
ERROR_CHANNEL = 3
SPDY_WORDS = (
    " (kubectl port-forward 1.31 and newer tunnels SPDY in a WebSocket, which Tessera serves; "
    "SPDY alone, as older kubectl speaks it after an HTTP upgrade, it does not)"
)


def _flag(values: list[str], default: bool = False) -> bool:
    if not values:
        return default
    return values[-1].lower() in ("1", "true", "yes")


async def received(websocket: WebSocket) -> AsyncIterator[bytes]:
    """The messages of a WebSocket, as bytes, until it closes."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes")
        yield data if data is not None else (message.get("text") or "").encode()


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


def base_offer(pod: dict[str, Any], *, kind: str) -> dict[str, Any]:
    """The pod of a session, as its node's agent is offered it."""
    return {
        "kind": kind,
        "namespace": pod["metadata"]["namespace"],
        "pod": pod["metadata"]["name"],
        "uid": pod["metadata"]["uid"],
        "node": pod["spec"]["nodeName"],
    }


def offer_of(pod: dict[str, Any], *, kind: str, query: Any) -> dict[str, Any]:
    """What the node's agent is offered: the session's parameters, checked (BadRequest)."""
    name = pod["metadata"]["name"]
    offer = base_offer(pod, kind=kind)
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


async def agent_connected(services: Services, offer: dict[str, Any]) -> None:
    """503 in words unless the agent of the pod's node listens for sessions: said before a
    port-forward starts (its connections come later, where kubectl would only log it)."""
    node = offer["node"]
    if not await services.broker.listeners(node_channel(node)):
        raise errors.Unavailable(
            f'the agent of node "{node}" is not connected: it cannot run '
            f"{KINDS[offer['kind']]} now (is it running, and of a Tessera that serves sessions?)"
        )


def _pick(offered: list[str], kind: str) -> str | None:
    ours = (*PORTFORWARD_PROTOCOLS, SPDY_TUNNEL) if kind == "portforward" else STREAM_PROTOCOLS
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
            if protocol == SPDY_TUNNEL:  # the ports come with each stream, not in the query
                offer = base_offer(pod, kind=kind)
                await agent_connected(services, offer)
            else:
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
            relay = relay_spdy if protocol == SPDY_TUNNEL else relay_user
            await relay(websocket, services, offer, token_check(websocket, services))
        finally:
            release()

    stream.__name__ = f"stream_{kind}"
    router.add_api_websocket_route(
        f"/api/v1/namespaces/{{namespace}}/pods/{{name}}/{kind}", stream, name=f"ws_{kind}_pod"
    )

    async def plain(
        namespace: str, name: str, request: Request, services: ServicesDep, principal: PrincipalDep
    ) -> Response:
        pod = await pod_of(services, principal, kind=kind, namespace=namespace, name=name)
        if kind == "portforward":  # kubectl came here because the WebSocket was refused
            await agent_connected(services, base_offer(pod, kind=kind))
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


class AgentUnavailable(Exception):
    """The node's agent did not take the session: a Status says why."""

    def __init__(self, message: str, reason: str, code: int) -> None:
        super().__init__(message)
        self.message, self.reason, self.code = message, reason, code


@contextlib.asynccontextmanager
async def agent_session(
    services: Services, offer: dict[str, Any]
) -> AsyncIterator[tuple[Callable[[bytes], Awaitable[int]], Subscription]]:
    """Offer a session to the node's agent and wait until it listens (AgentUnavailable if it
    is not connected or does not answer in time); yields a function that sends a frame toward the
    agent and the subscription of the agent's frames. Leaving ends the agent's side."""
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

    async def send(data: bytes) -> int:
        return await broker.publish(to_agent, data)

    async with broker.subscribe(session_channel(node, session_id, "out")) as from_agent:
        if not await broker.publish(node_channel(node), orjson.dumps(offer)):
            raise AgentUnavailable(
                f'the agent of node "{node}" is not connected: it cannot run {KINDS[offer["kind"]]} '
                "now (is it running, and of a Tessera that serves sessions?)",
                "ServiceUnavailable",
                503,
            )
        if await from_agent.get(timeout=settings.session_connect_seconds) != READY:
            await send(END)
            raise AgentUnavailable(
                f'the agent of node "{node}" did not take the session within '
                f"{settings.session_connect_seconds:g}s",
                "Timeout",
                504,
            )
        try:
            yield send, from_agent
        finally:
            with contextlib.suppress(Exception):
                await send(END)


async def relay_user(
    websocket: WebSocket,
    services: Services,
    offer: dict[str, Any],
    authorized: Callable[[], Awaitable[bool]],
) -> None:
    """Offer the session to the node's agent, then carry frames both ways until either side
    ends, the session idles, its token is revoked or its pod ends."""
    settings = services.settings
    last = time.monotonic()

    async def fail(message: str, reason: str = "InternalError", code: int = 500) -> None:
        with contextlib.suppress(Exception):
            await websocket.send_bytes(status_frame(failure(message, reason, code)))

    try:
        async with agent_session(services, offer) as (to_agent, from_agent):

            async def upstream() -> None:
                nonlocal last
                async for data in received(websocket):
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
                        await to_agent(data)

            async def downstream() -> None:
                nonlocal last
                async for data in from_agent:
                    if data == END:
                        return
                    if data == READY:
                        continue
                    last = time.monotonic()
                    await websocket.send_bytes(data)

            async def idle() -> str | None:
                if time.monotonic() - last > settings.session_idle_seconds:
                    return (
                        f"the session was idle for {settings.session_idle_seconds:g}s "
                        "(TESSERA_SESSION_IDLE_SECONDS)"
                    )
                return None

            await _until_first_ends(
                [upstream(), downstream(), _watchdog(services, offer, authorized, idle, fail)]
            )
    except AgentUnavailable as unavailable:
        await fail(unavailable.message, unavailable.reason, unavailable.code)
    finally:
        with contextlib.suppress(Exception):
            await websocket.close()


async def _watchdog(
    services: Services,
    offer: dict[str, Any],
    authorized: Callable[[], Awaitable[bool]],
    idle: Callable[[], Awaitable[str | None]],
    fail: Callable[[str, str, int], Awaitable[None]],
) -> None:
    """Returns (after saying why) once the session idled, its token was revoked or its pod
    ended."""
    while True:
        await asyncio.sleep(services.settings.session_check_seconds)
        idled = await idle()
        if idled:
            await fail(idled, "Timeout", 408)
            return
        if not await authorized():
            await fail("the session's token was revoked", "Unauthorized", 401)
            return
        ended = await _pod_ended(services, offer)
        if ended:
            await fail(ended, "NotFound", 404)
            return


async def _until_first_ends(work: list[Coroutine[Any, Any, None]]) -> None:
    """Run the coroutines until one returns; cancel the rest."""
    tasks = [asyncio.create_task(w) for w in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except Exception:  # pragma: no cover - a broken socket: end the session
        log.debug("a session ended by an error", exc_info=True)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task


# --- kubectl port-forward: SPDY in a WebSocket ----------------------------------------------


@dataclass
class _Forward:
    """One local connection of a `kubectl port-forward`: its two streams (error, data) and the
    agent session that connects it to the pod's port."""

    port: int
    error_stream: int = 0
    data_stream: int = 0
    to_pod: asyncio.Queue[bytes | None] = field(default_factory=lambda: asyncio.Queue(256))
    task: asyncio.Task[None] | None = None


async def relay_spdy(
    websocket: WebSocket,
    services: Services,
    offer: dict[str, Any],
    authorized: Callable[[], Awaitable[bool]],
) -> None:
    """kubectl's port-forward: a SPDY connection in the WebSocket (app/sessions/spdy.py). Each
    local connection comes as an error and a data stream with the same `requestid`; each is
    one session with the node's agent, to the stream's `port`, as the v4 protocol's are. The
    connection ends when kubectl goes, idles, its token is revoked or its pod ends."""
    settings = services.settings
    conn = spdy.Connection()
    lock = asyncio.Lock()
    forwards: dict[str, _Forward] = {}
    by_stream: dict[int, _Forward] = {}
    last = time.monotonic()

    async def send(data: bytes) -> None:
        async with lock:
            await websocket.send_bytes(data)

    async def end(forward: _Forward, error: str = "") -> None:
        """FIN both streams, the error stream with what went wrong first."""
        with contextlib.suppress(Exception):
            if error:
                await send(conn.data_frames(forward.error_stream, error.encode()))
            await send(conn.data_frames(forward.error_stream, b"", fin=True))
            await send(conn.data_frames(forward.data_stream, b"", fin=True))

    async def forward_one(forward: _Forward) -> None:
        nonlocal last
        error = ""
        try:
            async with agent_session(services, {**offer, "ports": [forward.port]}) as (
                to_agent,
                from_agent,
            ):
                closed = asyncio.Event()  # kubectl sent FIN: nothing more to the pod

                async def up() -> None:
                    while (data := await forward.to_pod.get()) is not None:
                        await to_agent(b"\x00" + data)
                    closed.set()

                pump = asyncio.create_task(up())
                opened: set[int] = set()  # each channel opens with its port number
                quiet_since = time.monotonic()
                try:
                    while True:
                        frame = await from_agent.get(timeout=0.5)
                        if frame is None:  # after kubectl's FIN, the pod has a second to answer
                            if closed.is_set() and time.monotonic() - quiet_since > 1.0:
                                return
                            continue
                        if frame == END:
                            return
                        if frame == READY or not frame:
                            continue
                        quiet_since = last = time.monotonic()
                        channel, payload = frame[0], frame[1:]
                        if channel in (0, 1) and channel not in opened:
                            opened.add(channel)
                        elif channel == 0:
                            await send(conn.data_frames(forward.data_stream, payload))
                        elif channel == 1:
                            error += payload.decode(errors="replace")
                        elif channel == ERROR_CHANNEL:
                            status = orjson.loads(payload)
                            if status.get("status") == "Failure":
                                error += str(status.get("message", ""))
                finally:
                    pump.cancel()
        except AgentUnavailable as unavailable:
            error = unavailable.message
        except (orjson.JSONDecodeError, TypeError):
            error = "the node's agent answered with a malformed Status"
        finally:
            await end(forward, error)

    async def stream_opened(frame: spdy.Frame) -> None:
        request = frame.headers.get("requestid", "")
        if request not in forwards and len(forwards) >= 2 * MAX_FORWARDS:
            # connections whose other stream has not come yet, or not yet forgotten: bounded
            await send(conn.reset_frame(frame.stream_id, spdy.RST_REFUSED_STREAM))
            return
        await send(conn.reply_frame(frame.stream_id))
        kind = frame.headers.get("streamtype", "")
        try:
            port = int(frame.headers.get("port", ""))
            if not 0 < port < 65536:
                raise ValueError
        except ValueError:
            port = 0
        forward = forwards.get(request)
        if forward is None:
            forward = forwards[request] = _Forward(port)
        if kind == "error":
            forward.error_stream = frame.stream_id
        elif kind == "data":
            forward.data_stream = frame.stream_id
            by_stream[frame.stream_id] = forward
        if not (forward.error_stream and forward.data_stream) or forward.task is not None:
            return
        running = sum(1 for f in forwards.values() if f.task is not None and not f.task.done())
        if port == 0 or kind not in ("error", "data"):
            await end(forward, f'invalid port "{frame.headers.get("port", "")}"')
        elif running >= MAX_FORWARDS:
            await end(
                forward,
                f"{running} connections are forwarded already, the most one "
                "port-forward carries: close one",
            )
        else:
            forward.task = asyncio.create_task(forward_one(forward))
        for name, done in list(forwards.items()):  # forget the ended ones
            if done.task is not None and done.task.done():
                forwards.pop(name)
                by_stream.pop(done.data_stream, None)

    async def read() -> None:
        nonlocal last
        async for data in received(websocket):
            try:
                frames = conn.feed(data)
            except spdy.ProtocolError as exc:
                log.info("port-forward ended: %s", exc)
                return
            for frame in frames:
                if frame.kind == spdy.SYN_STREAM:
                    await stream_opened(frame)
                elif frame.kind == 0:
                    forward = by_stream.get(frame.stream_id)
                    if forward is None:
                        continue
                    last = time.monotonic()
                    if frame.data:
                        await forward.to_pod.put(frame.data)
                    if frame.fin:
                        await forward.to_pod.put(None)
                elif frame.kind == spdy.RST_STREAM:
                    forward = by_stream.get(frame.stream_id)
                    if forward is not None and forward.task is not None:
                        forward.task.cancel()
                elif frame.kind == spdy.PING:
                    await send(conn.ping_frame(frame.value))
                elif frame.kind == spdy.GOAWAY:
                    return

    async def fail(message: str, reason: str = "InternalError", code: int = 500) -> None:
        log.info("port-forward to %s/%s ended: %s", offer["namespace"], offer["pod"], message)

    async def idle() -> str | None:
        if any(f.task is not None and not f.task.done() for f in forwards.values()):
            return None  # an open connection may be quiet for as long as it likes
        if time.monotonic() - last > settings.session_idle_seconds:
            return f"no connection for {settings.session_idle_seconds:g}s"
        return None

    try:
        await _until_first_ends([read(), _watchdog(services, offer, authorized, idle, fail)])
    finally:
        for forward in forwards.values():
            if forward.task is not None:
                forward.task.cancel()
        with contextlib.suppress(Exception):
            await send(conn.goaway_frame(0))
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
    authorized = token_check(websocket, services)
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
            async for data in received(websocket):
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
