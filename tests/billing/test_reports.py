"""Usage reports at every granularity tell one story: per-second rows (a sweep that rates each
second) summed into minutes, hours and days equal the minute, hour and day rows (a tally rated
once per bucket), and hours served from rollups equal hours computed from the segments."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from billing import tally
from billing.prices import PriceBook, parse
from billing.rating import bucket_start
from billing.reports import GRANULARITIES, REPORT_PLACES, Row, aggregate, carried
from billing.usage import PodRef, Segment, Spec

T0 = datetime(2026, 3, 1, 22, tzinfo=UTC)  # two hours before a day boundary
SPAN = timedelta(hours=4)


def prices(name: str, at: datetime, scale: int) -> object:
    return parse(
        name,
        {
            "effectiveFrom": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "bestEffortFraction": "0.2",
            "compute": {
                "general-purpose": {"vcpuHour": f"{scale}.07", "memoryGiBHour": "0.013"},
                "gpu": {"vcpuHour": f"{scale}.11", "memoryGiBHour": "0.017"},
                "performance": {"vcpuHour": "0.5", "memoryGiBHour": "0.02"},
            },
            "gpus": {"*": {"vramGiBHour": "0.09", "smPercentHour": "0.031"}},
            "commitmentTiers": [],
        },
        currency="USD",
    )


specs = st.builds(
    Spec,
    cpu_milli=st.sampled_from([500, 1000, 3500]),
    memory_mib=st.sampled_from([1024, 4096]),
    compute_class=st.sampled_from(["general-purpose", "gpu"]),
    qos=st.sampled_from(["default", "best-effort"]),
    gpu_model=st.sampled_from([None, "H200"]),
    gpu_vram_mib=st.sampled_from([0, 20480]),
    gpu_core_pct=st.sampled_from([0, 25]),
)


@st.composite
def segments(draw: st.DrawFn) -> list[Segment]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        start = T0 + timedelta(seconds=draw(st.integers(0, int(SPAN.total_seconds()) - 1)))
        length = draw(st.one_of(st.none(), st.integers(1, 3 * 3600)))
        end = None if length is None else start + timedelta(seconds=length)
        workload = draw(st.sampled_from([None, "Deployment/web", "Job/etl"]))
        pod = PodRef(f"uid-{i}", 1, draw(st.sampled_from(["a", "b"])), f"p{i}", workload)
        out.append(Segment(pod, draw(specs), start, end, "start"))
    return out


def totals(rows, step: int) -> dict[tuple, tuple[dict[str, Decimal], Decimal]]:
    """Rows summed into buckets of `step` seconds, per group."""
    out: dict[tuple, tuple[dict[str, Decimal], Decimal]] = defaultdict(lambda: ({}, Decimal(0)))
    for row in rows:
        key = (bucket_start(row.start, step), row.group)
        q, a = out[key]
        for resource, value in row.quantities.items():
            q[resource] = q.get(resource, Decimal(0)) + value
        out[key] = (q, a + row.amount)
    return dict(out)


def same(left, right) -> bool:
    """Equal quantities exactly; amounts equal to far below what a report shows (each side is
    a sum of 50-digit quotients, so the last digits may differ)."""
    if left.keys() != right.keys():
        return False
    return all(
        left[k][0] == right[k][0] and abs(left[k][1] - right[k][1]) < Decimal("1e-20") for k in left
    )


@settings(max_examples=25, deadline=None)
@given(
    data=segments(),
    change=st.integers(0, int(SPAN.total_seconds())),
    group_by=st.sampled_from(
        [(), ("resource",), ("namespace", "gpuModel"), ("pod", "qos"), ("workload", "qos")]
    ),
)
def test_every_granularity_sums_to_the_per_second_rows(data, change, group_by) -> None:
    book = PriceBook(
        [prices("old", T0 - timedelta(days=1), 1), prices("new", T0 + timedelta(seconds=change), 2)]
    )
    window = {"start": T0, "end": T0 + SPAN, "now": T0 + SPAN, "group_by": group_by}
    seconds = list(aggregate(data, book, granularity="second", **window))
    for granularity in ("minute", "hour", "day"):
        step = GRANULARITIES[granularity]
        rows = list(aggregate(data, book, granularity=granularity, **window))
        assert all(r.start < r.end and (r.end - r.start).total_seconds() <= step for r in rows)
        assert same(totals(rows, step), totals(seconds, step)), granularity


@settings(max_examples=25, deadline=None)
@given(
    data=segments(),
    rolled_hours=st.integers(0, 4),
    group_by=st.sampled_from(
        [(), ("resource",), ("namespace", "class", "qos", "gpuModel"), ("workload",)]
    ),
)
def test_hours_from_rollups_equal_hours_from_segments(data, rolled_hours, group_by) -> None:
    """What the ledger keeps for closed hours (a tally without pods) plus the segments of the
    hours after it gives the same report as the segments alone."""
    book = PriceBook([prices("list", T0 - timedelta(days=1), 1)])
    mid, end = T0 + timedelta(hours=rolled_hours), T0 + SPAN
    rolled = tally.add({}, data, book, start=T0, end=mid, now=end, step=3600, pods=False)
    for granularity in ("hour", "day"):
        window = {"end": end, "now": end, "granularity": granularity, "group_by": group_by}
        whole = list(aggregate(data, book, start=T0, **window))
        split = list(
            aggregate(data, book, start=T0, **window, rolled=rolled, rolled_span=(T0, mid))
        )
        step = GRANULARITIES[granularity]
        assert same(totals(whole, step), totals(split, step)), granularity


@given(
    amounts=st.lists(
        st.decimals(0, 1000, places=12, allow_nan=False, allow_infinity=False), max_size=200
    )
)
def test_rounded_rows_add_up_to_the_rounded_total(amounts) -> None:
    """Each row rounded to 6 places on its own may not add up to the total; carried, they do,
    and each row stays within a millionth of its exact amount."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [Row(start, start, (), {}, Decimal(a)) for a in amounts]
    out = list(carried(rows))
    total = sum((Decimal(a) for a in amounts), Decimal(0)).quantize(REPORT_PLACES, ROUND_HALF_UP)
    assert sum((r.amount for r in out), Decimal(0)) == total
    assert all(r.amount >= 0 for r in out)
    assert all(
        abs(r.amount - row.amount) <= REPORT_PLACES for r, row in zip(out, rows, strict=True)
    )
    assert all(r.amount == r.amount.quantize(REPORT_PLACES) for r in out)


def test_three_thirds_add_up() -> None:
    """Three rows of half a millionth: rounded alone, 0.000001 each, 0.000003 together, against
    a total of 0.000002 (0.0000015 rounded half up); carried, they add up to it."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    third = Decimal("0.0000005")
    out = [r.amount for r in carried([Row(start, start, (), {}, third)] * 3)]
    assert sum(out) == Decimal("0.000002") == (third * 3).quantize(REPORT_PLACES, ROUND_HALF_UP)
