"""Sessions on the node's pods (`kubectl exec`, `attach`, `port-forward`), with no listening port.

The agent keeps one WebSocket open to the API (`/api/v1/nodes/{node}/sessions`, its node token)
on which the API offers each session (JSON: its id, kind, pod, container, command, ports...);
for each it opens one more (`.../sessions/{id}`) that carries the session's frames in the
Kubernetes channel framing (one byte of channel, then data; the final Status on channel 3),
and hands it to the runtime's `session(offer, link)`. The docker runtime runs it against the
engine (agent/docker_sessions.py); a runtime without `session` (the virtual one: its pods run
no processes) answers with a Status that says so.

Bounds: at most `session_max` sessions at once on the node (a Status with 429 beyond), frames
of at most the API's `maxFrameBytes`, and a session with no byte either way for the API's
`idleSeconds` ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agent.client import NodeClient

log = logging.getLogger("tessera.agent.sessions")

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
MAX_SEEN = 4096  # session ids remembered (an offer seen twice is served once)
CONNECT_TIMEOUT = 15.0


def success() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


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


def exit_status(command: list[str], code: int) -> dict[str, Any]:
    """What the kubelet answers for a command that exited with `code` (kubectl exits with it)."""
    if code == 0:
        return success()
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"{command}, exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class Link:
    """One session's frames over its WebSocket to the API."""

    def __init__(self, ws: ClientConnection, *, max_frame: int, idle: float) -> None:
        self.ws = ws
        self.max_frame = max(max_frame, 1024)
        self.idle = idle
        self.last = time.monotonic()
        self.closed = False

    async def recv(self) -> tuple[int, bytes] | None:
        """The next frame from the user: (channel, data); None when the session ends."""
        while True:
            try:
                async with asyncio.timeout(self.idle):
                    message = await self.ws.recv()
            except TimeoutError:
                if time.monotonic() - self.last < self.idle:
                    continue  # output flowed meanwhile: not idle
                self.closed = True
                return None
            except ConnectionClosed:
                self.closed = True
                return None
            data = message.encode() if isinstance(message, str) else bytes(message)
            if not data:
                continue
            self.last = time.monotonic()
            return data[0], data[1:]

    async def send(self, channel: int, data: bytes) -> None:
        self.last = time.monotonic()
        step = self.max_frame - 1
        for at in range(0, max(len(data), 1), step):
            await self.ws.send(bytes([channel]) + data[at : at + step])

    async def finish(self, status: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed, OSError):
            await self.ws.send(bytes([ERROR]) + json.dumps(status).encode())
        with contextlib.suppress(ConnectionClosed, OSError):
            await self.ws.close()


def refusal(kind: str, node: str, runtime: str) -> dict[str, Any]:
    what = {"exec": "exec into", "attach": "attach to", "portforward": "forward a port to"}
    return failure(
        f'node "{node}" runs the {runtime} runtime: its pods run no processes, so there is '
        f"nothing to {what.get(kind, kind)}; run the pod on a node labelled "
        "tessera.io/runtime=docker for exec, attach and port-forward",
        "BadRequest",
        400,
    )


class SessionHub:
    """The node's end of the sessions the API offers it."""

    def __init__(self, client: NodeClient, runtime: Any, *, max_sessions: int) -> None:
        self.client = client
        self.runtime = runtime
        self.max_sessions = max_sessions
        self.active: dict[str, asyncio.Task[None]] = {}
        self._seen: dict[str, None] = {}
        base = client.server
        self.url = ("wss://" + base[8:]) if base.startswith("https://") else "ws://" + base[7:]
        self.ssl: ssl.SSLContext | None = None
        if base.startswith("https://"):
            self.ssl = ssl.create_default_context(
                cafile=str(client.ca_cert) if client.ca_cert else None
            )

    def _connect(self, path: str, max_size: int | None = 64 * 1024) -> Any:
        return connect(
            self.url + path,
            additional_headers={"Authorization": f"Bearer {self.client.token}"},
            ssl=self.ssl,
            max_size=max_size,
            open_timeout=CONNECT_TIMEOUT,
            ping_interval=20,
            ping_timeout=20,
        )

    async def run(self) -> None:
        """Take offers until cancelled, connecting again (with back-off) when the API goes."""
        delay = 0.2
        path = f"/api/v1/nodes/{self.client.node}/sessions"
        while True:
            try:
                async with self._connect(path) as ws:
                    delay = 0.2
                    async for message in ws:
                        self._offered(message)
            except asyncio.CancelledError:
                raise
            except InvalidStatus as exc:
                status = exc.response.status_code
                log.warning(
                    "node %s: the API refused the sessions connection (%s); retrying",
                    self.client.node,
                    status,
                )
                delay = max(delay, 5.0)
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                log.info("node %s: sessions connection lost (%s); again", self.client.node, exc)
            except Exception:  # never the end of the node's other loops (lease, pods)
                log.exception("node %s: sessions connection failed; again", self.client.node)
                delay = max(delay, 5.0)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _offered(self, message: str | bytes) -> None:
        try:
            offer = json.loads(message)
            session_id = str(offer["id"])
        except (ValueError, KeyError, TypeError):
            log.warning(
                "node %s: a session offer that is not one: %.200r", self.client.node, message
            )
            return
        if session_id in self._seen:
            return
        self._seen[session_id] = None
        while len(self._seen) > MAX_SEEN:
            self._seen.pop(next(iter(self._seen)))
        task = asyncio.create_task(self._serve(offer))
        self.active[session_id] = task
        task.add_done_callback(lambda _t: self.active.pop(session_id, None))

    async def _serve(self, offer: dict[str, Any]) -> None:
        max_frame = int(offer.get("maxFrameBytes") or 256 * 1024)
        idle = float(offer.get("idleSeconds") or 900.0)
        path = f"/api/v1/nodes/{self.client.node}/sessions/{offer['id']}"
        try:
            async with self._connect(path, max_size=max_frame + 1024) as ws:
                link = Link(ws, max_frame=max_frame, idle=idle)
                status = await self._run(offer, link)
                await link.finish(status)
        except asyncio.CancelledError:
            raise
        except (OSError, ConnectionClosed, InvalidStatus, TimeoutError) as exc:
            log.info("node %s: session %s not carried: %s", self.client.node, offer["id"], exc)

    async def _run(self, offer: dict[str, Any], link: Link) -> dict[str, Any]:
        if len(self.active) > self.max_sessions:
            return failure(
                f'node "{self.client.node}" runs {self.max_sessions} sessions, the most it may '
                "(TESSERA_AGENT_SESSION_MAX): try again when one ends",
                "TooManyRequests",
                429,
            )
        handler = getattr(self.runtime, "session", None)
        if handler is None:
            return refusal(str(offer.get("kind")), self.client.node, self.runtime.kind)
        try:
            return dict(await handler(offer, link))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("node %s: session %s failed", self.client.node, offer.get("id"))
            return failure(f"the session failed on the node: {exc}")

    async def close(self) -> None:
        for task in list(self.active.values()):
            task.cancel()
        for task in list(self.active.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
