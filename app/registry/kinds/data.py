"""What ConfigMaps and Secrets share: keys of a data map, and the 1 MiB bound on their data."""

from __future__ import annotations

import base64
import binascii
import re

from app.errors import Cause

MAX_DATA_BYTES = 1024 * 1024  # as Kubernetes bounds a ConfigMap's or a Secret's data
MAX_KEY_CHARS = 253
KEY = re.compile(r"[-._a-zA-Z0-9]+")


def key_causes(keys: list[str], field: str) -> list[Cause]:
    causes = []
    for key in keys:
        if not key or len(key) > MAX_KEY_CHARS or not KEY.fullmatch(key) or key in (".", ".."):
            causes.append(
                Cause(
                    f"{field}[{key[:64]}]",
                    f'Invalid value: "{key[:64]}": a valid config key must consist of '
                    "alphanumeric characters, '-', '_' or '.' (at most 253; not '.' or '..')",
                )
            )
    return causes


def decoded(value: str, field: str, causes: list[Cause]) -> bytes:
    """A base64 value as bytes (a cause when it is not base64)."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        causes.append(
            Cause(field, "Invalid value: <value omitted>: not base64: encode the value in base64")
        )
        return b""


def size_cause(total: int, kind: str) -> list[Cause]:
    if total <= MAX_DATA_BYTES:
        return []
    return [
        Cause(
            "data",
            f"Too long: must have at most {MAX_DATA_BYTES} bytes (the {kind}'s data is {total} "
            "bytes): split it into several objects, or mount a volume instead",
        )
    ]


def immutable_causes(
    new: dict[str, object], old: dict[str, object], fields: tuple[str, ...]
) -> list[Cause]:
    """An object marked `immutable: true` keeps its data, and stays immutable."""
    if not old.get("immutable"):
        return []
    causes = []
    if not new.get("immutable"):
        causes.append(Cause("immutable", "Forbidden: field is immutable when `immutable` is set"))
    for field in fields:
        if new.get(field) != old.get(field):
            causes.append(Cause(field, "Forbidden: field is immutable when `immutable` is set"))
    return causes
