"""A tenant's own limits, kept on its Tenant object (`tessera.io/v1`): a tenant-wide quota and
spend limits.

    spec:
      quota:            # the admin's: the most all the tenant's namespaces use together
        hard: {requests.cpu: "64", nvidia.com/gpu: "8", count/pods: "200"}
      spendLimits:      # the admin's ceilings, in the billing currency
        daily: "100"
        monthly: "2000"
      budget:           # the tenant's own: at most the ceilings; thresholds; what to stop
        daily: "40"
        monthly: "800"
        thresholds: [50, 80, 100]
        stopRunningPods: true

The quota is checked with the namespaces' ResourceQuotas (app/quotas/service.py), in the same
write lock, so it is as exact under concurrency as they are. The meter of the spend limits is
the ledger's own rating: today's spend is today's statement total, the month's the sum of its
days' statements (closed ones as closed, open ones as the ledger computes them now), so a limit
and the statements agree to the minor unit. Rating the ledger is too costly for every pod
create: `meter` (the node loop's budget pass, every `budget_check_seconds`) writes it to one
`tenant_spend` row per tenant with limits, tells each threshold crossed (an Event in the
tenant's namespace and a `BudgetThreshold` callback, once each: a `budget_alerts` row per
threshold and period), and at 100 % stops the tenant's running pods if its budget asks for it,
BestEffort first, each billed only up to the second the limit was reached (the ledger rated
second by second since the previous reading), so the time the meter takes to notice is not
billed and the day's statement ends within the last second of the tenant's pods of the limit. A pod create reads that row (once per transaction) and is refused with 403
while a limit is reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.auth.service import MAX_WEIGHT
from app.callbacks import service as callbacks
from app.db.engine import insert_unless_exists, upsert
from app.db.models import BudgetAlert, Pod, Statement, Tenant, TenantSpend, table
from app.errors import Cause, Forbidden, Invalid, NotFound, ResourceRef
from app.events import service as events
from app.kube.meta import timestamp
from app.quotas import service as quotas
from billing import ledger
from billing.statements import from_minor, to_minor
from billing.usage import whole_second

tenants_t = table(Tenant)
spend_t = table(TenantSpend)
alerts_t = table(BudgetAlert)
statements_t = table(Statement)
pods_t = table(Pod)

DAILY, MONTHLY = "daily", "monthly"
PERIODS = (DAILY, MONTHLY)
DEFAULT_THRESHOLDS = (100,)
MAX_THRESHOLDS = 10
MAX_AMOUNT = Decimal(10) ** 12
ADMIN_FIELDS = ("quota", "spendLimits", "weight")  # weight: fair share, in its own column
TENANT_FIELDS = ("budget",)
# The order running pods are stopped in when a budget is spent: the cheapest to lose first.
QOS_ORDER = {"best-effort": 0}


@dataclass(frozen=True)
class Money:
    currency: str
    minor_digits: int


# --- the spec -------------------------------------------------------------------------------


def _amount_causes(value: Any, path: str, money: Money) -> tuple[Decimal | None, list[Cause]]:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None, [Cause(path, f'Invalid value: "{str(value)[:64]}": an amount as a string')]
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        return None, [Cause(path, f'Invalid value: "{str(value)[:64]}": not a decimal amount')]
    if not amount.is_finite() or amount < 0:
        return None, [Cause(path, f'Invalid value: "{value}": must be a non-negative amount')]
    if amount > MAX_AMOUNT:
        return None, [Cause(path, f'Invalid value: "{value}": must be at most {MAX_AMOUNT}')]
    if amount != amount.quantize(Decimal(1).scaleb(-money.minor_digits)):
        return None, [
            Cause(
                path,
                f'Invalid value: "{value}": at most {money.minor_digits} decimals '
                f"(the minor unit of {money.currency})",
            )
        ]
    return amount, []


def _limits_causes(limits: Any, path: str, money: Money) -> list[Cause]:
    if limits is None:
        return []
    if not isinstance(limits, dict):
        return [Cause(path, "Invalid value: must be an object with daily and/or monthly")]
    causes = []
    for key, value in limits.items():
        if key in PERIODS:
            if value is not None:
                causes += _amount_causes(value, f"{path}.{key}", money)[1]
        elif path.endswith("budget") and key in ("thresholds", "stopRunningPods"):
            continue
        else:
            known = "daily, monthly" + (", thresholds, stopRunningPods" if "budget" in path else "")
            causes.append(
                Cause(
                    f"{path}.{str(key)[:64]}",
                    f'Unsupported value: "{str(key)[:64]}": supported fields: {known}',
                    "FieldValueNotSupported",
                )
            )
    return causes


def spec_causes(spec: Any, money: Money) -> list[Cause]:
    """What is wrong with a Tenant's spec, alone (the ceilings are checked by `check_write`)."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        return [Cause("spec", "Invalid value: must be an object")]
    causes = []
    for key in spec:
        if key not in ADMIN_FIELDS + TENANT_FIELDS:
            causes.append(
                Cause(
                    f"spec.{str(key)[:64]}",
                    f'Unsupported value: "{str(key)[:64]}": a Tenant\'s spec has quota, '
                    "spendLimits, budget and weight",
                    "FieldValueNotSupported",
                )
            )
    weight = spec.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        causes.append(
            Cause(
                "spec.weight", f"Invalid value: {weight!r}: a whole number from 1 to {MAX_WEIGHT}"
            )
        )
    quota = spec.get("quota")
    if quota is not None:
        if not isinstance(quota, dict) or set(quota) - {"hard"}:
            causes.append(Cause("spec.quota", "Invalid value: must be {hard: {...}}"))
        else:
            causes += [
                Cause(c.field.replace("spec.hard", "spec.quota.hard", 1), c.message, c.reason)
                for c in quotas.hard_causes(quota.get("hard"))
            ]
    causes += _limits_causes(spec.get("spendLimits"), "spec.spendLimits", money)
    budget = spec.get("budget")
    causes += _limits_causes(budget, "spec.budget", money)
    if isinstance(budget, dict):
        thresholds = budget.get("thresholds")
        if thresholds is not None and (
            not isinstance(thresholds, list)
            or len(thresholds) > MAX_THRESHOLDS
            or not all(
                isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 100 for t in thresholds
            )
            or len(set(thresholds)) != len(thresholds)
        ):
            causes.append(
                Cause(
                    "spec.budget.thresholds",
                    f'Invalid value: "{str(thresholds)[:64]}": at most {MAX_THRESHOLDS} '
                    "distinct whole percentages from 1 to 100, e.g. [50, 80, 100]",
                )
            )
        stop = budget.get("stopRunningPods")
        if stop is not None and not isinstance(stop, bool):
            causes.append(
                Cause("spec.budget.stopRunningPods", f'Invalid value: "{stop}": true or false')
            )
    return causes


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value).strip())


