"""A real HTTP receiver for callback deliveries: a threaded http.server on 127.0.0.1 that
answers each request with the next planned behaviour and records every request it got."""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from app.tls import TLSFiles


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def event(self) -> dict[str, Any]:
        return orjson.loads(self.body)


class Receiver:
    """`plan(...)` queues answers: an int status, ("redirect", location), ("answer", status,
    reason text) or "stall" (no answer until `release` is set, longer than any delivery
    timeout); then 200 for everything."""

    def __init__(self, tls: TLSFiles | None = None) -> None:
        self.scheme = "https" if tls else "http"
        self.requests: list[Received] = []
        self._plan: deque[Any] = deque()
        self._cond = threading.Condition()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._cond:
                    receiver.requests.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                    behaviour = receiver._plan.popleft() if receiver._plan else 200
                    receiver._cond.notify_all()
                if behaviour == "stall":
                    receiver.release.wait(10)
                    behaviour = 200
                if isinstance(behaviour, tuple) and behaviour[0] == "answer":
                    self.send_response(behaviour[1], behaviour[2])
                elif isinstance(behaviour, tuple):
                    self.send_response(302)
                    self.send_header("Location", behaviour[1])
                else:
                    self.send_response(behaviour)
                self.send_header("Content-Length", "2")
                self.end_headers()
                with contextlib.suppress(OSError):  # the sender gave up (a stall)
                    self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls.cert), str(tls.key))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def plan(self, *behaviours: Any) -> None:
        with self._cond:
            self._plan.extend(behaviours)

    def wait_for(
        self, count: int, *, path: str | None = None, timeout: float = 15
    ) -> list[Received]:
        """The first `count` requests (to `path`), once they have arrived."""

        def matching() -> list[Received]:
            return [r for r in self.requests if path is None or r.path == path]

        with self._cond:
            self._cond.wait_for(lambda: len(matching()) >= count, timeout)
            got = matching()
        assert len(got) >= count, f"{len(got)} of {count} requests arrived: {got}"
        return got[:count]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
