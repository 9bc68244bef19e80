"""Billing objects as the API serves them (`billing.tessera.io/v1`): the price book, a tenant's
commitment plan, its daily statements, and usage reports.

The numbers come from the pure modules in `billing/` and the ledger (`billing.ledger`); this
module only reads and writes the rows behind the objects and checks what a request may change:
- a Price version is immutable, takes effect at `spec.effectiveFrom` (by default the moment it
  is created), which may not be in the past (a price change never reaches back into usage
  already charged), and may be deleted only until it takes effect;
- a tenant has at most one Commitment (a kind of the registry, app/registry/kinds/commitments.py,
  whose amounts and status are computed here); a new plan starts at the next UTC day, a raise
  of the active plan counts from today, a lowering or an end from tomorrow
  (`billing.commitments`);
- Statements are read-only: the closed ones as written, the open days (today, and a day that
  is over but not yet closed) computed from the ledger as it is now, marked provisional.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.constants import BILLING_GROUP
from app.db.engine import insert_unless_exists, next_resource_version
from app.db.models import CommitmentTerm, PriceVersion, Statement, Tenant, table
from app.errors import AlreadyExists, Cause, Conflict, NotFound, ResourceRef, invalid
from app.kube.meta import timestamp, validate_annotations, validate_labels, validate_name
from billing import ledger
from billing import prices as price_lists
from billing.commitments import Term, amount_on, change, discount_for
from billing.prices import PriceBook, PriceError
from billing.reports import (
    GRANULARITIES,
    GROUP_BY,
    MAX_RANGE,
    MAX_SECOND_RANGE,
    Row,
    aggregate,
    carried,
)
from billing.statements import DayStatement, Line, from_minor
from billing.tally import TallyKey, Units
from billing.usage import whole_second

if TYPE_CHECKING:  # the CLI's reports need no namespaces, authorization or registry
    pass

API_VERSION = f"{BILLING_GROUP}/v1"
prices_t = table(PriceVersion)
terms_t = table(CommitmentTerm)
statements_t = table(Statement)
DAY = timedelta(days=1)
MAX_COMMITMENT = Decimal(10**9)  # per day, in the currency
OPEN_DAYS = 31  # at most this many unclosed days are listed as provisional statements


@dataclass(frozen=True)
class Money:
    currency: str
    minor_digits: int


def _meta_causes(metadata: Mapping[Any, Any], *, label_name: bool = False) -> list[Cause]:
    name = metadata.get("name") or ""
    return (
        validate_name(name, "metadata.name", label=label_name)
        + validate_labels(metadata.get("labels") or {}, "metadata.labels")
        + validate_annotations(metadata.get("annotations") or {}, "metadata.annotations")
    )


# --- prices ---------------------------------------------------------------------------------


def _before(session: Session, effective: datetime, currency: str) -> price_lists.PriceList | None:
    """The version in effect just before `effective`."""
    row = session.execute(
        select(prices_t.c.name, prices_t.c.spec)
        .where(prices_t.c.effective_from < effective)
        .order_by(prices_t.c.effective_from.desc())
        .limit(1)
    ).first()
    return price_lists.parse(row.name, row.spec, currency=currency) if row is not None else None


def create_price(
    session: Session, *, body: Mapping[Any, Any], money: Money, at: datetime
) -> dict[str, Any]:
    """A new version; its `status.warnings` (a rate of 0, a jump of more than 10x from the
    version before) are the answer's Warning headers too. Called in a dry run, it writes
    nothing but answers the same."""
    metadata = body.get("metadata") or {}
    name = metadata.get("name") or ""
    causes = _meta_causes(metadata, label_name=True)
    spec = body.get("spec")
    parsed = None
    if not isinstance(spec, Mapping):
        causes.append(Cause("spec", "Required value: the price list"))
    else:
        if spec.get("effectiveFrom") is None:  # in effect from the moment it is created
            spec = {**spec, "effectiveFrom": timestamp(whole_second(at))}
        try:
            parsed = price_lists.parse(name, spec, currency=money.currency)
        except PriceError as error:
            causes += [Cause(field, message) for field, message in error.causes]
    if parsed is not None and parsed.effective_from < whole_second(at):
        causes.append(
            Cause(
                "spec.effectiveFrom",
                f'Invalid value: "{timestamp(parsed.effective_from)}": in the past; a price '
                "change never reaches back into usage already charged: give a time from now on",
            )
        )
    if causes or parsed is None:
        raise invalid("Price", name, causes, group=BILLING_GROUP)
    clash = session.scalar(
        select(prices_t.c.name).where(prices_t.c.effective_from == parsed.effective_from)
    )
    if clash is not None:
        raise invalid(
            "Price",
            name,
            [
                Cause(
                    "spec.effectiveFrom",
                    f'Duplicate value: price "{clash}" takes effect at the same instant; '
                    "delete it first if it is not in effect yet, or pick another time",
                    "FieldValueDuplicate",
                )
            ],
            group=BILLING_GROUP,
        )
    values = {
        "name": name,
        "uid": str(uuid.uuid4()),
        "resource_version": next_resource_version(session),
        "created_at": at,
        "effective_from": parsed.effective_from,
        "labels": dict(metadata.get("labels") or {}),
        "annotations": dict(metadata.get("annotations") or {}),
        "spec": price_lists.to_spec(parsed),
    }
    if not insert_unless_exists(session, prices_t, values):
        raise AlreadyExists(
            f'prices.{BILLING_GROUP} "{name}" already exists: a price version never changes; '
            "create a new one with a later effectiveFrom",
            ref=ResourceRef("prices", name, BILLING_GROUP),
        )
    obj = _strip_none(price_to_api(values, _in_effect(session, at), at))
    obj["status"]["warnings"] = price_lists.warnings(
        parsed, _before(session, parsed.effective_from, money.currency)
    )
    return obj


def _in_effect(session: Session, at: datetime) -> str | None:
    """The name of the price version in effect at `at`."""
    return session.scalar(
        select(prices_t.c.name)
        .where(prices_t.c.effective_from <= at)
        .order_by(prices_t.c.effective_from.desc())
        .limit(1)
    )


def price_to_api(row: Mapping[Any, Any], in_effect: str | None, at: datetime) -> dict[str, Any]:
    effective: datetime = row["effective_from"]
    if row["name"] == in_effect:
        phase = "Active"
    elif effective > at:
        phase = "Scheduled"
    else:
        phase = "Superseded"
    return {
        "apiVersion": API_VERSION,
        "kind": "Price",
        "metadata": {
            "name": row["name"],
            "uid": row["uid"],
            "resourceVersion": str(row["resource_version"]),
            "creationTimestamp": timestamp(row["created_at"]),
            "labels": row["labels"] or None,
            "annotations": row["annotations"] or None,
        },
        "spec": row["spec"],
        "status": {"phase": phase},
    }


def _strip_none(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if v is not None}
    return obj


def list_prices(session: Session, *, at: datetime) -> list[dict[str, Any]]:
    current = _in_effect(session, at)
    rows = session.execute(select(prices_t).order_by(prices_t.c.effective_from)).mappings()
    out = []
    before: price_lists.PriceList | None = None
    for r in rows:
        obj = _strip_none(price_to_api(r, current, at))
        try:
            parsed = price_lists.parse(r["name"], r["spec"], currency=r["spec"]["currency"])
        except (PriceError, KeyError):  # a version written before a rule: shown as it is
            out.append(obj)
            continue
        obj["status"]["warnings"] = price_lists.warnings(parsed, before)
        before = parsed
        out.append(obj)
    return out


def _price_row(session: Session, name: str) -> Mapping[Any, Any]:
    row = session.execute(select(prices_t).where(prices_t.c.name == name)).mappings().first()
    if row is None:
        raise NotFound(
            f'prices.{BILLING_GROUP} "{name}" not found',
            ref=ResourceRef("prices", name, BILLING_GROUP),
        )
    return row


def get_price(session: Session, *, name: str, at: datetime) -> dict[str, Any]:
    return get_price_of(session, _price_row(session, name), at=at)


def get_price_of(session: Session, row: Mapping[Any, Any], *, at: datetime) -> dict[str, Any]:
    """The API object of a price row, with its warnings against the version before it."""
    name = row["name"]
    obj = _strip_none(price_to_api(row, _in_effect(session, at), at))
    currency = row["spec"].get("currency", "")
    try:
        parsed = price_lists.parse(name, row["spec"], currency=currency)
        before = _before(session, parsed.effective_from, currency)
    except PriceError:
        return obj
    obj["status"]["warnings"] = price_lists.warnings(parsed, before)
    return obj


def _same_rates(parsed: price_lists.PriceList, row: Mapping[Any, Any], money: Money) -> bool:
    """Whether a patched spec keeps a stored version's rates (`"0.10"` is `"0.1"`)."""
    try:
        return parsed == price_lists.parse(row["name"], row["spec"], currency=money.currency)
    except PriceError:  # a version written before a rule: only its exact form is the same
        return price_lists.to_spec(parsed) == row["spec"]


