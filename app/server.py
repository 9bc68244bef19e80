"""The HTTP server's own limits: what a client may send, and how slowly.

Tessera serves with uvicorn's httptools protocol, bounded here before anything reaches the
application (so no route can forget a limit, and nothing is buffered first):

- the request head (request line and headers) may take at most `max_header_bytes`: beyond it the
  answer is `431 Request Header Fields Too Large` and the connection closes;
- a body announced by `Content-Length` larger than an object may be is refused with `413` before
  a byte of it is read, and a body without one (chunked) is counted while it streams: `413` as
  soon as it passes the limit;
- a client has `header_timeout_seconds` from connecting (or from the first byte of its next
  request) to send the head, and `body_timeout_seconds` more to send the body: `408` after that.

Every refusal is a Kubernetes `Status`, as the API's other errors.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from app.kube.bodies import MAX_BODY_BYTES
from app.settings import Settings

_REASONS = {
    408: ("Timeout", "Request Timeout"),
    413: ("RequestEntityTooLarge", "Request Entity Too Large"),
    431: ("RequestHeaderFieldsTooLarge", "Request Header Fields Too Large"),
}


IDLE_CLOSE_SECONDS = 0.5  # at shutdown, how long an idle TLS client has to answer close_notify

# The lifespan state's key of what the application does once the server stops accepting
# connections (`create_app`'s lifespan: end the open watches). uvicorn closes its listening
# sockets, then calls every connection's `shutdown` in one pass (an idle one closes, one in a
# request will close after its response); the hook runs right after that pass. So a stream
# that ends closes its connection too: a client that watches again finds the server gone,
# rather than being served again on the same connection while the server stops.
SERVER_STOPPING = "tessera.server_stopping"
_STOPPED = "tessera.server_stopped"  # the lifespan state's mark that the stop has begun


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 1024 * 1024  # as the Kubernetes API server (Go's default)
    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout_seconds: float = 30.0
    body_timeout_seconds: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            header_timeout_seconds=settings.header_timeout_seconds,
            body_timeout_seconds=settings.body_timeout_seconds,
        )


def status_bytes(code: int, message: str) -> bytes:
    """A complete HTTP/1.1 response carrying a Kubernetes Status; the connection closes."""
    reason, phrase = _REASONS[code]
    body = orjson.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )
    head = (
        f"HTTP/1.1 {code} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `HttpLimits` enforced. `limits` None: from the
    TESSERA_* settings (worker processes, which uvicorn starts afresh)."""

    limits: ClassVar[HttpLimits | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = type(self).limits or HttpLimits.from_settings(Settings())
        self._head_bytes = 0
        self._head_done = False
        self._body_bytes = 0
        self._refused = False
        self._stopping = False
        self._timer: asyncio.TimerHandle | None = None

    # -- timers ------------------------------------------------------------------------
    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, what: str) -> None:
        self._timer = None
        seconds = (
            self._limits.header_timeout_seconds
            if what == "headers"
            else self._limits.body_timeout_seconds
        )
        self._refuse(
            408,
            f"the client took longer than {seconds:g}s to send the request {what}: send the "
            "whole request promptly",
        )

    def _refuse(self, code: int, message: str) -> None:
        """Answer `code` (unless a response has begun) and close the connection."""
        if self._refused:
            return
        self._refused = True
        self._disarm()
        cycle = self.cycle
        started = cycle is not None and not cycle.response_complete and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the application's receive() sees a disconnect
            cycle.message_event.set()
        if not started and not self.transport.is_closing():
            self.transport.write(status_bytes(code, message))
        self.transport.close()

    # -- connection and parser callbacks ----------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._limits.header_timeout_seconds, "headers")
        if self.app_state.get(_STOPPED):
            # Accepted before the stop, its TLS handshake done after uvicorn's pass over the
            # connections: shut down like the others (uvicorn would wait for it to the end).
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._head_done:
            self._head_bytes += len(data)
            if self._head_bytes > self._limits.max_header_bytes + self._limits.max_body_bytes or (
                self._head_bytes > self._limits.max_header_bytes and b"\r\n\r\n" not in data
            ):
                self._refuse(
                    431,
                    f"the request's headers are larger than {self._limits.max_header_bytes} bytes",
                )
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_bytes = 0
        if not self._head_done:
            self._arm(self._limits.header_timeout_seconds, "headers")

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_total = getattr(self, "_header_total", 0) + len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        head = len(self.url) + getattr(self, "_header_total", 0)
        self._header_total = 0
        self._head_done = True
        if head > self._limits.max_header_bytes:
            self._refuse(
                431, f"the request's headers are larger than {self._limits.max_header_bytes} bytes"
            )
            return
        for name, value in self.headers:
            if name == b"content-length":
                length = value.strip()
                if length.isdigit() and (
                    len(length) > 18 or int(length) > self._limits.max_body_bytes
                ):
                    self._refuse(413, _too_large(int(length[:19]), self._limits))
                    return
        super().on_headers_complete()
        self._arm(self._limits.body_timeout_seconds, "body")

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            self._refuse(413, _too_large(self._body_bytes, self._limits, streamed=True))
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._head_done = False
        self._head_bytes = 0
        super().on_response_complete()
        if self._stopping:  # the request the stop let finish: its connection goes idle now
            self.loop.call_later(IDLE_CLOSE_SECONDS, self.transport.abort)

    def shutdown(self) -> None:
        """The server stops: an idle connection is closed now (one in a request finishes it,
        and closes once its response is complete).

        Over TLS, closing sends close_notify and waits for the client's; most HTTP clients do
        not read a pooled idle connection, so the stop would wait the whole graceful timeout
        for them. Such a connection is dropped shortly after instead: it carries nothing. So
        is one whose request completes during the stop (a watch the stop ended, say)."""
        stopping = self.app_state.pop(SERVER_STOPPING, None)  # once per process
        self.app_state[_STOPPED] = True
        idle = self.cycle is None or self.cycle.response_complete
        self._stopping = True
        super().shutdown()
        if stopping is not None:
            # uvicorn calls every connection's shutdown in one pass; run the application's
            # hook after that pass (it ends streams, which then find keep-alive off).
            self.loop.call_soon(stopping)
        if idle:
            self.loop.call_later(IDLE_CLOSE_SECONDS, self.transport.abort)


