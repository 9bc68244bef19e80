"""Usage reports: quantities and amounts per time bucket and group. Pure.

`aggregate()` yields rows ordered by bucket, then group. Per-second rows come from a sweep over
the points where anything changes (a segment starts or ends, a price takes effect), so a long
per-second report is produced lazily, row by row, in constant memory per active group; minute,
hour and day rows come from a tally (`billing.tally`): unit-seconds summed per bucket and rate key
as integers and rated once per entry.

Amounts in reports carry 6 decimal places, rounded so that the rows add up to the total
exactly (`carried`: the total is the exact sum rounded half up once, and each row carries the
rounding of the rows before it); statements, not reports, are what is owed, and they round each
line once to the currency's minor unit.
"""

from __future__ import annotations

import csv
import heapq
import io
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from billing import tally
from billing.prices import PriceBook
from billing.rating import RESOURCES, UNITS, amounts, bucket_start, clip, quantities
from billing.tally import TallyKey, Units
from billing.usage import Segment

GRANULARITIES = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
GROUP_BY = ("pod", "namespace", "workload", "resource", "class", "qos", "gpuModel")
REPORT_PLACES = Decimal("0.000001")
# Bounds on what one report may ask for: the range, and for per-second reports a shorter one.
MAX_RANGE = timedelta(days=366)
MAX_SECOND_RANGE = timedelta(days=7)

GroupKey = tuple[str | None, ...]


@dataclass(frozen=True)
class Row:
    start: datetime
    end: datetime
    group: GroupKey  # values in the order of `group_by` (resource included when asked)
    quantities: dict[str, Decimal]
    amount: Decimal


def _segment_key(segment: Segment, group_by: Sequence[str]) -> GroupKey:
    values: list[str | None] = []
    for key in group_by:
        if key == "pod":
            values.append(f"{segment.pod.namespace}/{segment.pod.name}")
        elif key == "namespace":
            values.append(segment.pod.namespace)
        elif key == "workload":
            values.append(segment.pod.workload)
        elif key == "class":
            values.append(segment.spec.compute_class)
        elif key == "qos":
            values.append(segment.spec.qos)
        elif key == "gpuModel":
            values.append(segment.spec.gpu_model if segment.spec.gpu_vram_mib else None)
        elif key == "resource":
            values.append(None)  # filled per resource
    return tuple(values)


def _expand(
    start: datetime,
    end: datetime,
    key: GroupKey,
    q: dict[str, Decimal],
    a: dict[str, Decimal],
    group_by: Sequence[str],
) -> Iterator[Row]:
    if "resource" not in group_by:
        if q:
            yield Row(start, end, key, dict(q), sum(a.values(), Decimal(0)))
        return
    at = list(group_by).index("resource")
    for resource in RESOURCES:
        if resource in q:
            k = (*key[:at], resource, *key[at + 1 :])
            yield Row(start, end, k, {resource: q[resource]}, a[resource])


def _sort_key(key: GroupKey) -> tuple[str, ...]:
    return tuple("" if v is None else v for v in key)


def aggregate(
    segments: Iterable[Segment],
    book: PriceBook,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    granularity: str,
    group_by: Sequence[str],
    rolled: Mapping[TallyKey, Units] | None = None,
    rolled_span: tuple[datetime, datetime] | None = None,
) -> Iterator[Row]:
    """Rows of the usage inside [start, end). With `rolled_span` [lo, hi), the usage of those
    whole hours is `rolled` (the ledger's hourly rollups) and the segments count only outside
    them; rollups serve hour and day reports not grouped by pod, since they keep neither."""
    step = GRANULARITIES[granularity]
    if rolled_span is not None and (step % 3600 or "pod" in group_by):
        raise ValueError("hourly rollups serve only hour and day reports not grouped by pod")
    if step == 1:
        yield from _per_second(segments, book, start=start, end=end, now=now, group_by=group_by)
        return
    entries: dict[TallyKey, Units] = {}
    for hourly, units in (rolled or {}).items():
        into = entries.setdefault(
            replace(hourly, bucket=bucket_start(hourly.bucket, step)), [0] * 4
        )
        for i, held in enumerate(units):
            into[i] += held
    windows = [(start, end)]
    if rolled_span is not None:
        segments = list(segments)
        windows = [(start, rolled_span[0]), (rolled_span[1], end)]
    for w_start, w_end in windows:
        if w_start < w_end:
            tally.add(
                entries,
                segments,
                book,
                start=w_start,
                end=w_end,
                now=now,
                step=step,
                pods="pod" in group_by,
            )
    buckets: dict[tuple[datetime, GroupKey], tuple[dict[str, Decimal], dict[str, Decimal]]] = {}
    for entry in tally.rated(entries, book):
        group = tuple(tally.group_value(entry.key, g) for g in group_by)
        q, a = buckets.setdefault((entry.key.bucket, group), ({}, {}))
        for resource, value in entry.quantities.items():
            q[resource] = q.get(resource, Decimal(0)) + value
            a[resource] = a.get(resource, Decimal(0)) + entry.amounts[resource]
    for (bucket, key), (q, a) in sorted(
        buckets.items(), key=lambda kv: (kv[0][0], _sort_key(kv[0][1]))
    ):
        lo, hi = max(bucket, start), min(bucket + timedelta(seconds=step), end)
        yield from _expand(lo, hi, key, q, a, group_by)