def update_price(
    session: Session, *, name: str, desired: Mapping[Any, Any], money: Money, at: datetime
) -> dict[str, Any]:
    """A PATCH of a price version (`kubectl apply` of its manifest again): its labels and
    annotations may change; its spec never does once written (usage may have been charged at
    it, and an audit reads the version it was charged at). A patch that leaves the spec as it is
    stored, or only writes it in another form (`"0.10"` for `"0.1"`), changes nothing else."""
    row = _price_row(session, name)
    metadata = desired.get("metadata") or {}
    ref = ResourceRef("prices", name, BILLING_GROUP)
    if metadata.get("name", name) != name:
        raise invalid(
            "Price",
            name,
            [Cause("metadata.name", "Invalid value: a price version cannot be renamed")],
            group=BILLING_GROUP,
        )
    version = metadata.get("resourceVersion")
    if version not in (None, "") and str(version) != str(row["resource_version"]):
        raise Conflict(
            f'Operation cannot be fulfilled on prices.{BILLING_GROUP} "{name}": the object has '
            "been modified; please apply your changes to the latest version and try again",
            ref=ref,
        )
    causes = _meta_causes(metadata, label_name=True)
    spec = desired.get("spec")
    if not isinstance(spec, Mapping):
        causes.append(Cause("spec", "Required value: the price list"))
    else:
        try:
            parsed = price_lists.parse(name, spec, currency=money.currency)
        except PriceError as error:
            causes += [Cause(field, message) for field, message in error.causes]
        else:
            if not _same_rates(parsed, row, money):
                hint = (
                    "delete it and create it again (it is not in effect yet)"
                    if row["effective_from"] > at
                    else "create a new version with a later effectiveFrom"
                )
                causes.append(
                    Cause(
                        "spec",
                        f"Forbidden: a price version never changes once written: to change "
                        f"prices, {hint}; labels and annotations may change",
                        "FieldValueForbidden",
                    )
                )
    if causes:
        raise invalid("Price", name, causes, group=BILLING_GROUP)
    labels = dict(metadata.get("labels") or {})
    annotations = dict(metadata.get("annotations") or {})
    values = dict(row)
    if (labels, annotations) != (row["labels"] or {}, row["annotations"] or {}):
        values.update(
            labels=labels,
            annotations=annotations,
            resource_version=next_resource_version(session),
        )
        session.execute(
            update(prices_t)
            .where(prices_t.c.name == name)
            .values(
                labels=labels,
                annotations=annotations,
                resource_version=values["resource_version"],
            )
        )
    return get_price_of(session, values, at=at)


