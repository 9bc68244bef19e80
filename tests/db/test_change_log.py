"""The change log watches read from: compaction keeps the newest entries it is told to keep,
and a watch from before what was dropped is told so (410 Expired), never given a gap."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.engine import Database, next_resource_version, record_change
from app.db.models import Change, table
from app.watch import log as change_log

pytestmark = pytest.mark.parametrize("fresh_database_url", ["sqlite", "postgresql"], indirect=True)
changes_t = table(Change)


def change(session: Session, name: str) -> int:
    version = next_resource_version(session)
    record_change(
        session,
        {
            "resource_version": version,
            "kind": "Probe",
            "namespace": None,
            "name": name,
            "tenant_id": None,
            "type": "ADDED",
            "object": {"metadata": {"name": name, "resourceVersion": str(version)}},
        },
    )
    return version


def test_compaction_keeps_the_newest_entries_however_far_apart_their_versions(
    fresh_database_url: str,
) -> None:
    db = Database(fresh_database_url)
    try:
        # One write each: every transaction reserves a block of versions, so the entries'
        # versions are far apart (a distance in versions is not a count of entries).
        versions = [db.write(lambda s, i=i: change(s, f"probe-{i}")) for i in range(12)]  # type: ignore[misc]
        assert versions == sorted(versions) and versions[-1] - versions[0] > 12

        assert db.write(lambda s: change_log.compact(s, keep=5)) == 7
        kept = db.read(
            lambda s: list(
                s.scalars(select(changes_t.c.resource_version).order_by("resource_version"))
            )
        )
        assert kept == versions[-5:]
        assert db.read(change_log.compacted_before) == versions[6]
        assert db.write(lambda s: change_log.compact(s, keep=5)) == 0  # nothing more to drop

        # A watch resumed from a kept version reads what follows it; one from a dropped
        # version can no longer be served completely.
        rows, _ = db.read(
            lambda s: change_log.read_after(
                s, after=versions[7], kind="Probe", namespace=None, tenant_id=None, scoped=False
            )
        )
        assert [r["resource_version"] for r in rows] == versions[8:]
        assert db.read(change_log.compacted_before) > versions[5]

        assert db.write(lambda s: change_log.compact(s, keep=0)) == 5
        assert db.read(lambda s: s.scalar(select(func.count()).select_from(changes_t))) == 0
        assert db.read(change_log.compacted_before) == versions[-1]
    finally:
        db.dispose()
