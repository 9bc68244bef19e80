"""The price book: versioned price lists, each effective from an instant. Pure.

A price list gives hourly list prices (Decimal, in the configured currency) per compute class
(vCPU-hour, GiB-hour of memory) and per GPU model (GiB-hour of VRAM, SM %-hour), the fraction of
list price BestEffort pods pay, and the daily commitment tiers. Usage is charged per second at
`price / 3600`; a stretch of usage that crosses a version's effective time is split there, so a
price change never reaches back before it took effect.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

COMPUTE_CLASSES = ("general-purpose", "performance", "gpu")
ANY_GPU = "*"
DEFAULT_BEST_EFFORT_FRACTION = Decimal("0.2")
MAX_PRICE = Decimal("1000000")  # per unit-hour: a bound on what the price book accepts
MAX_TIERS = 16
MAX_GPU_MODELS = 64


class PriceError(ValueError):
    def __init__(self, causes: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in causes))
        self.causes = causes


@dataclass(frozen=True)
class ComputeRates:
    vcpu_hour: Decimal
    memory_gib_hour: Decimal


@dataclass(frozen=True)
class GPURates:
    vram_gib_hour: Decimal
    sm_percent_hour: Decimal


@dataclass(frozen=True)
class Tier:
    min_per_day: Decimal
    discount: Decimal


@dataclass(frozen=True)
class PriceList:
    name: str
    effective_from: datetime
    currency: str
    best_effort_fraction: Decimal
    compute: Mapping[str, ComputeRates]
    gpus: Mapping[str, GPURates]
    tiers: tuple[Tier, ...]

    def gpu(self, model: str | None) -> GPURates:
        return self.gpus.get(model or ANY_GPU) or self.gpus[ANY_GPU]

    def discount_for(self, commitment: Decimal) -> Decimal:
        """The discount of the highest tier the daily commitment reaches (0 below every tier)."""
        best = Decimal(0)
        for tier in self.tiers:
            if commitment >= tier.min_per_day:
                best = max(best, tier.discount)
        return best


def _decimal(
    value: Any, field: str, causes: list[tuple[str, str]], *, high: Decimal = MAX_PRICE
) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int):
        causes.append((field, f'Invalid value: {value!r}: give a decimal string such as "0.04"'))
        return Decimal(0)
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        causes.append((field, f'Invalid value: "{value}": not a decimal number'))
        return Decimal(0)
    if not number.is_finite() or number < 0 or number > high:
        causes.append((field, f'Invalid value: "{value}": must be between 0 and {high}'))
        return Decimal(0)
    if number.as_tuple().exponent < -12:  # type: ignore[operator]
        causes.append((field, f'Invalid value: "{value}": at most 12 decimal places'))
    return number


RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def parse_time(value: Any, field: str, causes: list[tuple[str, str]]) -> datetime:
    """An RFC 3339 time, strictly: four-digit year, date, `T`, time, zone (Z or an offset)."""
    if not isinstance(value, str):
        causes.append((field, 'Required value: an RFC 3339 time such as "2026-12-01T00:00:00Z"'))
        return datetime.fromtimestamp(0, UTC)
    if not RFC3339.fullmatch(value):
        causes.append(
            (
                field,
                f'Invalid value: "{value[:64]}": not an RFC 3339 time; write it like '
                '"2026-12-01T00:00:00Z" (four-digit year, T, a zone)',
            )
        )
        return datetime.fromtimestamp(0, UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        causes.append((field, f'Invalid value: "{value}": not an RFC 3339 time'))
        return datetime.fromtimestamp(0, UTC)
    if parsed.tzinfo is None:
        causes.append((field, f'Invalid value: "{value}": give the offset (e.g. a trailing Z)'))
        return parsed.replace(tzinfo=UTC)
    if parsed.microsecond:
        causes.append((field, f'Invalid value: "{value}": whole seconds only'))
    return parsed.astimezone(UTC)


def parse(name: str, spec: Mapping[str, Any], *, currency: str) -> PriceList:
    """Validate a Price's `spec` (as the API receives it); every bad field is named."""
    causes: list[tuple[str, str]] = []
    effective = parse_time(spec.get("effectiveFrom"), "spec.effectiveFrom", causes)
    given_currency = spec.get("currency", currency)
    if given_currency != currency:
        causes.append(
            (
                "spec.currency",
                f'Invalid value: "{given_currency}": this installation bills in {currency}',
            )
        )
    fraction = _decimal(
        spec.get("bestEffortFraction", str(DEFAULT_BEST_EFFORT_FRACTION)),
        "spec.bestEffortFraction",
        causes,
        high=Decimal(1),
    )
    compute: dict[str, ComputeRates] = {}
    raw_compute = spec.get("compute")
    if not isinstance(raw_compute, Mapping):
        causes.append(("spec.compute", f"Required value: prices for {', '.join(COMPUTE_CLASSES)}"))
        raw_compute = {}
    for cls in COMPUTE_CLASSES:
        entry = raw_compute.get(cls)
        if not isinstance(entry, Mapping):
            causes.append((f"spec.compute.{cls}", "Required value: vcpuHour and memoryGiBHour"))
            continue
        compute[cls] = ComputeRates(
            _decimal(entry.get("vcpuHour"), f"spec.compute.{cls}.vcpuHour", causes),
            _decimal(entry.get("memoryGiBHour"), f"spec.compute.{cls}.memoryGiBHour", causes),
        )
    for cls in raw_compute:
        if cls not in COMPUTE_CLASSES:
            causes.append(
                (f"spec.compute.{cls}", f"Unsupported value: one of {', '.join(COMPUTE_CLASSES)}")
            )
    gpus: dict[str, GPURates] = {}
    raw_gpus = spec.get("gpus")
    if not isinstance(raw_gpus, Mapping) or ANY_GPU not in raw_gpus:
        causes.append(
            ("spec.gpus", 'Required value: prices per GPU model, with "*" for any other model')
        )
        raw_gpus = raw_gpus if isinstance(raw_gpus, Mapping) else {}
    if len(raw_gpus) > MAX_GPU_MODELS:
        causes.append(("spec.gpus", f"Too many: at most {MAX_GPU_MODELS} GPU models"))
    for model, entry in list(raw_gpus.items())[:MAX_GPU_MODELS]:
        where = f"spec.gpus.{model}"
        if not isinstance(entry, Mapping):
            causes.append((where, "Required value: vramGiBHour and smPercentHour"))
            continue
        gpus[str(model)] = GPURates(
            _decimal(entry.get("vramGiBHour"), f"{where}.vramGiBHour", causes),
            _decimal(entry.get("smPercentHour"), f"{where}.smPercentHour", causes),
        )
    tiers: list[Tier] = []
    raw_tiers = spec.get("commitmentTiers", [])
    if not isinstance(raw_tiers, list) or len(raw_tiers) > MAX_TIERS:
        causes.append(("spec.commitmentTiers", f"Invalid value: a list of at most {MAX_TIERS}"))
        raw_tiers = []
    for i, entry in enumerate(raw_tiers):
        where = f"spec.commitmentTiers[{i}]"
        if not isinstance(entry, Mapping):
            causes.append((where, "Required value: minPerDay and discount"))
            continue
        tiers.append(
            Tier(
                _decimal(entry.get("minPerDay"), f"{where}.minPerDay", causes, high=Decimal(10**9)),
                _decimal(entry.get("discount"), f"{where}.discount", causes, high=Decimal("0.99")),
            )
        )
    ordered = sorted(tiers, key=lambda t: t.min_per_day)
    for low, high in itertools.pairwise(ordered):
        if high.min_per_day == low.min_per_day or high.discount < low.discount:
            causes.append(
                (
                    "spec.commitmentTiers",
                    "Invalid value: tiers need distinct minPerDay and a discount that grows with it",
                )
            )
            break
    if causes:
        raise PriceError(causes)
    return PriceList(name, effective, currency, fraction, compute, gpus, tuple(ordered))