def delete_price(session: Session, *, name: str, at: datetime) -> dict[str, Any]:
    row = _price_row(session, name)
    if row["effective_from"] <= at:
        raise Conflict(
            f'price "{name}" has been in effect since {timestamp(row["effective_from"])}: usage '
            "was charged at it, so it stays; to change prices, create a new version with a "
            "later effectiveFrom",
            ref=ResourceRef("prices", name, BILLING_GROUP),
        )
    obj = _strip_none(price_to_api(row, _in_effect(session, at), at))
    session.execute(delete(prices_t).where(prices_t.c.name == name))
    return obj


# --- commitments ----------------------------------------------------------------------------


def _amount(value: Any, money: Money, causes: list[Cause]) -> Decimal:
    field = "spec.amountPerDay"
    hint = f'a decimal string in {money.currency} such as "100.00"'
    if isinstance(value, bool) or not isinstance(value, str | int):
        causes.append(Cause(field, f"Required value: {hint}"))
        return Decimal(0)
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        causes.append(Cause(field, f'Invalid value: "{value}": not a number; give {hint}'))
        return Decimal(0)
    if not amount.is_finite() or amount <= 0 or amount > MAX_COMMITMENT:
        causes.append(
            Cause(field, f'Invalid value: "{value}": must be above 0 and at most {MAX_COMMITMENT}')
        )
        return Decimal(0)
    if amount.as_tuple().exponent < -money.minor_digits:  # type: ignore[operator]
        causes.append(
            Cause(
                field,
                f'Invalid value: "{value}": at most {money.minor_digits} decimal places '
                f"({money.currency})",
            )
        )
    return amount


def _terms(session: Session, tenant_id: int) -> list[Term]:
    return ledger.commitment_terms(session, tenant_id)


