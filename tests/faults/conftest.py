"""Every fault test ends with the billing audit (`billing.ledger.audit`, what `tessera billing
audit` runs) over the tenants the test made: a fault may end pods in any way, but never leave
the ledger incomplete or billing past what the nodes reported."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from app.db.engine import Database
from app.db.models import Tenant
from billing import ledger


def _database(request: pytest.FixtureRequest) -> Database | None:
    if "db" in request.fixturenames:
        return request.getfixturevalue("db")  # type: ignore[no-any-return]
    if "server" in request.fixturenames:
        return request.getfixturevalue("server").services.db  # type: ignore[no-any-return]
    return None


@pytest.fixture(autouse=True)
def audited(request: pytest.FixtureRequest) -> Iterator[None]:
    db = _database(request)
    if db is None:
        yield
        return
    before = db.read(lambda s: s.scalar(select(func.max(Tenant.id)))) or 0
    yield
    made = db.read(lambda s: list(s.scalars(select(Tenant.id).where(Tenant.id > before))))
    problems = []
    for tenant_id in made:
        result = db.read(
            lambda s, t=tenant_id: ledger.audit(
                s, at=datetime.now(UTC), tenant_id=t, close_delay=timedelta(hours=1)
            )
        )
        problems += result.problems
    assert not problems, problems