def limits_of(spec: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """The limit in force per period: the lower of the admin's ceiling and the tenant's budget
    (a period with neither has none)."""
    spec = spec or {}
    out = {}
    for period in PERIODS:
        found = [
            a
            for a in (
                _decimal((spec.get("spendLimits") or {}).get(period)),
                _decimal((spec.get("budget") or {}).get(period)),
            )
            if a is not None
        ]
        if found:
            out[period] = min(found)
    return out


def thresholds_of(spec: Mapping[str, Any] | None) -> tuple[int, ...]:
    budget = (spec or {}).get("budget") or {}
    return tuple(sorted(set(budget.get("thresholds") or DEFAULT_THRESHOLDS) | {100}))


def check_write(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, *, admin: bool, tenant: str
) -> None:
    """Who may change what: the admin all of it, the tenant its `budget` alone, and never past
    the admin's ceilings (403 naming what it may not do)."""
    old, new = old or {}, new or {}
    if not admin:
        changed = [f for f in ADMIN_FIELDS if old.get(f) != new.get(f)]
        if changed:
            raise Forbidden(
                f'tenants.tessera.io "{tenant}" is forbidden: only the admin sets '
                f"{', '.join('spec.' + f for f in changed)}; a tenant sets spec.budget",
                ref=ResourceRef("tenants", tenant, "tessera.io"),
            )
    ceilings = new.get("spendLimits") or {}
    budget = new.get("budget") or {}
    if admin:
        return  # the admin may lower a ceiling under a budget: the lower one is in force
    for period in PERIODS:
        mine, ceiling = _decimal(budget.get(period)), _decimal(ceilings.get(period))
        if mine is not None and ceiling is not None and mine > ceiling:
            raise Forbidden(
                f'tenants.tessera.io "{tenant}" is forbidden: spec.budget.{period} {mine} is '
                f"above the admin's ceiling spec.spendLimits.{period} {ceiling}: a tenant may "
                "only set a lower budget",
                ref=ResourceRef("tenants", tenant, "tessera.io"),
            )


def set_spec(
    session: Session, *, name: str, spec: dict[str, Any] | None, admin: bool, money: Money
) -> Tenant:
    """Replace a tenant's spec (validated, 422; authorized by field, 403)."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == name).with_for_update())
    if tenant is None:
        raise NotFound(f'tenants "{name}" not found', ref=ResourceRef("tenants", name))
    causes = spec_causes(spec, money)
    if causes:
        raise Invalid(
            f'Tenant.tessera.io "{name}" is invalid: '
            + ", ".join(f"{c.field}: {c.message}" for c in causes),
            causes=causes,
        )
    old = {**(tenant.spec or {}), "weight": tenant.weight}
    check_write(old, {"weight": 1, **(spec or {})}, admin=admin, tenant=name)
    stored = {k: v for k, v in (spec or {}).items() if k != "weight"} or None
    weight = (spec or {}).get("weight", 1)
    session.execute(
        update(tenants_t).where(tenants_t.c.id == tenant.id).values(spec=stored, weight=weight)
    )
    tenant.spec, tenant.weight = stored, weight
    session.info.pop("tenant_specs", None)
    return tenant


# --- the meter ------------------------------------------------------------------------------


def month_start(day: date) -> date:
    return day.replace(day=1)


def spend(session: Session, *, tenant_id: int, at: datetime, money: Money) -> tuple[int, int]:
    """(today, this month) in minor units: the statements' totals, as the ledger rates them."""
    today = at.date()
    first = month_start(today)
    closed = dict(
        session.execute(
            select(statements_t.c.day, statements_t.c.total_minor).where(
                statements_t.c.tenant_id == tenant_id,
                statements_t.c.day >= first,
                statements_t.c.day <= today,
            )
        ).all()
    )
    latest = session.scalar(
        select(func.max(statements_t.c.day)).where(statements_t.c.tenant_id == tenant_id)
    )
    opened = (
        latest + timedelta(days=1) if latest is not None else ledger.first_day(session, tenant_id)
    )
    book = None
    day_minor = month_minor = 0
    for offset in range((today - first).days + 1):
        day = first + timedelta(days=offset)
        if day in closed:
            total = int(closed[day])
        elif opened is not None and day >= opened:
            book = book or ledger.price_book(session, currency=money.currency)
            total = ledger.compute_day(
                session,
                tenant_id=tenant_id,
                day=day,
                now=at,
                book=book,
                minor_digits=money.minor_digits,
            ).total_minor
        else:
            total = 0
        month_minor += total
        if day == today:
            day_minor = total
    return day_minor, month_minor


def _period_start(period: str, day: date) -> date:
    return day if period == DAILY else month_start(day)


def _spent(period: str, day_minor: int, month_minor: int) -> int:
    return day_minor if period == DAILY else month_minor


@dataclass(frozen=True)
class Metered:
    tenant: str
    day_minor: int
    month_minor: int
    crossed: list[tuple[str, int]]  # (period, threshold) newly crossed
    stopped: list[str]  # pods stopped (namespace/name)


def meter(session: Session, *, at: datetime, money: Money, stop: Any = None) -> list[Metered]:
    """Meter every tenant with spend limits: write its spend row, tell each threshold newly
    crossed (an Event and a callback, once each), and at 100 % stop its running pods if its
    budget asks for it (`stop(session, row, reached)` stops one pod, billed up to `reached`, the
    second the limit was reached: `reached_at`). Returns what it did."""
    out = []
    rows = session.execute(
        select(tenants_t.c.id, tenants_t.c.name, tenants_t.c.uid, tenants_t.c.spec).where(
            tenants_t.c.spec.is_not(None)
        )
    ).all()
    for tenant_id, name, uid, spec in rows:
        limits = limits_of(spec)
        if not limits:
            continue
        last = session.scalar(select(spend_t.c.computed_at).where(spend_t.c.tenant_id == tenant_id))
        day_minor, month_minor = spend(session, tenant_id=tenant_id, at=at, money=money)
        upsert(
            session,
            spend_t,
            [
                {
                    "tenant_id": tenant_id,
                    "day": at.date(),
                    "day_minor": day_minor,
                    "month_minor": month_minor,
                    "currency": money.currency,
                    "minor_digits": money.minor_digits,
                    "computed_at": at,
                }
            ],
            update=("day", "day_minor", "month_minor", "currency", "minor_digits", "computed_at"),
        )
        crossed = []
        spent_out = False
        for period, limit in limits.items():
            limit_minor = to_minor(limit, money.minor_digits)
            spent = _spent(period, day_minor, month_minor)
            if spent >= limit_minor:
                spent_out = True
            for threshold in thresholds_of(spec):
                if spent * 100 < limit_minor * threshold:
                    continue
                if not insert_unless_exists(
                    session,
                    alerts_t,
                    {
                        "tenant_id": tenant_id,
                        "period": period,
                        "period_start": _period_start(period, at.date()),
                        "threshold": threshold,
                        "spent_minor": spent,
                        "limit_minor": limit_minor,
                        "at": at,
                    },
                ):
                    continue
                crossed.append((period, threshold))
                _tell(session, tenant_id, name, uid, period, threshold, spent, limit, at, money)
        stopped = []
        if spent_out and ((spec or {}).get("budget") or {}).get("stopRunningPods") and stop:
            holding = running_pods(session, tenant_id)
            if holding:
                reached = reached_at(
                    session, tenant_id=tenant_id, limits=limits, since=last, at=at, money=money
                )
            for row in holding:
                stop(session, row, reached)
                stopped.append(f"{row['namespace']}/{row['name']}")
        out.append(Metered(name, day_minor, month_minor, crossed, stopped))
    return out


def reached_at(
    session: Session,
    *,
    tenant_id: int,
    limits: Mapping[str, Decimal],
    since: datetime | None,
    at: datetime,
    money: Money,
) -> datetime:
    """The first whole second, since the previous reading (`since`, or the start of the day),
    at which a limit reached at `at` was reached: the ledger rated at each second tried (a
    binary search, spend never falling within a day). A limit already reached at the previous
    reading was reached, as far as the meter could know, then."""
    start = datetime.combine(at.date(), datetime.min.time(), tzinfo=at.tzinfo)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=at.tzinfo)  # SQLite keeps no zone
    lo = whole_second(max(start, since) if since is not None and since <= at else start)
    hi = whole_second(at)
    minors = {p: to_minor(v, money.minor_digits) for p, v in limits.items()}

    def reached(t: datetime) -> bool:
        day_minor, month_minor = spend(session, tenant_id=tenant_id, at=t, money=money)
        return any(_spent(p, day_minor, month_minor) >= m for p, m in minors.items())

    if reached(lo):
        return lo
    low, high = 0, int((hi - lo).total_seconds())  # reached(lo + high s), not reached(lo + low s)
    while high - low > 1:
        middle = (low + high) // 2
        if reached(lo + timedelta(seconds=middle)):
            high = middle
        else:
            low = middle
    return lo + timedelta(seconds=high)


