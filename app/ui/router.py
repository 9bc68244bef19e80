"""The console's pages, its login and logout, and the self-hosted `/docs`.

Every page is the same small HTML shell naming the page (one of `PAGES`, never anything the
caller sent); the page's script fills it with what it reads through the gateway
(app/ui/gateway.py), writing tenant strings as text only. The HTML itself holds no tenant data.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from app.auth.service import Principal
from app.deps import Services, authenticate
from app.errors import Unauthorized
from app.ui.session import COOKIE, CSRF_HEADER, MAX_AGE_SECONDS, MAX_TOKEN_CHARS, Sealer, Session

HERE = Path(__file__).parent
STATIC = HERE / "static"

TENANT_PAGES = ("pods", "create", "usage", "callbacks")
OPERATOR_PAGES = ("pool", "nodes", "tenants", "scheduler")
PAGES = frozenset({*TENANT_PAGES, *OPERATOR_PAGES, "pod", "callback", "login"})

router = APIRouter(include_in_schema=False)


@cache
def _shell() -> str:
    return (HERE / "templates" / "shell.html").read_text()


def _page(name: str) -> Response:
    assert name in PAGES  # the shell names a page of this list, never a caller's string
    return Response(_shell().replace("{{page}}", name), media_type="text/html; charset=utf-8")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _sealer(request: Request) -> Sealer:
    sealer: Sealer = request.app.state.console_sealer
    return sealer


async def _authenticate(request: Request, token: str) -> Principal:
    """The API's own authentication of `token` (cache, then the database), with its limit on
    failed attempts per client address."""
    return await authenticate(request, _services(request), token)


async def _session(request: Request) -> tuple[Session, Principal] | None:
    """The caller's session if its cookie is sound and its token still authenticates."""
    session = _sealer(request).open(request.cookies.get(COOKIE))
    if session is None:
        return None
    try:
        return session, await _authenticate(request, session.token)
    except Unauthorized:
        return None


def _same_origin(request: Request) -> bool:
    """A POST from the console's own page: a browser sends Origin (and Sec-Fetch-Site) with
    every fetch POST; both must name this origin."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    return origin is not None and origin.partition("://")[2] == host


def _status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code},
        status_code=code,
    )


def _clear(response: Response) -> Response:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


def _describe(principal: Principal) -> dict[str, Any]:
    return {"user": principal.username, "role": principal.role, "tenant": principal.tenant_name}


@router.get("/ui")
async def home(request: Request) -> Response:
    found = await _session(request)
    if found is None:
        return RedirectResponse("/ui/login", status_code=303)
    return RedirectResponse("/ui/pool" if found[1].is_admin else "/ui/pods", status_code=303)


@router.get("/ui/login")
async def login_page() -> Response:
    return _page("login")


@router.post("/ui/login")
async def login(request: Request) -> Response:
    """Body: {"token": "tsr_..."} as JSON. The token travels only in this body and in the
    sealed cookie, never in a URL."""
    if not _same_origin(request):
        return _status(403, "Forbidden", "forbidden: log in from the console's own login page")
    try:
        body = await request.json()
        token = body["token"]
    except Exception:
        return _status(400, "BadRequest", 'send {"token": "tsr_..."} as JSON')
    if not isinstance(token, str) or not 0 < len(token.strip()) <= MAX_TOKEN_CHARS:
        return _status(400, "BadRequest", "the token is missing or too long")
    token = token.strip()
    try:
        principal = await _authenticate(request, token)
    except Unauthorized as error:
        return _status(401, "Unauthorized", error.message)
    if principal.is_node:
        return _status(403, "Forbidden", "forbidden: a node's token cannot open the console")
    cookie, session = _sealer(request).seal(token)
    response = JSONResponse({**_describe(principal), "csrf": session.csrf})
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=MAX_AGE_SECONDS,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    session = _sealer(request).open(request.cookies.get(COOKIE))
    if session is not None and (
        not _same_origin(request) or request.headers.get(CSRF_HEADER) != session.csrf
    ):
        return _status(403, "Forbidden", "forbidden: log out from the console's own pages")
    return _clear(Response(status_code=204))


@router.get("/ui/session")
async def whoami(request: Request) -> Response:
    """Who the session is and its CSRF value, for the page's script (a cross-site page gets no
    cookie here: SameSite=Strict)."""
    found = await _session(request)
    if found is None:
        return _clear(_status(401, "Unauthorized", "Unauthorized: log in to the console"))
    session, principal = found
    return JSONResponse({**_describe(principal), "csrf": session.csrf})


async def _guarded(request: Request, page: str) -> Response:
    if await _session(request) is None:
        return _clear(RedirectResponse("/ui/login", status_code=303))
    return _page(page)


def _add_pages() -> None:
    for page in (*TENANT_PAGES, *OPERATOR_PAGES):

        async def show(request: Request, page: str = page) -> Response:
            return await _guarded(request, page)

        router.add_api_route(f"/ui/{page}", show, methods=["GET"], name=f"console_{page}")


_add_pages()


@router.get("/ui/pods/{namespace}/{name}")
async def pod_page(request: Request, namespace: str, name: str) -> Response:
    return await _guarded(request, "pod")


@router.get("/ui/callbacks/{namespace}/{name}")
async def callback_page(request: Request, namespace: str, name: str) -> Response:
    return await _guarded(request, "callback")


DOCS = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera API</title>
<link rel="stylesheet" href="/ui/static/vendor/swagger-ui-dist-5.31.0/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="/ui/static/vendor/swagger-ui-dist-5.31.0/swagger-ui-bundle.js"></script>
<script src="/ui/static/docs.js"></script>
</body></html>
"""


@router.get("/docs")
async def docs() -> Response:
    """The API's reference, served entirely by Tessera (no CDN)."""
    return Response(DOCS, media_type="text/html; charset=utf-8")
