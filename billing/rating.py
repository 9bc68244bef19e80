"""Rating: what a stretch of usage costs at list price. Pure.

Components, each a quantity in unit-seconds:

| resource     | quantity                      | price                                |
|--------------|-------------------------------|--------------------------------------|
| `vcpu`       | vCPU-seconds                  | the compute class's `vcpuHour` / 3600 |
| `memory`     | GiB-seconds                   | the class's `memoryGiBHour` / 3600    |
| `gpu-memory` | GiB-seconds of VRAM           | the GPU model's `vramGiBHour` / 3600  |
| `gpu-core`   | SM %-seconds (whole GPU: 100) | the model's `smPercentHour` / 3600    |

BestEffort pods pay the price list's `bestEffortFraction` of it. Quantities are exact decimals;
amounts are exact `Decimal`s, never rounded here (a statement rounds each of its lines once).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal, localcontext

from billing.prices import PriceBook, PriceList
from billing.usage import Segment, Spec

RESOURCES = ("vcpu", "memory", "gpu-memory", "gpu-core")
UNITS = {"vcpu": "vCPU-s", "memory": "GiB-s", "gpu-memory": "GiB-s", "gpu-core": "SM%-s"}
BEST_EFFORT = "best-effort"
_HOUR = Decimal(3600)
_CONTEXT = Context(prec=50)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def quantities(spec: Spec, seconds: int) -> dict[str, Decimal]:
    """Unit-seconds of each component held (only the nonzero ones)."""
    s = Decimal(seconds)
    with localcontext(_CONTEXT):
        out = {
            "vcpu": Decimal(spec.cpu_milli) * s / 1000,
            "memory": Decimal(spec.memory_mib) * s / 1024,
            "gpu-memory": Decimal(spec.gpu_vram_mib) * s / 1024,
            "gpu-core": Decimal(spec.gpu_core_pct) * s,
        }
    return {k: v for k, v in out.items() if v}


def amounts(
    spec: Spec, quantity: dict[str, Decimal], prices: PriceList | None
) -> dict[str, Decimal]:
    """List price of each component's quantity (0 before the first price list)."""
    if prices is None:
        return dict.fromkeys(quantity, Decimal(0))
    compute = prices.compute[spec.compute_class]
    gpu = prices.gpu(spec.gpu_model)
    hourly = {
        "vcpu": compute.vcpu_hour,
        "memory": compute.memory_gib_hour,
        "gpu-memory": gpu.vram_gib_hour,
        "gpu-core": gpu.sm_percent_hour,
    }
    factor = prices.best_effort_fraction if spec.qos == BEST_EFFORT else Decimal(1)
    with localcontext(_CONTEXT):
        return {k: q * hourly[k] * factor / _HOUR for k, q in quantity.items()}


@dataclass(frozen=True)
class Piece:
    """A part of one segment inside one report bucket and one price version."""

    segment: Segment
    start: datetime
    end: datetime
    price: str | None
    quantities: dict[str, Decimal]
    amounts: dict[str, Decimal]

    @property
    def amount(self) -> Decimal:
        return sum(self.amounts.values(), Decimal(0))


def bucket_start(at: datetime, step: int) -> datetime:
    offset = int((at - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=offset - offset % step)


def clip(
    segment: Segment, start: datetime, end: datetime, now: datetime
) -> tuple[datetime, datetime] | None:
    """The part of a segment inside [start, end); an open segment runs until `now`."""
    seg_end = segment.end if segment.end is not None else max(now, segment.start)
    lo, hi = max(segment.start, start), min(seg_end, end)
    return (lo, hi) if lo < hi else None


def rate(
    segment: Segment,
    book: PriceBook,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    step: int | None = None,
) -> Iterator[Piece]:
    """The segment's usage inside [start, end), cut at price changes and, with `step`, at every
    multiple of `step` seconds since the epoch (report buckets: 60, 3600, 86400)."""
    window = clip(segment, start, end, now)
    if window is None:
        return
    lo, hi = window
    for p_lo, p_hi, prices in book.pieces(lo, hi):
        cursor = p_lo
        while cursor < p_hi:
            stop = p_hi
            if step is not None:
                stop = min(p_hi, bucket_start(cursor, step) + timedelta(seconds=step))
            seconds = int((stop - cursor).total_seconds())
            q = quantities(segment.spec, seconds)
            yield Piece(
                segment,
                cursor,
                stop,
                prices.name if prices else None,
                q,
                amounts(segment.spec, q, prices),
            )
            cursor = stop
