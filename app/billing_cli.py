"""`tessera usage`, `tessera statement` and `tessera billing audit`: the billing API's reports,
read straight from the database as the other operator commands are.

Usage prints a table (plain columns, as kubectl's) or writes CSV or JSON, and draws spend over time by resource as a
PNG (`--plot FILE`). Every query goes through the same checks and code as the HTTP API
(`app.billing_api.service`), so the command and `GET .../usage` always agree.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from billing.rating import RESOURCES, UNITS
from billing.reports import Row, csv_header, csv_row, fmt_amount, row_json

if TYPE_CHECKING:  # imported where used: the API's service pulls in FastAPI and SQLAlchemy
    from app.billing_api import service

billing_app = typer.Typer(
    help="Billing: the audit of the ledger, and credits.", no_args_is_help=True
)

FORMATS = ("table", "csv", "json")


def _context() -> tuple[Any, service.Money]:
    from app.billing_api import service
    from app.cli import _db, _settings

    settings = _settings()
    return _db(settings), service.Money(settings.billing_currency, settings.billing_minor_digits)


def _tenant_id(session: Any, tenant: str | None) -> int | None:
    from app.billing_api import service

    return None if tenant is None else service.tenant_id(session, tenant)


def _warn_unpriced(db: Any, *, start: datetime, end: datetime, currency: str) -> None:
    """Say so, on stderr, when part of [start, end), in which usage was rated at 0, had no price
    list in effect (a new installation that loaded none, or usage from before the first)."""
    from sqlalchemy import func, select

    from app.db.models import PriceVersion

    first = db.read(lambda s: s.scalar(select(func.min(PriceVersion.effective_from))))
    if first is not None and first <= start:
        return
    if first is None or first >= end:
        what = "no price list is in effect: all usage here is rated at 0"
    else:
        what = f"no price list was in effect before {first:%Y-%m-%d %H:%M:%S} UTC: usage before it is rated at 0"
    typer.secho(
        f"warning: {what} {currency}. Add one (kind: Price, billing.tessera.io/v1) with "
        "`kubectl create -f prices.yaml` as the admin, e.g. examples/demo-price.yaml.",
        fg=typer.colors.YELLOW,
        err=True,
    )


def _check_format(output: str) -> None:
    from app.cli import _fail

    if output not in FORMATS:
        _fail(f'--output "{output}": one of {", ".join(FORMATS)}')


def usage(
    tenant: Annotated[str | None, typer.Option(help="One tenant (default: all of them).")] = None,
    namespace: Annotated[str | None, typer.Option(help="One namespace.")] = None,
    pod: Annotated[str | None, typer.Option(help="One pod of --namespace, by name.")] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="RFC 3339; default: the start of today (UTC).")
    ] = None,
    end: Annotated[str | None, typer.Option("--to", help="RFC 3339; default: now.")] = None,
    granularity: Annotated[str, typer.Option(help="second, minute, hour or day.")] = "hour",
    group_by: Annotated[
        str,
        typer.Option(help="Comma-separated: pod, namespace, resource, class, qos, gpuModel."),
    ] = "resource",
    output: Annotated[str, typer.Option("--output", "-o", help="table, csv or json.")] = "table",
    plot: Annotated[
        Path | None, typer.Option(help="Also draw spend over time by resource (PNG).")
    ] = None,
) -> None:
    """Usage by time bucket and group: quantities in unit-seconds and amounts at list price."""
    from app.cli import _fail, _run
    from app.kube.meta import now

    _check_format(output)
    if pod is not None and namespace is None:
        _fail("--pod needs --namespace (a pod's name is unique only within its namespace)")
    from app.billing_api import service

    db, money = _context()
    at = now()
    # A plot needs amounts per resource whatever the rows are grouped by.
    keys = group_by if plot is None or "resource" in group_by.split(",") else group_by + ",resource"

    def read(session: Any) -> tuple[service.ReportQuery, list[Row]]:
        query = service.report_query(
            start=start, end=end, granularity=granularity, group_by=keys, at=at
        )
        report = service.usage_report(
            session,
            query=query,
            tenant_id=_tenant_id(session, tenant),
            namespace=namespace,
            money=money,
            at=at,
            pod=pod,
        )
        return query, list(report.rows)

    query, rows = _run(lambda: db.read(read))
    unrated = [row.start for row in rows if row.amount == 0 and any(row.quantities.values())]
    if unrated:
        _warn_unpriced(db, start=min(unrated), end=query.end, currency=money.currency)
    if plot is not None:
        _plot_spend(rows, query, money, plot)
    if output == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(csv_header(query.group_by))
        writer.writerows(csv_row(row, query.group_by) for row in rows)
    elif output == "json":
        total = sum((row.amount for row in rows), Decimal(0))
        document = {
            "currency": money.currency,
            "from": query.start.isoformat(),
            "to": query.end.isoformat(),
            "granularity": query.granularity,
            "groupBy": list(query.group_by),
            "items": [row_json(row, query.group_by) for row in rows],
            "total": {"amount": fmt_amount(total)},
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        _usage_table(rows, query, money)
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def _usage_table(rows: list[Row], query: service.ReportQuery, money: service.Money) -> None:
    used = [r for r in RESOURCES if any(r in row.quantities for row in rows)]
    total = sum((row.amount for row in rows), Decimal(0))
    blanks = [""] * (len(query.group_by) + len(used))
    _print_table(
        f"Usage {query.start:%Y-%m-%d %H:%M} to {query.end:%Y-%m-%d %H:%M} UTC "
        f"by {query.granularity}",
        ["Start", *query.group_by, *(f"{r} ({UNITS[r]})" for r in used), "Amount"],
        [
            [
                f"{row.start:%Y-%m-%d %H:%M:%S}",
                *(value or "" for value in row.group),
                *(_quantity(row.quantities.get(r)) for r in used),
                fmt_amount(row.amount),
            ]
            for row in rows
        ],
        total=["Total", *blanks, fmt_amount(total)],
        right_from=1 + len(query.group_by),
        caption=f"quantities in unit-seconds; amounts in {money.currency} at list price",
    )


def _print_table(
    title: str,
    headers: list[str],
    rows: list[list[str]],
    *,
    total: list[str] | None = None,
    right_from: int,
    caption: str | None = None,
) -> None:
    """Plain aligned columns, as kubectl prints them: the columns from `right_from` on (amounts,
    quantities) aligned right. A table library costs a fifth of a second to import and draw,
    more than the query behind the table. Names are upper case, their units as given."""
    shown = [headers, *rows, *([total] if total else [])]
    widths = [max(len(row[i]) for row in shown) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "   ".join(
            cell.rjust(widths[i]) if i >= right_from else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    named = [h.partition(" (")[0].upper() + h[len(h.partition(" (")[0]) :] for h in headers]
    out = [title, line(named), *(line(row) for row in rows)]
    if total:
        out += ["-" * len(line(headers)), line(total)]
    if caption:
        out.append(caption)
    typer.echo("\n".join(out))


def _quantity(value: Decimal | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _plot_spend(
    rows: list[Row], query: service.ReportQuery, money: service.Money, path: Path
) -> None:
    """Stacked bars of the amount per bucket, one colour per resource; each bar is as wide as its
    bucket, so a single hour reads as well as a month of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    index = query.group_by.index("resource")
    buckets = sorted({(row.start, row.end) for row in rows})
    spend: dict[str, dict[datetime, float]] = defaultdict(dict)
    for row in rows:
        resource = row.group[index] or "other"
        spend[resource][row.start] = spend[resource].get(row.start, 0.0) + float(row.amount)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    lefts = [mdates.date2num(start) for start, _ in buckets]
    widths = [(end - start).total_seconds() / 86400 for start, end in buckets]
    bottom = [0.0] * len(buckets)
    for resource in [r for r in RESOURCES if r in spend] + sorted(set(spend) - set(RESOURCES)):
        heights = [spend[resource].get(start, 0.0) for start, _ in buckets]
        ax.bar(lefts, heights, widths, bottom=bottom, align="edge", label=resource)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    if buckets:
        ax.legend(loc="upper left", fontsize="small")
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_title(f"Spend by resource, per {query.granularity} (list price)")
    ax.set_ylabel(money.currency)
    ax.set_xlabel("UTC")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def statement(
    tenant: Annotated[str, typer.Argument(help="The tenant.")],
    day: Annotated[
        str | None, typer.Argument(help="YYYY-MM-DD (default: every statement the tenant has).")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, csv or json.")] = "table",
    month: Annotated[
        str | None,
        typer.Option(
            help="YYYY-MM: what the month's usage came to at list price, what was owed for it "
            "and what the plan saved (negative: cost above list price), instead."
        ),
    ] = None,
) -> None:
    """A tenant's daily statements: closed days as they were closed, open days provisional."""
    from app.billing_api import service
    from app.cli import _run
    from app.kube.meta import now

    _check_format(output)
    db, money = _context()
    at = now()
    if month is not None:
        _month_summary(db, money, tenant, month, output, at)
        return

    def read(session: Any) -> list[dict[str, Any]]:
        tenant_id = service.tenant_id(session, tenant)
        if day is None:
            return service.list_statements(
                session, tenant_id=tenant_id, namespace=tenant, money=money, at=at
            )
        return [service.get_statement(session, namespace=tenant, name=day, money=money, at=at)]

    statements = _run(lambda: db.read(read))
    unrated = sorted(
        obj["status"]["day"] for obj in statements if Decimal(obj["status"]["total"]) == 0
    )
    if unrated:
        first_day = datetime.fromisoformat(f"{unrated[0]}T00:00:00+00:00")
        _warn_unpriced(db, start=first_day, end=at, currency=money.currency)
    if output == "json":
        typer.echo(json.dumps(statements, indent=2, default=str))
        return
    if output == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["day", "phase", "kind", "description", "amount", "currency"])
        for obj in statements:
            st = obj["status"]
            for line in st["lines"]:
                fields = (line["kind"], line["description"], line["amount"], st["currency"])
                writer.writerow([st["day"], st["phase"], *fields])
            writer.writerow([st["day"], st["phase"], "total", "", st["total"], st["currency"]])
        return
    if not statements:
        typer.echo(f"{tenant} has no statements yet")
    for obj in statements:
        st = obj["status"]
        _print_table(
            f"{tenant} {st['day']} ({st['phase']})",
            ["Line", "Description", f"Amount ({st['currency']})"],
            [[line["kind"], line["description"], line["amount"]] for line in st["lines"]],
            total=["Total", "", st["total"]],
            right_from=2,
        )


