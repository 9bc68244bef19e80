"""Domain errors, and the one place that turns them into Kubernetes `Status` objects.

Services raise these; they never raise HTTP exceptions. `install_handlers()` maps each to the
`Status` a Kubernetes client expects, so kubectl prints e.g.
`Error from server (NotFound): pods "web" not found`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # the web framework is imported where it is used: the CLI needs only the errors
    from fastapi import FastAPI
    from starlette.responses import Response

log = logging.getLogger("tessera.api")


@dataclass(frozen=True)
class Cause:
    """One bad field: `field` is a JSON path such as `spec.containers[0].resources.requests.cpu`."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"


@dataclass(frozen=True)
class ResourceRef:
    """What a Status is about: the resource (plural name), or the Kind for `Invalid`, as
    Kubernetes reports them."""

    kind: str
    name: str = ""
    group: str = ""


class TesseraError(Exception):
    code = 500
    reason = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        ref: ResourceRef | None = None,
        causes: list[Cause] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.ref = ref
        self.causes = causes or []
        self.retry_after = retry_after


class BadRequest(TesseraError):
    code = 400
    reason = "BadRequest"


class Unauthorized(TesseraError):
    code = 401
    reason = "Unauthorized"


class Forbidden(TesseraError):
    code = 403
    reason = "Forbidden"


class NotFound(TesseraError):
    code = 404
    reason = "NotFound"


class MethodNotAllowed(TesseraError):
    code = 405
    reason = "MethodNotAllowed"


class NotAcceptable(TesseraError):
    code = 406
    reason = "NotAcceptable"


class AlreadyExists(TesseraError):
    code = 409
    reason = "AlreadyExists"


class Conflict(TesseraError):
    code = 409
    reason = "Conflict"


class Gone(TesseraError):
    code = 410
    reason = "Expired"


class TooLarge(TesseraError):
    code = 413
    reason = "RequestEntityTooLarge"


class UnsupportedMediaType(TesseraError):
    code = 415
    reason = "UnsupportedMediaType"


class Invalid(TesseraError):
    code = 422
    reason = "Invalid"


class TooManyRequests(TesseraError):
    code = 429
    reason = "TooManyRequests"


class Unavailable(TesseraError):
    code = 503
    reason = "ServiceUnavailable"


@dataclass
class Status:
    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    def response(self) -> Response:
        from starlette.responses import Response

        return Response(
            orjson.dumps(self.to_dict()),
            status_code=self.code,
            media_type="application/json",
            headers=self.extra_headers,
        )


def status_for(error: TesseraError) -> Status:
    details: dict[str, Any] = {}
    if error.ref is not None:
        if error.ref.name:
            details["name"] = error.ref.name
        if error.ref.group:
            details["group"] = error.ref.group
        details["kind"] = error.ref.kind
    if error.causes:
        details["causes"] = [
            {"reason": c.reason, "message": c.message, "field": c.field} for c in error.causes
        ]
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        details["retryAfterSeconds"] = error.retry_after
        headers["Retry-After"] = str(error.retry_after)
    return Status(error.code, error.reason, error.message, details or None, headers)


def not_found(kind: str, name: str, group: str = "") -> NotFound:
    resource = f"{kind}.{group}" if group else kind
    return NotFound(f'{resource} "{name}" not found', ref=ResourceRef(kind, name, group))


def already_exists(kind: str, name: str, group: str = "") -> AlreadyExists:
    resource = f"{kind}.{group}" if group else kind
    return AlreadyExists(f'{resource} "{name}" already exists', ref=ResourceRef(kind, name, group))


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> Invalid:
    """A 422 in Kubernetes' words: `Pod "web" is invalid: spec.x: Invalid value: ...`.

    Its details name the Kind (not the resource), so kubectl prints `The Pod "web" is invalid`.
    """
    summary = ", ".join(f"{c.field}: {c.message}" for c in causes)
    return Invalid(
        f'{kind} "{name}" is invalid: {summary}',
        ref=ResourceRef(kind, name, group),
        causes=causes,
    )


def install_handlers(app: FastAPI) -> None:
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    @app.exception_handler(TesseraError)
    async def _tessera_error(_request: Request, error: TesseraError) -> Response:
        return status_for(error).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, error: RequestValidationError) -> Response:
        causes = []
        for item in error.errors():
            loc = [str(p) for p in item.get("loc", ()) if p not in ("query", "path", "body")]
            causes.append(Cause(".".join(loc), str(item.get("msg", "invalid"))))
        message = "; ".join(f"{c.field}: {c.message}" for c in causes) or "invalid request"
        return status_for(BadRequest(message, causes=causes)).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> Response:
        if error.status_code == 404:
            message = f"the server could not find the requested resource ({request.url.path})"
            return Status(
                404,
                "NotFound",
                message,
                {
                    "causes": [
                        {"reason": "UnexpectedServerResponse", "message": "404 page not found"}
                    ]
                },
            ).response()
        if error.status_code == 405:
            message = f"the server does not allow this method on the requested resource ({request.method} {request.url.path})"
            return Status(405, "MethodNotAllowed", message).response()
        return Status(
            error.status_code,
            "InternalError" if error.status_code >= 500 else "BadRequest",
            str(error.detail),
        ).response()

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_request: Request, _error: ClientDisconnect) -> Response:
        # The client went while sending its body (a client that stops, a server that stops):
        # not an error of the server's. The answer reaches nobody; it is counted as a 400.
        return Status(
            400, "BadRequest", "the client closed the connection before sending the whole body"
        ).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        from app.db.engine import is_lock_timeout

        if is_lock_timeout(error):  # a bounded wait ran out (app/db/engine.py)
            log.warning("a lock wait timed out serving %s %s", request.method, request.url.path)
            unavailable = Unavailable(
                "the store is busy: this request waited too long for a lock another writer "
                "holds, and was undone; retry",
                retry_after=1,
            )
            return status_for(unavailable).response()
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return Status(
            500, "InternalError", f"an internal error occurred: {type(error).__name__}"
        ).response()


class StatusCause(BaseModel):
    reason: str | None = None
    message: str | None = None
    field: str | None = None


class StatusDetails(BaseModel):
    name: str | None = None
    group: str | None = None
    kind: str | None = None
    causes: list[StatusCause] | None = None
    retryAfterSeconds: int | None = None


class StatusModel(BaseModel):
    """The Kubernetes `Status` every error is answered with."""

    model_config = ConfigDict(title="Status")

    kind: Literal["Status"]
    apiVersion: Literal["v1"]
    metadata: dict[str, Any]
    status: Literal["Failure", "Success"]
    message: str
    reason: str
    code: int
    details: StatusDetails | None = None


STATUS_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": StatusModel, "description": description}
    for code, description in (
        (400, "BadRequest: the body or a parameter is malformed"),
        (401, "Unauthorized: missing, invalid or revoked token"),
        (403, "Forbidden: not the caller's namespace or not allowed for its role"),
        (404, "NotFound"),
        (409, "AlreadyExists or Conflict (stale resourceVersion, capacity taken)"),
        (413, "RequestEntityTooLarge: objects are limited to 3 MiB"),
        (415, "UnsupportedMediaType"),
        (422, "Invalid: the object breaks a rule; details.causes names each field"),
        (429, "TooManyRequests: the tenant's rate limit; see Retry-After"),
    )
}
