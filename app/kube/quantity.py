"""Kubernetes resource quantities (`500m`, `2`, `1.5`, `20Gi`, `512Mi`, `1e3`).

Parsed exactly with Decimal; callers convert to the integer unit they need, rounding UP so that a
pod never gets less than it asked for.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_PATTERN = re.compile(
    r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
)

MIB = 2**20
GIB = 2**30


# As in Kubernetes, no quantity may be larger than 2^63-1 in magnitude; its text is short.
MAX_QUANTITY = Decimal(2**63 - 1)
MAX_QUANTITY_TEXT = 64


class QuantityError(ValueError):
    pass


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity into its plain value (cores, bytes, a count), at most 2^63-1."""
    if type(value) is str:
        return _parse_text(value)
    return _bounded(value, _parse(value))


@lru_cache(maxsize=1024)
def _parse_text(text: str) -> Decimal:
    """`parse_quantity` of a string, remembered: pods ask again and again for the same few
    quantities ("2", "4Gi"). A Decimal is immutable; an error is raised again each time."""
    return _bounded(text, _parse(text))


def _bounded(value: object, number: Decimal) -> Decimal:
    if abs(number) > MAX_QUANTITY:
        raise QuantityError(
            f"{_shown(value)} is too large: a quantity may be at most 2^63-1 ({MAX_QUANTITY})"
        )
    return number


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse(value: str | int | float) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(
            f"{_shown(value)} is not a quantity: use a number or a string such as '500m' or '4Gi'"
        )
    if isinstance(value, int):
        return Decimal(value) if abs(value) <= MAX_QUANTITY else MAX_QUANTITY + 1
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        return Decimal(repr(value))
    text = value.strip()
    if len(text) > MAX_QUANTITY_TEXT:
        raise QuantityError(
            f"{_shown(value)} is not a quantity: at most {MAX_QUANTITY_TEXT} characters"
        )
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"{value!r} is not a quantity: use e.g. '500m' or '2' for CPU, '4Gi' or '512Mi' for memory"
        )
    try:
        number = Decimal(match.group("num"))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{value!r} is not a quantity") from exc
    if match.group("exp"):
        exponent = int(match.group("exp")[1:])
        if exponent > 30:  # beyond 2^63 whatever the digits before it (at most 64 of them)
            return MAX_QUANTITY + 1 if number else Decimal(0)
        if exponent < -30:
            return Decimal(0) if not number else Decimal("1e-30").copy_sign(number)
        return number.scaleb(exponent)
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    return number * _DECIMAL[suffix]


def to_milli(value: Decimal) -> int:
    """Cores -> millicores, rounded up."""
    return math.ceil(value * 1000)


def to_mib(value: Decimal) -> int:
    """Bytes -> MiB, rounded up."""
    return math.ceil(value / MIB)


def format_cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_mib(mib: int) -> str:
    """2048 -> '2Gi', 3584 -> '3.5Gi', 100 -> '100Mi', 0 -> '0' (as Kubernetes writes it)."""
    if mib == 0:
        return "0"
    gib = Decimal(mib) / 1024
    if gib == gib.quantize(Decimal("0.01")) and mib >= 512:
        return f"{format(gib.normalize(), 'f')}Gi"
    return f"{mib}Mi"
