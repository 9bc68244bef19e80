"""Where a callback may point: the rules for its URL (checked on create and update) and for the
addresses its host resolves to (checked again on every attempt, at connect time, so a name that
later resolves to a private address is refused: no DNS rebinding into the pool's network).

- `https://` to a public host, or `http://` (or https) to loopback: 127.0.0.0/8, ::1, localhost;
- every address the host resolves to must be public (globally routable), or in a destination
  the operator allows (`TESSERA_CALLBACK_ALLOWED_DESTINATIONS`: networks and host names; `tessera
  dev` allows loopback, `tessera serve` nothing: the control plane's own loopback is not a
  tenant's to call);
- an IPv4 address is written as four decimal numbers (`127.1`, `2130706433` and `0x7f000001`
  are refused, not read as 127.0.0.1), and IPv6 forms that carry an IPv4 address inside (NAT64
  `64:ff9b::/96`, 6to4 `2002::/16`, Teredo `2001::/32`, IPv4-mapped, -translated and
  -compatible) are never called: they would reach the IPv4 address the check did not see;
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
# IPv6 ranges whose addresses carry an IPv4 address that a gateway or the host stack reaches
EMBEDDING_IPV4 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "64:ff9b::/96",  # NAT64 (RFC 6052)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
        "2002::/16",  # 6to4
        "2001::/32",  # Teredo
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765)
        "::/96",  # IPv4-compatible (deprecated)
    )
)
LOOPBACK = ("127.0.0.0/8", "::1/128", "localhost")


class Allowed:
    """Destinations the operator allows besides public addresses: networks ("10.0.0.0/8",
    "127.0.0.1/32", "::1/128") and host names ("hooks.internal"), from a comma-separated list."""

    def __init__(self, text: str = "") -> None:
        items = [item.strip() for item in text.split(",") if item.strip()]
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.names: set[str] = set()
        for item in items:
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.names.add(item.lower().rstrip("."))

    def __contains__(self, address: object) -> bool:
        return isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address)) and any(
            address in network for network in self.networks
        )

    def name(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.names

    def __bool__(self) -> bool:
        return bool(self.networks or self.names)


NOTHING = Allowed()


class Refused(ValueError):
    """The destination is not one Tessera calls; the message says why and what to use."""


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _shorthand_ipv4(host: str) -> bool:
    """`127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`: what the C resolver reads as an IPv4
    address though it is not four decimal numbers."""
    if _literal(host) is not None:
        return False
    try:
        socket.inet_aton(host)
    except (OSError, ValueError):
        return False
    return True


def embeds_ipv4(address: Address) -> bool:
    """An IPv6 address carrying an IPv4 one (`::` and `::1` are IPv6's own)."""
    return (
        isinstance(address, ipaddress.IPv6Address)
        and int(address) > 1
        and any(address in network for network in EMBEDDING_IPV4)
    )


def is_loopback_host(host: str) -> bool:
    address = _literal(host)
    return host.lower() in LOOPBACK_NAMES if address is None else address.is_loopback


def allowed_address(address: Address, allowed: Allowed = NOTHING) -> bool:
    """Public (globally routable, not multicast, no IPv4 inside an IPv6 form), or allowed by
    the operator."""
    if embeds_ipv4(address):
        return False
    return address in allowed or (address.is_global and not address.is_multicast)


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
    if _shorthand_ipv4(host):
        raise Refused(f"{host} is an IPv4 address in shorthand: write it as four decimal numbers")
    if parts.scheme == "http" and not is_loopback_host(host):
        raise Refused(f"plain http:// is accepted only to loopback, not to {host!r}: {HOW}")
    literal = _literal(host)
    if literal is not None and embeds_ipv4(literal):
        raise Refused(
            f"{host} is an IPv6 form that carries an IPv4 address (NAT64, 6to4, Teredo, "
            "mapped): write the IPv4 address itself"
        )
    if literal is not None and not literal.is_loopback and not allowed_address(literal):
        raise Refused(
            f"{host} is a private, link-local or reserved address, which Tessera never calls: {HOW}"
        )
    return parts


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def resolve_allowed(
    host: str, port: int, resolve: Resolver = system_resolver, allowed: Allowed = NOTHING
) -> list[str]:
    """The addresses to connect to for `host`; `Refused` when any of them is not public and
    not allowed by the operator (a name that resolves to one private address is refused
    whole). A host name the operator allows is called at whatever it resolves to."""
    if _shorthand_ipv4(host):
        raise Refused(f"{host} is an IPv4 address in shorthand: refused")
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
    if allowed.name(host):
        return candidates
    for text in candidates:
        address = _literal(text.split("%", 1)[0])
        if address is None or not allowed_address(address, allowed):
            kind = (
                "a loopback"
                if address is not None and address.is_loopback
                else "a private, link-local or reserved"
            )
            raise Refused(
                f"{host} resolves to {text}, {kind} address, which this server does not call "
                "(its operator may allow destinations: TESSERA_CALLBACK_ALLOWED_DESTINATIONS)"
            )
    return candidates
