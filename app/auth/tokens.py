"""API tokens: `tsr_<key id>_<secret>`.

The key id (public) finds the row; only SHA-256(secret) is stored, and it is compared in constant
time. Secrets carry 256 bits of randomness, so a fast hash is the right tool (a slow password
hash protects low-entropy secrets, which these are not).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX = "tsr_"


@dataclass(frozen=True)
class NewToken:
    key_id: str
    secret: str

    @property
    def value(self) -> str:
        return f"{PREFIX}{self.key_id}_{self.secret}"


def generate() -> NewToken:
    return NewToken(key_id=secrets.token_hex(8), secret=secrets.token_urlsafe(32))


def split(token: str) -> tuple[str, str] | None:
    """`tsr_<key>_<secret>` -> (key, secret); None when it is not shaped like a Tessera token."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX) :].partition("_")
    if not sep or len(key_id) != 16 or not secret:
        return None
    return key_id, secret


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
