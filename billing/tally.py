"""Tallies: usage summed per report bucket in exact integer unit-seconds, rated once. Pure.

A report at minute, hour or day granularity does not need each segment's amount, only the sum
of what was held per bucket and per *rate key* (what a second of it costs: compute class, QoS,
GPU model and price version). So segments are cut at bucket boundaries and price changes and
their unit-seconds added up as integers:

| unit           | of resource  | quantity             |
|----------------|--------------|----------------------|
| milli-vCPU-s   | `vcpu`       | / 1000 -> vCPU-s     |
| MiB-s          | `memory`     | / 1024 -> GiB-s      |
| VRAM MiB-s     | `gpu-memory` | / 1024 -> GiB-s      |
| SM %-s         | `gpu-core`   | as is                |

Each tally entry is rated once at the end (`billing.rating.amounts` on the summed quantity),
which is both faster than rating every piece and exact: the quantities are exact decimals and
the amount of a sum is rounded once, at 50 digits.

Entries are keyed by namespace and workload too (what reports group by). The same entries,
bucketed by hour and keyed without the pod, are what the ledger keeps as
hourly rollups (`billing.ledger.roll_up`), so a report over closed hours reads them instead of
every event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from billing.prices import PriceBook, PriceList
from billing.rating import EPOCH, amounts, clip
from billing.usage import Segment, Spec

Units = list[int]  # [milli-vCPU-s, MiB-s, VRAM MiB-s, SM %-s]


@dataclass(frozen=True)
class RateKey:
    """What one second of usage costs depends on these and nothing else."""

    compute_class: str
    qos: str
    gpu_model: str | None
    price: str | None  # the price version's name; None before the first price list
    gpu: bool  # held GPU VRAM (a pod's GPU model is reported only then)


@dataclass(frozen=True)
class TallyKey:
    bucket: datetime
    namespace: str
    pod: str | None  # "namespace/name"; None in hourly rollups, which do not keep pods
    rate: RateKey
    workload: str | None = None  # the pod's ("Kind/name"); None: no controller owns it


Tally = MutableMapping[TallyKey, Units]


def _epoch(at: datetime) -> int:
    return int((at - EPOCH).total_seconds())


def add(
    tally: Tally,
    segments: Iterable[Segment],
    book: PriceBook,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    step: int,
    pods: bool,
) -> Tally:
    """Add the segments' usage inside [start, end) to `tally`, in buckets of `step` seconds
    since the epoch (60, 3600, 86400); with `pods`, keyed per pod too."""
    for segment in segments:
        window = clip(segment, start, end, now)
        if window is None:
            continue
        spec = segment.spec
        per_second = (spec.cpu_milli, spec.memory_mib, spec.gpu_vram_mib, spec.gpu_core_pct)
        pod = f"{segment.pod.namespace}/{segment.pod.name}" if pods else None
        for p_lo, p_hi, prices in book.pieces(*window):
            rate = RateKey(
                spec.compute_class,
                spec.qos,
                spec.gpu_model,
                prices.name if prices else None,
                spec.gpu_vram_mib > 0,
            )
            cursor, stop = _epoch(p_lo), _epoch(p_hi)
            while cursor < stop:
                bucket = cursor - cursor % step
                upto = min(stop, bucket + step)
                seconds = upto - cursor
                key = TallyKey(
                    EPOCH + timedelta(seconds=bucket),
                    segment.pod.namespace,
                    pod,
                    rate,
                    segment.pod.workload,
                )
                units = tally.get(key)
                if units is None:
                    units = tally[key] = [0, 0, 0, 0]
                for i in range(4):
                    units[i] += per_second[i] * seconds
                cursor = upto
    return tally


def quantities(units: Sequence[int]) -> dict[str, Decimal]:
    """The report's quantities of summed unit-seconds (only the nonzero ones); exact."""
    cpu, memory, vram, core = units
    out = {
        "vcpu": Decimal(cpu) / 1000,
        "memory": Decimal(memory) / 1024,
        "gpu-memory": Decimal(vram) / 1024,
        "gpu-core": Decimal(core),
    }
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class Rated:
    key: TallyKey
    quantities: dict[str, Decimal]
    amounts: dict[str, Decimal]


def rated(tally: Mapping[TallyKey, Units], book: PriceBook) -> Iterator[Rated]:
    """Each entry's quantities and list-price amounts."""
    by_name: dict[str | None, PriceList | None] = {v.name: v for v in book.versions}
    by_name[None] = None
    for key, units in tally.items():
        q = quantities(units)
        if not q:
            continue
        rate = key.rate
        spec = Spec(0, 0, rate.compute_class, rate.qos, rate.gpu_model)
        yield Rated(key, q, amounts(spec, q, by_name.get(rate.price)))


def group_value(key: TallyKey, group_by: str) -> str | None:
    """The value of one `groupBy` key for a tally entry ("resource" is filled per resource)."""
    if group_by == "pod":
        return key.pod
    if group_by == "namespace":
        return key.namespace
    if group_by == "workload":
        return key.workload
    if group_by == "class":
        return key.rate.compute_class
    if group_by == "qos":
        return key.rate.qos
    if group_by == "gpuModel":
        return key.rate.gpu_model if key.rate.gpu else None
    return None
