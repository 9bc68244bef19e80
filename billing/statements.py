"""Daily statements: what a tenant owes for one UTC day. Pure.

Lines:
- `usage`: one per (resource, compute class, QoS), at list price;
- with a commitment plan: `commitment` (the daily amount, owed whether used or not),
  `covered` (list-price usage the commitment paid for), `overage` (usage beyond it, at list
  price) and `savings`: the day's usage at list price minus what is owed (commitment +
  overage), negative when the plan was not used up; the usage lines are then informational
  and the total is commitment + overage;
- `adjustment`: usage of an earlier, already closed day that arrived after it was closed;
- `credit`: an operator's credit of a window (an outage): minus the window's usage at list price
  (on a day with a plan, at most its overage), never more than the day owes; a credit of a day
  already closed goes on the next statement.

Rounding: each line is rounded ONCE, half up, to the currency's minor unit from the exact sum of
its per-second amounts (never per second or per segment); the total is the sum of the rounded
lines that are owed, so it always equals what the lines add up to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_UP, Decimal

from billing.commitments import settle
from billing.prices import Tier
from billing.rating import BEST_EFFORT, Piece

USAGE, COMMITMENT, COVERED, OVERAGE, SAVINGS, ADJUSTMENT, CREDIT = (
    "usage",
    "commitment",
    "covered",
    "overage",
    "savings",
    "adjustment",
    "credit",
)


def to_minor(amount: Decimal, minor_digits: int) -> int:
    return int(
        (amount * (Decimal(10) ** minor_digits)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    )


def from_minor(minor: int, minor_digits: int) -> Decimal:
    return Decimal(minor).scaleb(-minor_digits)


@dataclass(frozen=True)
class Line:
    kind: str
    description: str
    amount_minor: int
    owed: bool  # counts toward the total
    resource: str | None = None
    compute_class: str | None = None
    qos: str | None = None
    quantity: Decimal | None = None
    day: date | None = None  # an adjustment's or a credit's day
    credit: str | None = None  # a credit's id

    def to_json(self, minor_digits: int) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": self.kind,
            "description": self.description,
            "amount": format(from_minor(self.amount_minor, minor_digits), "f"),
            "owed": self.owed,
        }
        for key, value in (
            ("resource", self.resource),
            ("class", self.compute_class),
            ("qos", self.qos),
            ("day", self.day.isoformat() if self.day else None),
            ("credit", self.credit),
        ):
            if value is not None:
                out[key] = value
        if self.quantity is not None:
            out["quantity"] = format(self.quantity.normalize(), "f") if self.quantity else "0"
        return out

    @classmethod
    def from_json(cls, data: dict[str, object], minor_digits: int) -> Line:
        quantity = data.get("quantity")
        day = data.get("day")
        return cls(
            kind=str(data["kind"]),
            description=str(data["description"]),
            amount_minor=to_minor(Decimal(str(data["amount"])), minor_digits),
            owed=bool(data["owed"]),
            resource=data.get("resource"),  # type: ignore[arg-type]
            compute_class=data.get("class"),  # type: ignore[arg-type]
            qos=data.get("qos"),  # type: ignore[arg-type]
            quantity=Decimal(str(quantity)) if quantity is not None else None,
            day=date.fromisoformat(str(day)) if day else None,
            credit=str(data["credit"]) if data.get("credit") else None,
        )


@dataclass(frozen=True)
class DayStatement:
    day: date
    lines: tuple[Line, ...]

    @property
    def total_minor(self) -> int:
        return sum(line.amount_minor for line in self.lines if line.owed)


def day_lines(
    day: date,
    pieces: Iterable[Piece],
    *,
    commitment: Decimal,
    tiers: Sequence[Tier],
    minor_digits: int,
) -> DayStatement:
    """The statement of one day from the rated pieces of its usage (pieces inside the day)."""
    sums: dict[tuple[str, str, str], tuple[Decimal, Decimal]] = {}
    for piece in pieces:
        spec = piece.segment.spec
        for resource, quantity in piece.quantities.items():
            key = (resource, spec.compute_class, spec.qos)
            q, a = sums.get(key, (Decimal(0), Decimal(0)))
            sums[key] = (q + quantity, a + piece.amounts[resource])
    usage_total = sum((a for _, a in sums.values()), Decimal(0))
    has_plan = commitment > 0
    lines = [
        Line(
            USAGE,
            f"{resource} ({cls}, {qos}) "
            + (
                "at the BestEffort rate (a fraction of list)"
                if qos == BEST_EFFORT
                else "at list price"
            ),
            to_minor(a, minor_digits),
            owed=not has_plan,
            resource=resource,
            compute_class=cls,
            qos=qos,
            quantity=q,
        )
        for (resource, cls, qos), (q, a) in sorted(sums.items())
    ]
    if has_plan:
        settled = settle(usage_total, commitment, tiers)
        pct = format((settled.discount * 100).normalize(), "f")
        commitment_minor = to_minor(commitment, minor_digits)
        overage_minor = to_minor(settled.overage, minor_digits)
        # What the plan saved: the day's usage at list price minus what is owed for it. An
        # under-used plan costs more than list price: the line is negative and says so.
        saved = to_minor(usage_total, minor_digits) - commitment_minor - overage_minor
        lines += [
            Line(
                COMMITMENT,
                f"daily commitment ({pct}% off list)",
                commitment_minor,
                owed=True,
            ),
            Line(
                COVERED,
                "usage at list price covered by the commitment",
                to_minor(settled.covered, minor_digits),
                owed=False,
            ),
            Line(
                OVERAGE,
                "usage beyond the commitment, at list price",
                overage_minor,
                owed=True,
            ),
            Line(
                SAVINGS,
                "saved against list price"
                if saved >= 0
                else "cost above list price (the commitment was not used up)",
                saved,
                owed=False,
            ),
        ]
    return DayStatement(day, tuple(lines))


def adjustment(day: date, billed_minor: int, now_minor: int) -> Line | None:
    """What an earlier closed day now comes to, against what was billed for it so far."""
    difference = now_minor - billed_minor
    if difference == 0:
        return None
    return Line(
        ADJUSTMENT,
        f"late usage for {day.isoformat()} (closed before it arrived)",
        difference,
        owed=True,
        day=day,
    )


def credit_line(
    *, credit: str, reason: str, day: date, window: tuple[str, str], amount_minor: int
) -> Line:
    """A credit of `amount_minor` (what it returns, >= 0) for `day`."""
    return Line(
        CREDIT,
        f"credit for {window[0]} to {window[1]}: {reason}",
        -amount_minor,
        owed=True,
        day=day,
        credit=credit,
    )
