"""Where a callback may point: the rules for its URL (checked on create and update) and for the
addresses its host resolves to (checked again on every attempt, at connect time, so a name that
later resolves to a private address is refused: no DNS rebinding into the pool's network).

- `https://` to a public host, or `http://` (or https) to loopback: 127.0.0.0/8, ::1, localhost;
- every address the host resolves to must be public (globally routable) or loopback;
- no credentials in the URL, no fragment, at most 2048 characters.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import SplitResult, urlsplit

MAX_URL_CHARS = 2048
LOOPBACK_NAMES = ("localhost", "localhost.")
HOW = (
    "use https://<public host>/<path>, or http:// only to a loopback address "
    "(127.0.0.1, [::1] or localhost)"
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]


class Refused(ValueError):
    """The destination is not one Tessera calls; the message says why and what to use."""


def _literal(host: str) -> Address | None:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_loopback_host(host: str) -> bool:
    address = _literal(host)
    return host.lower() in LOOPBACK_NAMES if address is None else address.is_loopback


def allowed_address(address: Address) -> bool:
    """Public (globally routable, not multicast) or loopback."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or (address.is_global and not address.is_multicast)


def check_url(url: str) -> SplitResult:
    """The URL parsed, or `Refused` saying what is wrong with it and how to fix it."""
    if len(url) > MAX_URL_CHARS:
        raise Refused(f"the URL has {len(url)} characters; it may have at most {MAX_URL_CHARS}")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise Refused("the URL holds spaces or control characters: percent-encode them")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"the URL cannot be parsed ({exc}): {HOW}") from exc
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        raise Refused(f"the URL must be absolute with a host: {HOW}")
    if parts.username is not None or parts.password is not None:
        raise Refused(
            "the URL may not hold credentials (user:password@): authenticate deliveries by "
            "their Tessera-Signature header instead"
        )
    if parts.fragment:
        raise Refused("the URL may not have a #fragment: remove it")
    if port == 0:
        raise Refused("the URL's port must be 1-65535")
    if parts.scheme == "http" and not is_loopback_host(host):
        raise Refused(f"plain http:// is accepted only to loopback, not to {host!r}: {HOW}")
    literal = _literal(host)
    if literal is not None and not allowed_address(literal):
        raise Refused(
            f"{host} is a private, link-local or reserved address, which Tessera never calls: {HOW}"
        )
    return parts


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def resolve_allowed(host: str, port: int, resolve: Resolver = system_resolver) -> list[str]:
    """The addresses to connect to for `host`; `Refused` when any of them is not public or
    loopback (a name that resolves to one private address is refused whole)."""
    literal = _literal(host)
    if literal is not None:
        candidates = [str(literal)]
    else:
        try:
            candidates = list(dict.fromkeys(resolve(host, port)))
        except OSError as exc:
            raise Refused(f"{host} does not resolve: {exc}") from exc
    if not candidates:
        raise Refused(f"{host} resolves to no address")
    for text in candidates:
        address = _literal(text.split("%", 1)[0])
        if address is None or not allowed_address(address):
            raise Refused(
                f"{host} resolves to {text}, a private, link-local or reserved address: refused"
            )
    return candidates
