"""WebSocket upgrades, answered as plain HTTP.

Kubernetes clients open WebSockets for `exec`, `attach` and `port-forward` (served: app/sessions)
and some for watches. Tessera serves no other WebSocket streams, so every other upgrade is
answered with what a plain `GET` of the same URL answers (authentication, tenancy, `404` for a missing pod, and the words of the
`exec` route), as a `Status` in the HTTP response that refuses the upgrade (the ASGI WebSocket
denial-response extension). A client reports that message instead of a bare `403` with an empty
body; kubectl then retries over its older protocol and gets the same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Status

MAX_ANSWER_BYTES = 64 * 1024


# The WebSockets Tessera serves (app/sessions): exec, attach, port-forward, and the node
# agents' side of them.
SERVED = re.compile(
    r"^/api/v1/(namespaces/[^/]+/pods/[^/]+/(exec|attach|portforward)|nodes/[^/]+/sessions(/[^/]+)?)$"
)


class WebSocketAsHttp:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or SERVED.match(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        status, headers, body = await self._answer_as_http(scope)
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})

    async def _answer_as_http(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        http_scope = {
            **scope,
            "type": "http",
            "method": "GET",
            "scheme": {"ws": "http", "wss": "https"}.get(scope.get("scheme", "ws"), "http"),
        }
        http_scope.pop("subprotocols", None)
        started: dict[str, Any] = {}
        chunks: list[bytes] = []
        done = asyncio.Event()
        requested = False

        async def http_receive() -> Message:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()  # the request has no more body; wait to be cancelled
            return {"type": "http.disconnect"}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
                if message["status"] < 400:  # a stream or an object: not over a WebSocket
                    done.set()
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body") or sum(map(len, chunks)) > MAX_ANSWER_BYTES:
                    done.set()

        async def serve() -> None:
            await self.app(http_scope, http_receive, capture)

        task = asyncio.create_task(serve())
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, waiter):
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
        status = int(started.get("status", 500))
        if status < 400:
            return _status(
                400,
                "BadRequest",
                f"{scope.get('path', '')} is served over plain HTTP only: Tessera offers no "
                "WebSocket streams",
            )
        headers = [
            (k, v)
            for k, v in started.get("headers", [])
            if k.lower() in (b"content-type", b"retry-after", b"warning")
        ]
        return status, headers, b"".join(chunks)[:MAX_ANSWER_BYTES]


def _status(code: int, reason: str, message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = orjson.dumps(Status(code, reason, message).to_dict())
    return code, [(b"content-type", b"application/json")], body
