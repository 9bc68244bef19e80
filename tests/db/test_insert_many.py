"""`engine.insert_many`: rows go in as they were given, whichever way the database takes them
(one pipelined round trip for a few, COPY for many on PostgreSQL; executemany on SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, select
from sqlalchemy.orm import Session

from app.db.engine import PIPELINE_ROWS, Database, insert_many
from app.db.models import Change, Event, table
from tests.conftest import unique

TRICKY = 'tab\there, newline\nthere, back\\slash, quote " and \u00e9\u4e2d\U0001f680, NUL-free'


def rows(count: int, base: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    name = unique("im-")
    changes = [
        {
            "resource_version": base + i,
            "kind": "Probe",
            "namespace": None if i % 3 == 0 else "ns",
            "name": f"{name}-{i}",
            "tenant_id": None if i % 2 else 7,
            "type": "ADDED",
            "object": {"text": TRICKY, "n": i, "none": None, "list": [1, 2.5, True, {"x": "y"}]},
            "previous": None if i % 2 else {"before": TRICKY},
        }
        for i in range(count)
    ]
    events = [
        {
            "uid": f"{name}-uid-{i}",
            "namespace": "default",
            "name": f"{name}-e{i}",
            "tenant_id": None,
            "resource_version": base + i,
            "created_at": at + timedelta(seconds=i),
            "involved_kind": "Pod",
            "involved_api_version": "v1",
            "involved_name": name,
            "involved_namespace": None,
            "involved_uid": name,
            "type": "Normal",
            "reason": "Probe",
            "message": TRICKY,
            "component": "test",
            "count": 1,
            "first_timestamp": at,
            "last_timestamp": at + timedelta(seconds=i),
        }
        for i in range(count)
    ]
    return changes, events


@pytest.fixture
def tables(db: Database) -> Iterator[tuple[Table, Table]]:
    """Copies of the change log and the events table, made for one test and dropped after it:
    rows written here never reach the real change log, whose watches and compaction the rest
    of the suite shares."""
    metadata = MetaData()
    suffix = unique("_")
    copies = tuple(
        Table(  # the same columns and keys; no indexes or foreign keys to clash or to hold
            f"{original.name}{suffix}",
            metadata,
            *(
                Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                for c in original.columns
            ),
        )
        for original in (table(Change), table(Event))
    )
    db.write(lambda s: metadata.create_all(s.connection()))
    yield copies  # type: ignore[misc]
    db.write(lambda s: metadata.drop_all(s.connection()))


@pytest.mark.parametrize("count", [1, PIPELINE_ROWS // 4, PIPELINE_ROWS * 2])
def test_rows_read_back_as_they_were_given(
    db: Database, tables: tuple[Table, Table], count: int
) -> None:
    changes_t, events_t = tables
    base = 10**15 + count * 1000
    changes, events = rows(count, base)
    db.write(lambda s: insert_many(s, [(changes_t, changes), (events_t, events)]))

    def read(session: Session) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        got_changes = session.execute(
            select(changes_t)
            .where(changes_t.c.resource_version.between(base, base + count))
            .order_by(changes_t.c.resource_version)
        ).mappings()
        got_events = session.execute(
            select(events_t)
            .where(events_t.c.uid.in_([e["uid"] for e in events]))
            .order_by(events_t.c.resource_version)
        ).mappings()
        return [dict(r) for r in got_changes], [dict(r) for r in got_events]

    got_changes, got_events = db.read(read)
    assert got_changes == changes
    assert got_events == events


def test_a_duplicate_key_fails_the_insert_and_writes_nothing(
    db: Database, tables: tuple[Table, Table]
) -> None:
    changes_t, events_t = tables
    base = 2 * 10**15
    changes, events = rows(3, base)
    db.write(lambda s: insert_many(s, [(changes_t, changes[:1])]))
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        db.write(lambda s: insert_many(s, [(events_t, events), (changes_t, changes)]))
    left = db.read(
        lambda s: list(
            s.scalars(select(events_t.c.uid).where(events_t.c.uid.in_([e["uid"] for e in events])))
        )
    )
    assert left == []
