"""The console's session: the caller's token, sealed in a cookie.

The cookie is a Fernet token (AES-128-CBC with an HMAC-SHA256 over it): the browser holds the
token but cannot read or change it, and the server keeps no session table. The seal's key lives
in the data directory (`ui-session.key`, created at first use, mode 0600), so every API process
on a host opens the same cookies. Logging out clears the cookie; revoking the token ends every
session holding it, because every request the console makes is authenticated again by the API.

The cookie also carries a random CSRF value; the page reads it from `/ui/session` and sends it
back in the `X-Tessera-CSRF` header, which a cross-site page can neither read nor set.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import orjson
from cryptography.fernet import Fernet, InvalidToken

log = logging.getLogger("tessera.api")

COOKIE = "tessera_console"
CSRF_HEADER = "x-tessera-csrf"
MAX_AGE_SECONDS = 12 * 3600
MAX_TOKEN_CHARS = 256  # a Tessera token is ~60 characters; anything longer is not one


@dataclass(frozen=True)
class Session:
    token: str
    csrf: str


class Sealer:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> Sealer:
        """The key in `data_dir/ui-session.key`, made at first use. Where the data directory
        cannot be written, a key of this process alone (its sessions end when it stops, and
        another API process does not open them)."""
        path = data_dir / "ui-session.key"
        try:
            if not path.exists():
                data_dir.mkdir(parents=True, exist_ok=True)
                # Created exclusively: of two processes starting together one writes, both read.
                with contextlib.suppress(FileExistsError):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        out.write(Fernet.generate_key())
            return cls(path.read_bytes().strip())
        except (OSError, ValueError) as error:
            log.warning(
                "console sessions: cannot use %s (%s); sessions are sealed with a key of this "
                "process alone",
                path,
                error,
            )
            return cls(Fernet.generate_key())

    def seal(self, token: str) -> tuple[str, Session]:
        session = Session(token=token, csrf=secrets.token_urlsafe(24))
        body = orjson.dumps({"t": session.token, "c": session.csrf})
        return self._fernet.encrypt(body).decode("ascii"), session

    def open(self, cookie: str | None) -> Session | None:
        """The session in `cookie`, or None if it is absent, forged, altered or too old."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            body = orjson.loads(self._fernet.decrypt(cookie.encode("ascii"), ttl=MAX_AGE_SECONDS))
            return Session(token=str(body["t"]), csrf=str(body["c"]))
        except (InvalidToken, ValueError, KeyError, TypeError, UnicodeEncodeError):
            return None


def csrf_matches(session: Session, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())
