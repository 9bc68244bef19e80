"""The pure billing math: rating a segment across price changes, commitment settlement against
hand-computed cases, and statement lines rounded once each (never per second)."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing import commitments
from billing.commitments import Term, settle
from billing.prices import PriceBook, PriceList, Tier, parse
from billing.rating import rate
from billing.statements import COMMITMENT, OVERAGE, SAVINGS, USAGE, day_lines, to_minor
from billing.usage import PodRef, Segment, Spec

DAY = datetime(2026, 3, 1, tzinfo=UTC)
POD = PodRef("uid-1", 1, "ns", "pod")
TIERS = (Tier(Decimal(10), Decimal("0.1")), Tier(Decimal(100), Decimal("0.2")))


def price(name: str, at: datetime, vcpu_hour: str, memory_gib_hour: str = "0") -> PriceList:
    compute = {"vcpuHour": vcpu_hour, "memoryGiBHour": memory_gib_hour}
    return parse(
        name,
        {
            "effectiveFrom": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "bestEffortFraction": "0.2",
            "compute": dict.fromkeys(("general-purpose", "performance", "gpu"), compute),
            "gpus": {"*": {"vramGiBHour": "0", "smPercentHour": "0"}},
            "commitmentTiers": [],
        },
        currency="USD",
    )


def segment(start: datetime, end: datetime | None, *, cpu_milli: int = 1000, qos: str = "default"):
    spec = Spec(cpu_milli, 1024, "general-purpose", qos)
    return Segment(POD, spec, start, end, "start")


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 86_400),
    change_at=st.integers(-3_600, 90_000),
    cpu_milli=st.sampled_from([500, 1000, 2500, 16000]),
    best_effort=st.booleans(),
)
def test_a_price_change_mid_segment_splits_it_at_that_second(
    length, change_at, cpu_milli, best_effort
) -> None:
    """Seconds before the change are rated at the old price and seconds after at the new one;
    no second is lost or counted twice, whatever the cut and the bucket size."""
    old = price("old", DAY - timedelta(days=30), "3.6")  # 0.001 per vCPU-second
    new = price("new", DAY + timedelta(seconds=change_at), "7.2")  # 0.002 per vCPU-second
    book = PriceBook([new, old])  # any order
    qos = "best-effort" if best_effort else "default"
    seg = segment(DAY, DAY + timedelta(seconds=length), cpu_milli=cpu_milli, qos=qos)
    before = min(max(change_at, 0), length)
    after = length - before
    factor = Decimal("0.2") if best_effort else Decimal(1)
    vcpus = Decimal(cpu_milli) / 1000
    expected = (before * Decimal("0.001") + after * Decimal("0.002")) * vcpus * factor
    for step in (None, 60, 3600):
        pieces = list(rate(seg, book, start=DAY, end=DAY + timedelta(days=2), now=DAY, step=step))
        assert sum(int((p.end - p.start).total_seconds()) for p in pieces) == length
        assert all(p.start < p.end for p in pieces)
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        at_old = sum(p.quantities["vcpu"] for p in pieces if p.price == "old")
        assert at_old == before * vcpus
        assert all(p.price == ("old" if p.end <= new.effective_from else "new") for p in pieces)
        total = sum((p.amounts["vcpu"] for p in pieces), Decimal(0))
        assert total == expected


def test_before_the_first_price_nothing_is_charged() -> None:
    book = PriceBook([price("p", DAY + timedelta(hours=1), "3.6")])
    pieces = list(
        rate(
            segment(DAY, DAY + timedelta(hours=2)),
            book,
            start=DAY,
            end=DAY + timedelta(days=1),
            now=DAY,
        )
    )
    assert [(p.price, p.amounts["vcpu"]) for p in pieces] == [
        (None, Decimal(0)),
        ("p", Decimal("3.6")),
    ]


# usage at list price, commitment per day -> discount, covered, overage, savings, owed
SETTLEMENTS = [
    # no plan: everything at list price
    ("50", "0", "0", "0", "50", "0", "50"),
    # below the first tier: a commitment without discount still covers usage at list price
    ("4", "5", "0", "4", "0", "-1", "5"),
    # 10/day at 10 % off buys 10 / 0.9 = 11.11... of list-price usage; 8 used costs 2 more
    ("8", "10", "0.1", "8", "0", "-2", "10"),
    ("20", "10", "0.1", "11.11111111", "8.88888889", "1.11111111", "18.88888889"),
    # unused commitment is still owed
    ("0", "100", "0.2", "0", "0", "-100", "100"),
    # 50/day at 10 % off with 10 used: 50 owed, 40 more than list price
    ("10", "50", "0.1", "10", "0", "-40", "50"),
    # 100/day at 20 % off buys 125 of usage; 200 used: 75 over at list price
    ("200", "100", "0.2", "125", "75", "25", "175"),
    # exactly the capacity: nothing over
    ("125", "100", "0.2", "125", "0", "25", "100"),
]


@pytest.mark.parametrize(
    ("usage", "commitment", "discount", "covered", "overage", "savings", "owed"), SETTLEMENTS
)
def test_commitment_settlement_against_hand_computed_cases(
    usage, commitment, discount, covered, overage, savings, owed
) -> None:
    day = settle(Decimal(usage), Decimal(commitment), TIERS)
    places = Decimal("0.00000001")
    assert day.discount == Decimal(discount)
    assert day.covered.quantize(places) == Decimal(covered).quantize(places)
    assert day.overage.quantize(places) == Decimal(overage).quantize(places)
    assert day.savings.quantize(places) == Decimal(savings).quantize(places)
    assert day.owed.quantize(places) == Decimal(owed).quantize(places)
    assert day.covered + day.overage == day.usage
    # against list price, whatever the sign (to the settlement's 50 digits)
    assert abs(day.savings - (day.usage - day.commitment - day.overage)) < Decimal("1e-20")


@given(usage=st.decimals(0, 10_000, places=6), commitment=st.decimals(0, 2_000, places=2))
def test_a_commitment_never_costs_more_than_it_saves_plus_what_is_unused(usage, commitment) -> None:
    """Owed = commitment + overage; at most list price plus the unused part of the commitment."""
    day = settle(usage, commitment, TIERS)
    assert day.owed >= usage * (1 - day.discount) - Decimal("1e-30")
    unused = max(Decimal(0), commitment - usage * (1 - day.discount))
    assert day.owed <= usage + unused + Decimal("1e-30")


def test_a_plan_starts_tomorrow_rises_today_and_lowers_tomorrow() -> None:
    today = date(2026, 3, 1)
    assert commitments.change(today, [], Decimal(10)) == today + timedelta(days=1)
    terms = [Term(today - timedelta(days=3), Decimal(10), 1)]
    assert commitments.change(today, terms, Decimal(20)) == today  # a raise counts from today
    assert commitments.change(today, terms, Decimal(5)) == today + timedelta(days=1)
    assert commitments.change(today, terms, Decimal(0)) == today + timedelta(days=1)
    terms.append(Term(today, Decimal(20), 2))
    assert commitments.amount_on(today, terms) == Decimal(20)
    assert commitments.amount_on(today - timedelta(days=1), terms) == Decimal(10)


def test_a_statement_line_is_rounded_once_not_each_second() -> None:
    """A day of a 0.5 vCPU pod at 0.0036/vCPU-hour is 0.0000005 a second: rounded each second it
    would come to 0; rounded once the line is 0.04 (86,400 s x 0.0000005 = 0.0432)."""
    book = PriceBook([price("p", DAY - timedelta(days=1), "0.0036")])
    seg = segment(DAY, DAY + timedelta(days=1), cpu_milli=500)
    per_second = list(rate(seg, book, start=DAY, end=DAY + timedelta(days=1), now=DAY, step=1))
    assert len(per_second) == 86_400
    assert sum(to_minor(p.amounts["vcpu"], 2) for p in per_second) == 0
    statement = day_lines(
        DAY.date(), per_second, commitment=Decimal(0), tiers=TIERS, minor_digits=2
    )
    (line,) = [x for x in statement.lines if x.kind == USAGE and x.resource == "vcpu"]
    assert line.amount_minor == 4 and statement.total_minor == 4


def test_a_best_effort_line_says_it_is_not_at_list_price() -> None:
    """A BestEffort pod's line is at the price list's fraction (20 %), and says so."""
    book = PriceBook([price("p", DAY - timedelta(days=1), "3600")])  # 1 per vCPU-second
    pieces = [
        piece
        for qos in ("default", "best-effort")
        for piece in rate(
            segment(DAY, DAY + timedelta(seconds=100), qos=qos),
            book,
            start=DAY,
            end=DAY + timedelta(days=1),
            now=DAY,
        )
    ]
    statement = day_lines(DAY.date(), pieces, commitment=Decimal(0), tiers=TIERS, minor_digits=2)
    lines = {x.qos: x for x in statement.lines if x.kind == USAGE and x.resource == "vcpu"}
    assert lines["default"].amount_minor == 100_00
    assert lines["default"].description.endswith("at list price")
    assert lines["best-effort"].amount_minor == 20_00
    assert "list price" not in lines["best-effort"].description.replace("a fraction of list", "")
    assert "BestEffort rate" in lines["best-effort"].description


def test_statement_lines_with_a_commitment_add_up() -> None:
    """200 of list-price usage against 100/day at 20 % off: 100 committed + 75 overage owed,
    the covered 125 and the savings of 25 shown but not added to the total."""
    book = PriceBook([price("p", DAY - timedelta(days=1), "3600")])  # 1 per vCPU-second
    seg = segment(DAY, DAY + timedelta(seconds=200))
    pieces = list(rate(seg, book, start=DAY, end=DAY + timedelta(days=1), now=DAY))
    statement = day_lines(DAY.date(), pieces, commitment=Decimal(100), tiers=TIERS, minor_digits=2)
    by_kind = {line.kind: line for line in statement.lines if line.resource is None}
    assert by_kind[COMMITMENT].amount_minor == 100_00
    assert by_kind[OVERAGE].amount_minor == 75_00
    assert by_kind[SAVINGS].amount_minor == 25_00 and not by_kind[SAVINGS].owed
    assert statement.total_minor == 175_00


def test_an_under_used_plan_shows_what_it_cost_above_list_price() -> None:
    """50/day at 10 % off with 10 of list-price usage: 50 owed, and the savings line says the
    plan cost 40 more than list price (not "saved 2.00")."""
    book = PriceBook([price("p", DAY - timedelta(days=1), "3600")])  # 1 per vCPU-second
    pieces = list(
        rate(
            segment(DAY, DAY + timedelta(seconds=10)),
            book,
            start=DAY,
            end=DAY + timedelta(days=1),
            now=DAY,
        )
    )
    statement = day_lines(DAY.date(), pieces, commitment=Decimal(50), tiers=TIERS, minor_digits=2)
    by_kind = {line.kind: line for line in statement.lines if line.resource is None}
    assert statement.total_minor == 50_00
    assert by_kind[SAVINGS].amount_minor == -40_00 and not by_kind[SAVINGS].owed
    assert "cost above list price" in by_kind[SAVINGS].description