def add_term(session: Session, *, tenant_id: int, amount_minor: int, at: datetime) -> date:
    """The tenant's plan becomes `amount_minor` per day (0: no plan): from today for a raise of
    the plan active today, else from tomorrow (`billing.commitments.change`). Returns that day."""
    today = at.date()
    terms = _terms(session, tenant_id)
    day = change(today, terms, Decimal(amount_minor))  # terms hold minor units too
    # The latest change wins: a change pending for a later day is replaced by this one.
    days = {day} | {t.effective_day for t in terms if t.effective_day > day}
    session.execute(
        terms_t.insert(),
        [
            {
                "tenant_id": tenant_id,
                "effective_day": d,
                "amount_minor": amount_minor,
                "recorded_at": at,
            }
            for d in sorted(days)
        ],
    )
    return day


def amount_causes(value: Any, money: Money) -> tuple[Decimal, list[Cause]]:
    """A plan's `spec.amountPerDay` as a Decimal, and what is wrong with it."""
    causes: list[Cause] = []
    return _amount(value, money, causes), causes


def plan_status(session: Session, *, tenant_id: int, money: Money, at: datetime) -> dict[str, Any]:
    """A plan's status as of `at`: the amount active today and its discount, this month's
    savings so far, and a change that takes effect tomorrow."""
    today = at.date()
    terms = _terms(session, tenant_id)
    active = amount_on(today, terms)
    book = ledger.price_book(session, currency=money.currency)
    prices = book.at(ledger.day_start(today))
    tiers = prices.tiers if prices else ()
    status: dict[str, Any] = {
        "currency": money.currency,
        "activeAmountPerDay": _money(active, money),
        "discount": format(discount_for(from_minor(int(active), money.minor_digits), tiers), "f"),
    }
    tenant = session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))
    if tenant is not None:
        # what the plan saved (or cost above list price) over this month so far
        status["thisMonth"] = month_summary(
            session, tenant_id=tenant_id, namespace=tenant, month=today, money=money, at=at
        )
    tomorrow = today + DAY  # changes take effect today or tomorrow, never later
    following = amount_on(tomorrow, terms)
    if following != active:
        status["nextChange"] = {
            "day": tomorrow.isoformat(),
            "amountPerDay": _money(following, money),
        }
    return status


def amount_text(minor: int, money: Money) -> str:
    """An amount in minor units as the API writes it: "100.00" for 10000 in USD."""
    return _money(Decimal(minor), money)


def _money(minor: Decimal, money: Money) -> str:
    return format(from_minor(int(minor), money.minor_digits), "f")


# --- statements -----------------------------------------------------------------------------


def tenant_id(session: Session, name: str) -> int:
    found = session.scalar(select(Tenant.id).where(Tenant.name == name))
    if found is None:
        raise NotFound(f'tenants "{name}" not found', ref=ResourceRef("tenants", name))
    return found


def _tenant_of(session: Session, namespace: str) -> int | None:
    """Statements are a tenant's: they live in the namespace named after it."""
    return session.scalar(select(Tenant.id).where(Tenant.name == namespace))


def _open_days(session: Session, tenant_id: int, today: date) -> list[date]:
    """Days not closed yet that have usage or a plan: from the day after the last closed one
    (or the first usage) to today, at most OPEN_DAYS of them."""
    latest = session.scalar(
        select(func.max(statements_t.c.day)).where(statements_t.c.tenant_id == tenant_id)
    )
    first = latest + DAY if latest is not None else ledger.first_day(session, tenant_id)
    if first is None:
        return []
    first = max(first, today - (OPEN_DAYS - 1) * DAY)
    days = []
    while first <= today:
        days.append(first)
        first += DAY
    return days