def to_spec(prices: PriceList) -> dict[str, Any]:
    """The canonical `spec` of a price list (what is stored and served)."""
    return {
        "effectiveFrom": prices.effective_from.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "currency": prices.currency,
        "bestEffortFraction": str(prices.best_effort_fraction),
        "compute": {
            cls: {"vcpuHour": str(r.vcpu_hour), "memoryGiBHour": str(r.memory_gib_hour)}
            for cls, r in prices.compute.items()
        },
        "gpus": {
            model: {"vramGiBHour": str(r.vram_gib_hour), "smPercentHour": str(r.sm_percent_hour)}
            for model, r in prices.gpus.items()
        },
        "commitmentTiers": [
            {"minPerDay": str(t.min_per_day), "discount": str(t.discount)} for t in prices.tiers
        ],
    }


class PriceBook:
    """All versions, ordered by effective time. Before the first version nothing is charged."""

    def __init__(self, versions: list[PriceList]) -> None:
        self.versions = sorted(versions, key=lambda v: v.effective_from)
        self._starts = [v.effective_from for v in self.versions]

    def at(self, when: datetime) -> PriceList | None:
        i = bisect.bisect_right(self._starts, when) - 1
        return self.versions[i] if i >= 0 else None

    def pieces(
        self, start: datetime, end: datetime
    ) -> Iterator[tuple[datetime, datetime, PriceList | None]]:
        """[start, end) cut at every version's effective time inside it."""
        i = bisect.bisect_right(self._starts, start) - 1
        cursor = start
        while cursor < end:
            current = self.versions[i] if i >= 0 else None
            following = self._starts[i + 1] if i + 1 < len(self._starts) else None
            stop = min(end, following) if following is not None else end
            yield cursor, stop, current
            cursor = stop
            i += 1


JUMP = Decimal(10)  # a rate more than this many times (or this fraction of) the one before


def _rates(prices: PriceList) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for cls, c in prices.compute.items():
        out[f"spec.compute.{cls}.vcpuHour"] = c.vcpu_hour
        out[f"spec.compute.{cls}.memoryGiBHour"] = c.memory_gib_hour
    for model, g in prices.gpus.items():
        out[f"spec.gpus.{model}.vramGiBHour"] = g.vram_gib_hour
        out[f"spec.gpus.{model}.smPercentHour"] = g.sm_percent_hour
    return out


def warnings(prices: PriceList, before: PriceList | None) -> list[str]:
    """What an operator should look at twice before a version takes effect: a rate of 0 (the
    usage is free) and a rate more than 10x, or under a tenth of, the same rate in the version
    before it (`before`; a GPU model it did not name is compared with its "*")."""
    out = []
    previous = _rates(before) if before is not None else {}
    for field, rate in _rates(prices).items():
        if rate == 0:
            out.append(f"{field} is 0: usage of it is free")
            continue
        old = previous.get(field)
        if old is None and before is not None and field.startswith("spec.gpus."):
            old = previous.get(f"spec.gpus.{ANY_GPU}." + field.rsplit(".", 1)[1])
        if not old:
            continue
        if rate > old * JUMP or rate * JUMP < old:
            out.append(
                f"{field} is {rate}, against {old} in {before.name if before else ''}: "
                f"more than a {JUMP}x change"
            )
    return out
