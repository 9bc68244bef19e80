"""List paging: `limit` and opaque `continue` tokens."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import orjson

from app.errors import BadRequest


@dataclass(frozen=True)
class ContinueToken:
    """Where the previous page stopped: the last (namespace, name) returned."""

    namespace: str
    name: str
    resource_version: int

    def encode(self) -> str:
        raw = orjson.dumps(
            {"v": 1, "ns": self.namespace, "n": self.name, "rv": self.resource_version}
        )
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> ContinueToken:
        try:
            padded = token + "=" * (-len(token) % 4)
            data = orjson.loads(base64.urlsafe_b64decode(padded))
            rv = data["rv"]
            if not isinstance(rv, int) or not 0 <= rv <= MAX_RESOURCE_VERSION:
                raise ValueError(rv)
            return cls(str(data["ns"]), str(data["n"]), rv)
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(
                "the continue token is not valid: pass the metadata.continue value of the previous "
                "page unchanged, or list again without it"
            ) from exc


MAX_RESOURCE_VERSION = 2**63 - 1
# A page is at most this long whatever `limit` asks (a server may return fewer items than the
# limit, with a continue token, as Kubernetes allows).
MAX_PAGE = 2**31 - 1
RESOURCE_VERSION_MATCHES = ("NotOlderThan", "Exact")


def check_limit(limit: int | None) -> int | None:
    if limit is None or limit == 0:
        return None
    if limit < 0:
        raise BadRequest(f"limit must be a positive number, got {limit}")
    return min(limit, MAX_PAGE)


def parse_resource_version(text: str | None, *, parameter: str = "resourceVersion") -> int | None:
    """A resourceVersion from a query: None when absent; 400 unless this server could have
    issued it (decimal digits, 0 to 2^63-1)."""
    if text is None or text == "":
        return None
    if (
        not (text.isascii() and text.isdigit())
        or len(text) > 19
        or int(text) > MAX_RESOURCE_VERSION
    ):
        raise BadRequest(
            f'{parameter} "{text[:40]}" is invalid: a resourceVersion is a non-negative integer '
            "this server issued (copy metadata.resourceVersion of an object or list), or omit it"
        )
    return int(text)


def check_resource_version_match(
    match: str | None, resource_version: str | None, *, watch: bool
) -> None:
    if match is None or match == "":
        return
    if watch:
        raise BadRequest("resourceVersionMatch is forbidden for watch: omit it")
    if match not in RESOURCE_VERSION_MATCHES:
        raise BadRequest(
            f'resourceVersionMatch "{match[:40]}" is not supported: use '
            f"{' or '.join(RESOURCE_VERSION_MATCHES)}"
        )
    if not resource_version:
        raise BadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided")
