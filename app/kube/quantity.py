"""Kubernetes resource quantities (`500m`, `2`, `1.5`, `20Gi`, `512Mi`, `1e3`).

Parsed exactly with Decimal; callers convert to the integer unit they need, rounding UP so that a
pod never gets less than it asked for.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

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
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)

MIB = 2**20
GIB = 2**30


class QuantityError(ValueError):
    pass


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity into its plain value (cores, bytes, a count)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        return Decimal(repr(value))
    text = value.strip()
    match = _PATTERN.match(text)
    if match is None:
        raise QuantityError(
            f"{value!r} is not a quantity: use e.g. '500m' or '2' for CPU, '4Gi' or '512Mi' for memory"
        )
    try:
        number = Decimal(match.group("num"))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{value!r} is not a quantity") from exc
    if match.group("exp"):
        return number * (Decimal(10) ** int(match.group("exp")[1:]))
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
    """2048 -> '2Gi', 3584 -> '3.5Gi', 100 -> '100Mi'."""
    gib = Decimal(mib) / 1024
    if gib == gib.quantize(Decimal("0.01")) and mib >= 512:
        return f"{format(gib.normalize(), 'f')}Gi"
    return f"{mib}Mi"