def running_pods(session: Session, tenant_id: int) -> list[Mapping[Any, Any]]:
    """The tenant's pods that hold or wait for capacity and are not being deleted, BestEffort
    first (the newest first within each class)."""
    rows = (
        session.execute(
            select(pods_t).where(
                pods_t.c.tenant_id == tenant_id,
                pods_t.c.phase.notin_(quotas.TERMINAL_PHASES),
                pods_t.c.deletion_timestamp.is_(None),
            )
        )
        .mappings()
        .all()
    )
    return sorted(rows, key=lambda r: (QOS_ORDER.get(r["qos"], 1), -r["created_at"].timestamp()))


def _tell(
    session: Session,
    tenant_id: int,
    name: str,
    uid: str,
    period: str,
    threshold: int,
    spent: int,
    limit: Decimal,
    at: datetime,
    money: Money,
) -> None:
    shown = format(from_minor(spent, money.minor_digits), "f")
    reached = "reached" if threshold == 100 else "crossed"
    message = (
        f"{threshold}% of the {period} budget {reached}: spent {shown} of {limit} "
        f"{money.currency}"
        + (
            " (new pods are refused until the period ends or the budget is raised)"
            if threshold == 100
            else ""
        )
    )
    events.record(
        session,
        involved=events.Involved("Tenant", name, uid, name, api_version="tessera.io/v1"),
        reason="BudgetExceeded" if threshold == 100 else "BudgetThreshold",
        message=message,
        # Normal below 100 %: Warnings about one object with one reason are folded into one
        # event (a count), and each crossing is its own.
        type="Warning" if threshold == 100 else "Normal",
        component="tessera-budgets",
        tenant_id=tenant_id,
        at=at,
    )
    callbacks.emit(
        session,
        tenant_id=tenant_id,
        type=callbacks.BUDGET_THRESHOLD,
        subject=f"tenants/{name}/budget/{period}",
        data={
            "tenant": name,
            "period": period,
            "periodStart": _period_start(period, at.date()).isoformat(),
            "threshold": threshold,
            "spent": shown,
            "limit": str(limit),
            "currency": money.currency,
            "message": message,
        },
        at=at,
        key=f"{period}/{_period_start(period, at.date()).isoformat()}/{threshold}",
    )