def _statement(
    *,
    namespace: str,
    day: date,
    lines: Sequence[dict[str, Any]],
    total_minor: int,
    money: Money,
    closed_at: datetime | None,
    uid: str = "",
    resource_version: int = 0,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": day.isoformat(), "namespace": namespace}
    if uid:
        meta["uid"] = uid
        meta["resourceVersion"] = str(resource_version)
        meta["creationTimestamp"] = timestamp(closed_at)
    return {
        "apiVersion": API_VERSION,
        "kind": "Statement",
        "metadata": meta,
        "status": {
            "day": day.isoformat(),
            "phase": "Closed" if closed_at else "Provisional",
            "closedAt": timestamp(closed_at) if closed_at else None,
            "currency": money.currency,
            "total": format(from_minor(total_minor, money.minor_digits), "f"),
            "lines": list(lines),
        },
    }


def _closed_to_api(row: Mapping[Any, Any], money: Money) -> dict[str, Any]:
    return _statement(
        namespace=row["tenant"],
        day=row["day"],
        lines=row["lines"],
        total_minor=row["total_minor"],
        money=Money(row["currency"], money.minor_digits),
        closed_at=row["closed_at"],
        uid=row["uid"],
        resource_version=row["resource_version"],
    )


def _provisional(
    session: Session, *, tenant_id: int, namespace: str, day: date, money: Money, at: datetime
) -> dict[str, Any]:
    book = ledger.price_book(session, currency=money.currency)
    computed: DayStatement = ledger.compute_day(
        session, tenant_id=tenant_id, day=day, now=at, book=book, minor_digits=money.minor_digits
    )
    lines = [line.to_json(money.minor_digits) for line in computed.lines]
    return _statement(
        namespace=namespace,
        day=day,
        lines=lines,
        total_minor=computed.total_minor,
        money=money,
        closed_at=None,
    )


def list_statements(
    session: Session,
    *,
    tenant_id: int | None,
    namespace: str | None,
    money: Money,
    at: datetime,
) -> list[dict[str, Any]]:
    """Closed statements and the provisional ones of open days, of the tenant whose namespace
    is given, or across namespaces of every tenant the caller may see (`tenant_id` None: the
    admin, every tenant): the same statements either way, as a list across namespaces is the
    union of the namespaces' lists."""
    if namespace is not None:
        owner = _tenant_of(session, namespace)
        if owner is None or (tenant_id is not None and owner != tenant_id):
            return []
        tenant_id = owner
    query = select(statements_t).order_by(statements_t.c.tenant, statements_t.c.day)
    if tenant_id is not None:
        query = query.where(statements_t.c.tenant_id == tenant_id)
    out = [_closed_to_api(r, money) for r in session.execute(query).mappings()]
    owners = select(Tenant.id, Tenant.name).order_by(Tenant.name)
    if tenant_id is not None:
        owners = owners.where(Tenant.id == tenant_id)
    for owner_id, owner_name in session.execute(owners).all():
        out += [
            _provisional(
                session, tenant_id=owner_id, namespace=owner_name, day=day, money=money, at=at
            )
            for day in _open_days(session, owner_id, at.date())
        ]
    return out


def get_statement(
    session: Session, *, namespace: str, name: str, money: Money, at: datetime
) -> dict[str, Any]:
    missing = NotFound(
        f'statements.{BILLING_GROUP} "{name}" not found: statements are named by their UTC day '
        f"(YYYY-MM-DD) and live in the namespace named after the tenant",
        ref=ResourceRef("statements", name, BILLING_GROUP),
    )
    try:
        day = date.fromisoformat(name)
    except ValueError:
        raise missing from None
    tenant_id = _tenant_of(session, namespace)
    if tenant_id is None:
        raise missing
    row = ledger.closed_statement(session, tenant_id, day)
    if row is not None:
        return _closed_to_api(row, money)
    if day in _open_days(session, tenant_id, at.date()):
        return _provisional(
            session, tenant_id=tenant_id, namespace=namespace, day=day, money=money, at=at
        )
    raise missing


def month_summary(
    session: Session, *, tenant_id: int, namespace: str, month: date, money: Money, at: datetime
) -> dict[str, Any]:
    """What a tenant's usage of a UTC month (so far) came to at list price, what it owed for
    it, and what its plan saved (negative: cost above list price), from its daily statements,
    closed and provisional."""
    first = month.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    usage = owed_for_usage = savings = 0
    days = 0
    for obj in list_statements(
        session, tenant_id=tenant_id, namespace=namespace, money=money, at=at
    ):
        day = date.fromisoformat(obj["status"]["day"])
        if not first <= day < following:
            continue
        days += 1
        lines = statement_lines(obj, money.minor_digits)
        used = sum(line.amount_minor for line in lines if line.kind == "usage")
        saved = sum(line.amount_minor for line in lines if line.kind == "savings")
        usage += used
        savings += saved
        owed_for_usage += used - saved
    return {
        "month": first.strftime("%Y-%m"),
        "days": days,
        "currency": money.currency,
        "listPrice": format(from_minor(usage, money.minor_digits), "f"),
        "owed": format(from_minor(owed_for_usage, money.minor_digits), "f"),
        "savings": format(from_minor(savings, money.minor_digits), "f"),
    }


def statement_lines(obj: Mapping[Any, Any], minor_digits: int) -> list[Line]:
    return [Line.from_json(line, minor_digits) for line in obj["status"]["lines"]]


# --- usage reports --------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportQuery:
    start: datetime
    end: datetime
    granularity: str
    group_by: tuple[str, ...]


def report_query(
    *,
    start: str | None,
    end: str | None,
    granularity: str | None,
    group_by: str | None,
    at: datetime,
) -> ReportQuery:
    """The report's parameters, checked: every bad one is named with what would be accepted."""
    causes: list[tuple[str, str]] = []
    now = whole_second(at)
    lo = (
        price_lists.parse_time(start, "from", causes)
        if start is not None
        else datetime.combine(now.date(), datetime.min.time(), tzinfo=UTC)
    )
    hi = price_lists.parse_time(end, "to", causes) if end is not None else now
    step = granularity or "hour"
    if step not in GRANULARITIES:
        causes.append(
            ("granularity", f'Unsupported value: "{step}": one of {", ".join(GRANULARITIES)}')
        )
    # absent: by resource; "" : one row per bucket; otherwise every term named, none empty
    keys = (
        tuple((group_by if group_by is not None else "resource").split(","))
        if group_by != ""
        else ()
    )
    if any(not key for key in keys):
        causes.append(
            (
                "groupBy",
                f'Invalid value: "{(group_by or "")[:64]}": an empty term; a comma-separated list '
                f"of {', '.join(GROUP_BY)}",
            )
        )
        keys = tuple(key for key in keys if key)
    for key in keys:
        if key not in GROUP_BY:
            causes.append(
                (
                    "groupBy",
                    f'Unsupported value: "{key[:64]}": a comma-separated list of '
                    f"{', '.join(GROUP_BY)}",
                )
            )
    if len(set(keys)) != len(keys):
        causes.append(("groupBy", "Duplicate value: name each grouping once"))
    if not causes:
        if hi <= lo:
            causes.append(("to", "Invalid value: must be later than from"))
        elif hi - lo > MAX_RANGE:
            causes.append(("to", f"Invalid value: a report covers at most {MAX_RANGE.days} days"))
        elif step == "second" and hi - lo > MAX_SECOND_RANGE:
            causes.append(
                (
                    "to",
                    f"Invalid value: a per-second report covers at most {MAX_SECOND_RANGE.days} "
                    "days; ask for minute or coarser rows over a longer range",
                )
            )
    if causes:
        from app.errors import BadRequest

        raise BadRequest(
            "invalid usage report query: " + "; ".join(f"{f}: {m}" for f, m in causes),
            causes=[Cause(f, m) for f, m in causes],
        )
    return ReportQuery(lo, hi, step, keys)


@dataclass
class Report:
    rows: Iterator[Row]
    query: ReportQuery


def usage_report(
    session: Session,
    *,
    query: ReportQuery,
    tenant_id: int | None,
    namespace: str | None,
    money: Money,
    at: datetime,
    pod: str | None = None,
) -> Report:
    """Reads what the report needs in the caller's transaction; the rows are produced lazily
    afterwards (a long per-second report streams). `pod` names one pod of `namespace`."""
    scope: dict[str, Any] = {"start": query.start, "end": query.end}
    if tenant_id is not None:
        scope["tenant_id"] = tenant_id
    if namespace is not None:
        scope["namespace"] = namespace
    if pod is not None and namespace is not None:
        scope["pod_uid"] = ledger.pod_uid(session, namespace, pod) or ""  # "": no usage, no rows
    span: tuple[datetime, datetime] | None = None
    rolled: dict[TallyKey, Units] = {}
    by_hours = query.granularity in ("hour", "day") and "pod" not in query.group_by
    if tenant_id is not None and pod is None and by_hours:
        span, rolled = ledger.rolled_hours(
            session, tenant_id=tenant_id, namespace=namespace, start=query.start, end=query.end
        )
    if span is None or query.start < span[0]:
        segments = ledger.segments(session, **scope)
    elif span[1] < query.end:  # only the part after them
        segments = ledger.segments(session, **{**scope, "start": span[1]})
    else:
        segments = []
    book: PriceBook = ledger.price_book(session, currency=money.currency)
    rows = carried(
        aggregate(
            segments,
            book,
            start=query.start,
            end=query.end,
            now=whole_second(at),
            granularity=query.granularity,
            group_by=query.group_by,
            rolled=rolled,
            rolled_span=span,
        )
    )
    return Report(rows, query)