def _per_second(
    segments: Iterable[Segment],
    book: PriceBook,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: Sequence[str],
) -> Iterator[Row]:
    windows = []
    for segment in segments:
        window = clip(segment, start, end, now)
        if window is not None:
            windows.append((window[0], window[1], segment))
    windows.sort(key=lambda w: w[0])
    points = {lo for lo, _, _ in windows} | {hi for _, hi, _ in windows}
    points |= {v.effective_from for v in book.versions if start < v.effective_from < end}
    ordered = sorted(points)
    active: list[tuple[datetime, int, Segment]] = []
    i = 0
    for lo, hi in itertools.pairwise(ordered):
        while i < len(windows) and windows[i][0] <= lo:
            heapq.heappush(active, (windows[i][1], i, windows[i][2]))
            i += 1
        while active and active[0][0] <= lo:
            heapq.heappop(active)
        if not active:
            continue
        prices = book.at(lo)
        per_group: dict[GroupKey, tuple[dict[str, Decimal], dict[str, Decimal]]] = {}
        for _, _, segment in active:
            q1 = quantities(segment.spec, 1)
            a1 = amounts(segment.spec, q1, prices)
            q, a = per_group.setdefault(_segment_key(segment, group_by), ({}, {}))
            for resource, value in q1.items():
                q[resource] = q.get(resource, Decimal(0)) + value
                a[resource] = a.get(resource, Decimal(0)) + a1[resource]
        groups = sorted(per_group.items(), key=lambda kv: _sort_key(kv[0]))
        second = lo
        while second < hi:
            following = second + timedelta(seconds=1)
            for key, (q, a) in groups:
                yield from _expand(second, following, key, q, a, group_by)
            second = following


# --- output ---------------------------------------------------------------------------------


def fmt_quantity(value: Decimal) -> str:
    return format(value.normalize(), "f") if value else "0"


def fmt_amount(value: Decimal) -> str:
    return format(value.quantize(REPORT_PLACES, rounding=ROUND_HALF_UP), "f")


def fmt_time(at: datetime) -> str:
    # four-digit years always (strftime's %Y writes year 1 as "1")
    return (
        f"{at.year:04d}-{at.month:02d}-{at.day:02d}T{at.hour:02d}:{at.minute:02d}:{at.second:02d}Z"
    )


def carried(rows: Iterable[Row]) -> Iterator[Row]:
    """`rows` with each amount rounded to `REPORT_PLACES` so that the rounded rows add up to
    the rounded total exactly: each row carries what the rows before it lost or gained in
    rounding (its amount is the rounded running total minus what was written so far). Streams:
    a row is written as soon as it is known. Amounts never go below zero (the running total
    only grows, and rounding keeps its order)."""
    exact = Decimal(0)
    written = Decimal(0)
    for row in rows:
        exact += row.amount
        running = exact.quantize(REPORT_PLACES, rounding=ROUND_HALF_UP)
        yield replace(row, amount=running - written)
        written = running


def row_json(row: Row, group_by: Sequence[str]) -> dict[str, object]:
    item: dict[str, object] = {"start": fmt_time(row.start), "end": fmt_time(row.end)}
    for key, value in zip(group_by, row.group, strict=True):
        item[key] = value
    item["quantities"] = {r: fmt_quantity(v) for r, v in row.quantities.items()}
    item["amount"] = fmt_amount(row.amount)
    return item


def csv_header(group_by: Sequence[str]) -> list[str]:
    return ["start", "end", *group_by, *(f"{r} ({UNITS[r]})" for r in RESOURCES), "amount"]


def csv_row(row: Row, group_by: Sequence[str]) -> list[str]:
    return [
        fmt_time(row.start),
        fmt_time(row.end),
        *("" if v is None else v for v in row.group),
        *(fmt_quantity(row.quantities[r]) if r in row.quantities else "" for r in RESOURCES),
        fmt_amount(row.amount),
    ]


def csv_lines(rows: Iterable[Row], group_by: Sequence[str]) -> Iterator[str]:
    """CSV text in chunks of lines (for a streaming response)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(csv_header(group_by))
    for count, row in enumerate(rows, 1):
        writer.writerow(csv_row(row, group_by))
        if count % 2000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()
