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
            return cls(str(data["ns"]), str(data["n"]), int(data["rv"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(
                "the continue token is not valid: pass the metadata.continue value of the previous "
                "page unchanged, or list again without it"
            ) from exc


def check_limit(limit: int | None) -> int | None:
    if limit is None or limit == 0:
        return None
    if limit < 0:
        raise BadRequest(f"limit must be a positive number, got {limit}")
    return limit
