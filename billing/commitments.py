"""Daily commitment plans. Pure.

A tenant commits to an amount C per UTC day. The price list in effect at the start of the day
gives the discount d of the highest tier C reaches. That day's usage at list price U is drawn
down against the commitment at the discounted rate, so C covers up to C / (1 - d) of list-price
usage; what is beyond it is billed at list price; an unused commitment is still owed:

    covered  = min(U, C / (1 - d))        (list-price usage the commitment pays for)
    overage  = U - covered                 (billed at list price)
    owed     = C + overage
    savings  = U - owed                    (against list price; negative when the plan is
                                            under-used: it then cost more than list price)

Plans change by day: a new plan starts at the next day boundary; an active plan may be raised
at any time (the raise counts for the whole current day) and lowered or ended only from the next
day boundary, never mid-day.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Context, Decimal, localcontext

from billing.prices import Tier

_CONTEXT = Context(prec=50)


@dataclass(frozen=True)
class CommitmentDay:
    commitment: Decimal
    discount: Decimal
    usage: Decimal  # at list price
    covered: Decimal
    overage: Decimal
    savings: Decimal

    @property
    def owed(self) -> Decimal:
        return self.commitment + self.overage


def discount_for(commitment: Decimal, tiers: Sequence[Tier]) -> Decimal:
    best = Decimal(0)
    for tier in tiers:
        if commitment >= tier.min_per_day:
            best = max(best, tier.discount)
    return best


def settle(usage: Decimal, commitment: Decimal, tiers: Sequence[Tier]) -> CommitmentDay:
    """One day: list-price usage against a daily commitment (amounts unrounded)."""
    if commitment <= 0:
        return CommitmentDay(Decimal(0), Decimal(0), usage, Decimal(0), usage, Decimal(0))
    d = discount_for(commitment, tiers)
    with localcontext(_CONTEXT):
        capacity = commitment / (1 - d)
        covered = min(usage, capacity)
        overage = usage - covered
        return CommitmentDay(commitment, d, usage, covered, overage, usage - commitment - overage)


@dataclass(frozen=True)
class Term:
    """From `effective_day` on, `amount` per day (0: no plan). Later `order` wins on a day."""

    effective_day: date
    amount: Decimal
    order: int


def amount_on(day: date, terms: Sequence[Term]) -> Decimal:
    best: Term | None = None
    for term in terms:
        if term.effective_day <= day and (
            best is None or (term.effective_day, term.order) > (best.effective_day, best.order)
        ):
            best = term
    return best.amount if best is not None else Decimal(0)


def change(today: date, terms: Sequence[Term], new_amount: Decimal) -> date:
    """The day a plan change takes effect: a raise of today's active plan counts from today;
    anything else (a new plan, a lowering, an end) from tomorrow."""
    current = amount_on(today, terms)
    if current > 0 and new_amount > current:
        return today
    return today + timedelta(days=1)