def bounded_protocol(limits: HttpLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class to pass to uvicorn as `http=`, with these limits."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


def _too_large(size: int, limits: HttpLimits, *, streamed: bool = False) -> str:
    what = f"more than {limits.max_body_bytes}" if streamed else str(size)
    return (
        f"the request body is {what} bytes; an object may be at most {limits.max_body_bytes} bytes"
    )


class _AnySubprotocol(ServerProtocol):
    """The handshake without judging `Sec-WebSocket-Protocol`: the app picks one of what the
    client offers (uvicorn splits the header on commas for it) and uvicorn answers with it."""

    def process_subprotocol(self, headers: Headers) -> Subprotocol | None:
        return None


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that a subprotocol need not be an RFC 6455 token:
    kubectl's port-forward offers `SPDY/3.1+portforward.k8s.io`, whose "/" the strict parser
    refuses with a 400 before the app sees the request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _AnySubprotocol(
            extensions=self.conn.available_extensions,
            max_size=self.config.ws_max_size,
            logger=self.conn.logger,
        )


def uvicorn_options(settings: Settings, *, workers: int = 1) -> dict[str, Any]:
    """What every Tessera server passes to uvicorn (`tessera serve`, `tessera dev`, tests).

    Worker processes are started afresh by uvicorn and read their limits from the settings."""
    protocol = (
        BoundedHttpToolsProtocol
        if workers > 1
        else bounded_protocol(HttpLimits.from_settings(settings))
    )
    # X-Forwarded-For only from the proxies the operator lists (uvicorn would believe any
    # client on 127.0.0.1, and the failed-login limit keys on the client's address)
    proxies = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
    return {
        "http": protocol,
        "ws": WebSocketProtocol,
        "timeout_keep_alive": 5,
        # a session's frame (app/sessions) and a little room for the framing
        "ws_max_size": settings.session_max_frame_bytes + 1024,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
    }
