"""The console's gateway, and the security headers of every console page.

The console's script never talks to anything but the API: `/ui/api/<path>` is `/<path>` of this
very application, called with the session's token as `Authorization: Bearer`. The request then
meets exactly what a `kubectl` request meets (authentication, tenancy, validation, rate limits,
watches), so the console holds no permission logic of its own and can do nothing its token
cannot. A gateway request must carry the session's CSRF value in `X-Tessera-CSRF`, and a
browser's `Sec-Fetch-Site`, when sent, must say same-origin.
"""

from __future__ import annotations

from http.cookies import SimpleCookie

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.ui.session import COOKIE, CSRF_HEADER, Sealer, csrf_matches

GATEWAY = "/ui/api"
# What the gateway forwards to: the API's own paths, never the console's.
FORWARDED_PREFIXES = ("/api/", "/apis/")
FORWARDED_PATHS = frozenset({"/api", "/apis", "/metrics", "/version"})

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def session_cookie(scope: Scope) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def _is_console(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/") or path == "/docs"


async def _refuse(send: Send, code: int, reason: str, message: str) -> None:
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
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Console:
    """ASGI middleware: forwards `/ui/api/*` to the API with the session's token, and adds the
    security headers to every `/ui` and `/docs` response."""

    def __init__(self, app: ASGIApp, sealer: Sealer) -> None:
        self.app = app
        self.sealer = sealer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not _is_console(path):
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", ())}
                extra = [h for h in SECURITY_HEADERS if h[0] not in names]
                if b"cache-control" not in names and not path.startswith("/ui/static/"):
                    extra.append((b"cache-control", b"no-store"))
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        if path == GATEWAY or path.startswith(GATEWAY + "/"):
            await self._forward(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = scope["path"][len(GATEWAY) :]
        if not (target.startswith(FORWARDED_PREFIXES) or target in FORWARDED_PATHS):
            await _refuse(send, 404, "NotFound", f"the console forwards no request to {target!r}")
            return
        session = self.sealer.open(session_cookie(scope))
        if session is None:
            await _refuse(send, 401, "Unauthorized", "Unauthorized: log in to the console again")
            return
        site = _header(scope, b"sec-fetch-site")
        if site not in (None, "same-origin") or not csrf_matches(
            session, _header(scope, CSRF_HEADER.encode())
        ):
            await _refuse(
                send,
                403,
                "Forbidden",
                "forbidden: a console request needs the session's X-Tessera-CSRF header and "
                "must come from the console's own pages",
            )
            return
        headers = [
            (k, v)
            for k, v in scope.get("headers", ())
            if k not in (b"cookie", b"authorization", CSRF_HEADER.encode())
        ]
        headers.append((b"authorization", f"Bearer {session.token}".encode("latin-1")))
        raw = scope.get("raw_path") or scope["path"].encode("utf-8")
        forwarded = {
            **scope,
            "path": target,
            "raw_path": raw[len(GATEWAY) :] if raw.startswith(GATEWAY.encode()) else raw,
            "headers": headers,
        }
        await self.app(forwarded, receive, send)