# --- admission ------------------------------------------------------------------------------


def check_pod(session: Session, *, tenant_id: int | None, pod: str, today: date) -> None:
    """Refuse a new pod (403, the budget named) while one of its tenant's limits is reached,
    by the last meter reading. Reads at most two rows per transaction."""
    if tenant_id is None:
        return
    own = quotas.tenant_row(session, tenant_id)
    if own is None or not own[1]:
        return
    limits = limits_of(own[1])
    if not limits:
        return
    cache = session.info.setdefault("tenant_spend", {})
    if tenant_id not in cache:
        cache[tenant_id] = (
            session.execute(select(spend_t).where(spend_t.c.tenant_id == tenant_id))
            .mappings()
            .first()
        )
    row = cache[tenant_id]
    if row is None:
        return
    for period, limit in limits.items():
        if _period_start(period, row["day"]) != _period_start(period, today):
            continue  # the reading is of a period that ended
        spent = _spent(period, 0 if row["day"] != today else row["day_minor"], row["month_minor"])
        digits = row["minor_digits"]
        if spent >= to_minor(limit, digits):
            raise Forbidden(
                f'pods "{pod}" is forbidden: exceeded budget: tenant {own[0]} {period} spend '
                f"limit {limit} {row['currency']} reached (spent "
                f"{format(from_minor(spent, digits), 'f')}); new pods are refused until the "
                f"{'day' if period == DAILY else 'month'} ends (UTC) or the limit is raised",
                ref=ResourceRef("pods", pod),
            )


