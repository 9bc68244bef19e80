"""An operator's credit of an outage window, and a month's summary of what a plan saved, on a
fresh database of each backend (a price in effect days ago would change every other test's
book): a credit is a ledger entry shown as a statement line, never an edit; one of a day
already closed goes on the next statement, once."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from typer.testing import CliRunner

from app.auth import service as auth
from app.billing_api import service
from app.bootstrap import bootstrap
from app.cli import cli
from app.db.engine import Database
from app.inventory import service as inventory
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from billing import ledger
from tests.api.test_billing_api import price_body
from tests.billing.helpers import Clock
from tests.factories import pod as manifest
from tests.scheduler.test_loop import create

pytestmark = pytest.mark.parametrize("fresh_database_url", ["sqlite", "postgresql"], indirect=True)
MONEY = service.Money("USD", 2)
D = (datetime.now(UTC) - timedelta(days=4)).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def fresh(fresh_database_url: str) -> Iterator[Database]:
    db = Database(fresh_database_url)
    bootstrap(db)
    # 1 per vCPU-hour (memory free): a pod of 1 vCPU costs 0.001 a second... x 3.6
    body = price_body("p", D - timedelta(days=1), vcpu="3.6", memory="0")
    db.write(lambda s: service.create_price(s, body=body, money=MONEY, at=D - timedelta(days=2)))
    yield db
    db.dispose()


def _tenant(db: Database, name: str) -> NamespaceInfo:
    tenant = db.write(lambda s: auth.create_tenant(s, name=name))
    return NamespaceInfo(name, tenant.id, False)


def _ran(db: Database, monkeypatch: pytest.MonkeyPatch, ns: NamespaceInfo, hours: int) -> None:
    """A pod of 1 vCPU from midnight of D for `hours`."""
    clock = Clock()
    clock.at = D
    monkeypatch.setattr(pods, "now", clock)
    node = f"n-{ns.name}"
    spec = inventory.NodeSpec(node, 64000, 262144, compute_classes=("general-purpose",))
    db.write(lambda s: inventory.create_node(s, spec))
    create(db, ns, manifest("job", cpu="1", memory="1Gi"))
    bound = db.write(lambda s: pods.bind(s, namespace=ns.name, name="job", node_name=node, gpus=[]))
    clock.move(hours * 3600)
    db.write(lambda s: pods.delete(s, namespace=ns.name, name="job", grace_seconds=0))
    assert bound["spec"]["nodeName"] == node


def _close(db: Database, tenant_id: int, day: datetime) -> dict[str, Any]:
    row, _ = db.write(
        lambda s: ledger.close_day(
            s,
            tenant_id=tenant_id,
            day=day.date(),
            at=datetime.now(UTC),
            currency="USD",
            minor_digits=2,
        )
    )
    return dict(row)


def _credits(statement: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (line["day"], line["amount"]) for line in statement["lines"] if line["kind"] == "credit"
    ]


def test_a_credit_is_its_own_line_and_one_of_a_closed_day_goes_on_the_next(
    fresh: Database,
    monkeypatch: pytest.MonkeyPatch,
    fresh_database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = fresh
    ns, other = _tenant(db, "acme"), _tenant(db, "other")
    _ran(db, monkeypatch, ns, hours=12)  # 43,200 vCPU-s: 43.20
    env = {"TESSERA_DATABASE_URL": fresh_database_url}
    outage = (D + timedelta(hours=6), D + timedelta(hours=8))
    done = CliRunner().invoke(
        cli,
        ["billing", "credit", "--from", f"{outage[0]:%Y-%m-%dT%H:%M:%SZ}",
         "--to", f"{outage[1]:%Y-%m-%dT%H:%M:%SZ}", "--reason", "control plane outage"],
        env=env,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "every tenant" in done.output

    with caplog.at_level(logging.WARNING, logger="tessera.billing"):
        closed = _close(db, ns.tenant_id, D)
    # the price book makes memory free: closing the day says so
    assert "usage of memory rated at a price of 0" in caplog.text
    assert "usage of vcpu" not in caplog.text
    assert _credits(closed) == [(D.date().isoformat(), "-7.20")]  # two hours of 1 vCPU
    assert closed["total_minor"] == 36_00  # 43.20 - 7.20
    assert any("control plane outage" in line["description"] for line in closed["lines"])
    assert _close(db, other.tenant_id, D)["total_minor"] == 0  # nothing used: nothing credited

    # A credit of D after it closed: on the next statement, naming D, once; D never changes.
    db.write(
        lambda s: ledger.record_credit(
            s,
            tenant_id=ns.tenant_id,
            start=D + timedelta(hours=10),
            end=D + timedelta(hours=11),
            reason="node pool outage",
            at=datetime.now(UTC),
        )
    )
    following = _close(db, ns.tenant_id, D + timedelta(days=1))
    assert _credits(following) == [(D.date().isoformat(), "-3.60")]
    assert not [line for line in following["lines"] if line["kind"] == "adjustment"]
    assert following["total_minor"] == -3_60
    assert _credits(_close(db, ns.tenant_id, D + timedelta(days=2))) == []
    assert _close(db, ns.tenant_id, D)["total_minor"] == 36_00
    problems = db.read(
        lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=ns.tenant_id).problems
    )
    assert problems == []


def test_a_month_shows_what_a_plan_saved_or_cost(
    fresh: Database, monkeypatch: pytest.MonkeyPatch, fresh_database_url: str
) -> None:
    """A 50/day plan (10 % off) from D: D used 43.20 at list price (owed 50.00, 6.80 more);
    every later day used nothing (owed 50.00 each, 50.00 more)."""
    db = fresh
    ns = _tenant(db, "planner")
    db.write(
        # the plan's term as its create writes it (app/registry/kinds/commitments.py), made then
        lambda s: service.add_term(
            s, tenant_id=ns.tenant_id, amount_minor=5000, at=D - timedelta(hours=1)
        )
    )
    _ran(db, monkeypatch, ns, hours=12)
    now = datetime.now(UTC)
    summaries = {}
    for month in {D.date().replace(day=1), now.date().replace(day=1)}:
        summaries[month] = db.read(
            lambda s, m=month: service.month_summary(
                s, tenant_id=ns.tenant_id, namespace=ns.name, month=m, money=MONEY, at=now
            )
        )
    days = sum(s["days"] for s in summaries.values())
    assert days == (now.date() - D.date()).days + 1
    assert sum(Decimal(s["listPrice"]) for s in summaries.values()) == Decimal("43.20")
    assert sum(Decimal(s["owed"]) for s in summaries.values()) == 50 * days
    assert sum(Decimal(s["savings"]) for s in summaries.values()) == Decimal("43.20") - 50 * days
    # the plan's status, as a read of the Commitment shows it
    plan = db.read(lambda s: service.plan_status(s, tenant_id=ns.tenant_id, money=MONEY, at=now))
    assert plan["thisMonth"] == summaries[now.date().replace(day=1)]
    # the operator's command says the same
    month = D.date().replace(day=1)
    env = {"TESSERA_DATABASE_URL": fresh_database_url}
    done = CliRunner().invoke(
        cli, ["statement", "planner", "--month", f"{month:%Y-%m}", "-o", "json"], env=env
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == summaries[month]
    done = CliRunner().invoke(cli, ["statement", "planner", "--month", f"{month:%Y-%m}"], env=env)
    assert "the plan cost" in done.output and "above list price" in done.output