def _month_summary(db: Any, money: Any, tenant: str, month: str, output: str, at: Any) -> None:
    from datetime import date

    from app.billing_api import service
    from app.cli import _fail, _run

    try:
        first = date.fromisoformat(f"{month}-01")
    except ValueError:
        _fail(f'--month "{month}": give a month as YYYY-MM')
    summary = _run(
        lambda: db.read(
            lambda s: service.month_summary(
                s,
                tenant_id=service.tenant_id(s, tenant),
                namespace=tenant,
                month=first,
                money=money,
                at=at,
            )
        )
    )
    if output == "json":
        typer.echo(json.dumps(summary, indent=2))
        return
    if output == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(list(summary))
        writer.writerow(list(summary.values()))
        return
    saved = Decimal(summary["savings"])
    typer.echo(
        f"{tenant} {summary['month']} ({summary['days']} days with statements): usage at list "
        f"price {summary['listPrice']} {summary['currency']}, owed {summary['owed']}; "
        + (f"the plan saved {saved}" if saved >= 0 else f"the plan cost {-saved} above list price")
    )


@billing_app.command("audit")
def audit(
    tenant: Annotated[str | None, typer.Option(help="One tenant (default: all of them).")] = None,
) -> None:
    """The ledger against the pod history and what nodes reported: every bind and deletion has
    its usage event; billed seconds equal held seconds per pod (its node's silences aside); no
    pod billed past the end its node reported, past its deletion's grace deadline or past the
    last renewal of its lost node; every day due to close that has a commitment or usage has its
    closed statement. Exit code 1 on any problem."""
    from datetime import timedelta

    from app.cli import _run, _settings
    from app.kube.meta import now
    from billing import ledger

    db, _ = _context()
    delay = timedelta(seconds=_settings().billing_close_delay_seconds)
    at = now()
    result = _run(
        lambda: db.read(
            lambda s: ledger.audit(s, at=at, tenant_id=_tenant_id(s, tenant), close_delay=delay),
        )
    )
    for problem in result.problems:
        typer.secho(f"problem: {problem}", fg=typer.colors.RED, err=True)
    typer.echo(
        f"{result.pods} pods, {result.billed_seconds} s billed, {result.held_seconds} s held: "
        + ("complete" if result.ok else f"{len(result.problems)} problems")
    )
    if not result.ok:
        raise typer.Exit(1)