# --- the Tenant object ----------------------------------------------------------------------


def status(session: Session, tenant: Tenant, *, money: Money, today: date) -> dict[str, Any]:
    """The Tenant's status: its quota's hard and used, its spend by the last meter reading and
    the limits in force."""
    spec = tenant.spec or {}
    out: dict[str, Any] = {}
    hard = (spec.get("quota") or {}).get("hard")
    if hard:
        out["quota"] = quotas.tenant_status(session, tenant.id, hard)
    limits = limits_of(spec)
    if limits:
        row = (
            session.execute(select(spend_t).where(spend_t.c.tenant_id == tenant.id))
            .mappings()
            .first()
        )
        spend_status: dict[str, Any] = {
            "currency": money.currency,
            "limits": {p: str(v) for p, v in limits.items()},
        }
        if row is not None:
            day = row["day_minor"] if row["day"] == today else 0
            month = row["month_minor"] if month_start(row["day"]) == month_start(today) else 0
            spend_status.update(
                today=format(from_minor(day, money.minor_digits), "f"),
                thisMonth=format(from_minor(month, money.minor_digits), "f"),
                meteredAt=timestamp(row["computed_at"]),
            )
            reached = [
                p
                for p, v in limits.items()
                if (day if p == DAILY else month) >= to_minor(v, money.minor_digits)
            ]
            if reached:
                spend_status["reached"] = reached
        out["spend"] = spend_status
    return out
