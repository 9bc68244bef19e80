"""Signing and verifying callback deliveries. Pure: no I/O, no Tessera imports, so a receiver
may copy this file as it is.

Every delivery carries `Tessera-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`, the HMAC
taken with the callback's signing secret over `"<t>.<body>"` (the exact bytes received). A
receiver recomputes it, compares in constant time, and rejects a timestamp older (or newer)
than its tolerance: a delivery captured on the way cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Tessera-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300
MAX_HEADER_CHARS = 4096


class SignatureError(ValueError):
    """The delivery is not authentic, or is too old: reject it (answer 400)."""


def compute(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The header value for `body` signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},{SCHEME}={compute(secret, t, body)}"


def verify(
    secret: str,
    body: bytes,
    header: str | None,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    *,
    now: float | None = None,
) -> int:
    """Check a delivery; returns its timestamp, raises `SignatureError` saying why not.

    Several `v1=` values are accepted (any one matching suffices), so a sender may sign with
    two secrets while one replaces the other."""
    if not header or len(header) > MAX_HEADER_CHARS:
        raise SignatureError(f"missing or oversized {HEADER} header")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == SCHEME:
            signatures.append(value)
    if timestamp is None or not signatures:
        raise SignatureError(f"{HEADER} must hold t=<unix seconds> and {SCHEME}=<hex HMAC>")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureError(
            f"the signature's timestamp is {int(current - timestamp)}s from now, beyond the "
            f"tolerance of {tolerance:g}s: a replay or a badly set clock"
        )
    expected = compute(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise SignatureError("the signature does not match the body and secret")
    return timestamp