@billing_app.command("credit")
def credit(
    start: Annotated[str, typer.Option("--from", help="RFC 3339: the window's start.")],
    end: Annotated[str, typer.Option("--to", help="RFC 3339: the window's end (exclusive).")],
    reason: Annotated[str, typer.Option(help="Shown on the statements (at most 200 chars).")],
    tenant: Annotated[str | None, typer.Option(help="One tenant (default: every tenant).")] = None,
) -> None:
    """Credit a window of time (an outage) to every tenant, or one: its usage in the window at
    list price comes off the statements of its days (on a day with a plan, at most that day's
    overage; never more than a day owes), as a line of its own. A new ledger entry, never an
    edit: a credit of a day already closed goes on the next statement."""
    from app.cli import _fail, _run
    from app.kube.meta import now
    from billing import ledger
    from billing.prices import parse_time

    causes: list[tuple[str, str]] = []
    lo = parse_time(start, "--from", causes)
    hi = parse_time(end, "--to", causes)
    if not causes and hi <= lo:
        causes.append(("--to", "must be later than --from"))
    if not reason.strip() or len(reason) > 200:
        causes.append(("--reason", "say why, in at most 200 characters"))
    if causes:
        _fail("; ".join(f"{field}: {message}" for field, message in causes))
    db, _ = _context()
    written = _run(
        lambda: db.write(
            lambda s: ledger.record_credit(
                s,
                tenant_id=_tenant_id(s, tenant),
                start=lo,
                end=hi,
                reason=reason.strip(),
                at=now(),
            )
        )
    )
    typer.echo(
        f"credit {written['id']}: {start} to {end} for {tenant or 'every tenant'}: {reason.strip()}"
    )
