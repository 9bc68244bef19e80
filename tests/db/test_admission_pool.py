"""The pool's GPU models that admission checks requests against: read from the inventory at most
every 5 seconds, by one request at a time, and forgotten when the inventory changes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

import app.deps
from app.db.engine import Database
from app.deps import Services
from app.settings import Settings


class CatalogReads:
    """Counts the statements that read the pool's GPU models (and runs `during` in the first
    one that finds it set, as the statement runs)."""

    def __init__(self) -> None:
        self.count = 0
        self.during: Any = None

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "max(anon_1.n)" in statement:
            self.count += 1
            if self.during is not None:
                during, self.during = self.during, None
                during()


@pytest.fixture
def reads(db: Database) -> Iterator[CatalogReads]:
    counter = CatalogReads()
    event.listen(db.engine, "before_cursor_execute", counter)
    yield counter
    event.remove(db.engine, "before_cursor_execute", counter)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(app.deps.time, "monotonic", lambda: now[0])
    return now


def test_a_burst_of_creates_reads_the_expired_pool_once(
    db: Database, reads: CatalogReads, clock: list[float]
) -> None:
    services = Services.build(Settings(), db=db)

    async def burst() -> list[Any]:
        return await asyncio.gather(*(services.admission_now() for _ in range(16)))

    first = asyncio.run(services.admission_now())
    assert reads.count == 1
    clock[0] += 4.0  # still fresh: nobody reads
    asyncio.run(burst())
    assert reads.count == 1

    clock[0] += 2.0  # expired for all sixteen at once
    contexts = asyncio.run(burst())
    assert reads.count == 2  # one of them read; the others went on with what was cached
    assert sum(c.pool is first.pool for c in contexts) == 15
    assert all(c.pool.models == first.pool.models for c in contexts)

    asyncio.run(burst())  # cached again, for 5 seconds from that read
    assert reads.count == 2


def test_an_inventory_change_during_a_read_is_not_hidden_by_it(
    db: Database, reads: CatalogReads, clock: list[float]
) -> None:
    services = Services.build(Settings(), db=db)
    reads.during = services.forget_pool  # the inventory changes while the models are read
    db.read(services.admission)
    assert reads.count == 1
    db.read(services.admission)  # what that read found predates the change: read again
    assert reads.count == 2
    db.read(services.admission)
    assert reads.count == 2

    services.forget_pool()
    db.read(services.admission)
    assert reads.count == 3
