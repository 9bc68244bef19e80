"""Lookups of a few pods among many, made over and over, keep to their indexes on PostgreSQL
(counted as the pages of the pods table they read: a scan of the table, or of an index that
does not narrow it down, reads about all of its 2,000 pages):

* the node loop's, every half second: of pods past a deadline (deletion grace, disruption
  notice, a Deferred resize), also after the pods table grew from empty, instead of a plan
  their connection cached while it was empty;
* the scheduler's, in every cycle: of the waiting pods that changed since its last cycle, and,
  with a gang, of the gang's members."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import pytest
from sqlalchemy import create_engine, text

from app import agent
from app.db.engine import Database
from app.pods import repository
from scheduler.loop import build_batch, read_changes

pytestmark = pytest.mark.parametrize("fresh_database_url", ["postgresql"], indirect=True)

LOOKUPS = (
    agent._deleted_past_grace,
    agent._disrupted_past_deadline,
    agent._deferred_resizes_that_fit,
)

NODE_ROWS = """
INSERT INTO nodes (name, uid, resource_version, created_at, labels, annotations, unschedulable,
    region, zone, rack, compute_classes, cpu_capacity_milli, cpu_allocatable_milli,
    cpu_free_milli, memory_capacity_mib, memory_allocatable_mib, memory_free_mib, numa_nodes,
    ready)
SELECT 'node-' || i, 'node-uid-' || i, 100000 + i, now(), '{}', '{}', false, 'r', 'z', 'k',
    'general-purpose', 64000, 64000, 0, 262144, 262144, 0, 1, true
FROM generate_series(1, 500) AS i
"""

POD_ROWS = """
INSERT INTO pods (uid, namespace, name, resource_version, generation, created_at, labels,
    annotations, meta_extra, spec, spec_name, cpu_milli, memory_mib, gpu_count, gpu_memory_mib,
    gpu_core_pct, compute_class, qos, priority, phase, conditions, node_name, pod_group)
SELECT 'uid-' || i, 'default', 'pod-' || i, i, 1, now(), '{}', '{}', '{}',
    '{"containers": [{"name": "main", "image": "busybox"}]}', 'c1m2', 1000, 2048, 0, 0, 0,
    'general-purpose', 'default', 0, 'Running', '[]', 'node-' || (1 + i % 500),
    CASE WHEN i % 100 = 0 THEN 'gang-' || (i % 700) END
FROM generate_series(1, 20000) AS i
"""


WAITING_ROWS = """
INSERT INTO pods (uid, namespace, name, resource_version, generation, created_at, labels,
    annotations, meta_extra, spec, spec_name, cpu_milli, memory_mib, gpu_count, gpu_memory_mib,
    gpu_core_pct, compute_class, qos, priority, phase, conditions)
SELECT 'wait-' || i, 'default', 'waiting-' || i, 20000 + i, 1, now(), '{}', '{}', '{}',
    '{"containers": [{"name": "main", "image": "busybox"}]}', 'c1m2', 1000, 2048, 0, 0, 0,
    'general-purpose', 'default', 0, 'Pending', '[]'
FROM generate_series(1, 30) AS i
"""

COUNTER = "UPDATE counters SET value = 20030 WHERE name = 'resource_version'"


def populate(db: Database, *more: str) -> None:
    """500 nodes, 20,000 running pods on them (every hundredth in a gang) and 30 pending pods
    written last (resourceVersions 20,001-20,030, the counter's value); then `more`."""
    with db.engine.begin() as conn:
        for statement in (NODE_ROWS, POD_ROWS, WAITING_ROWS, COUNTER, *more):
            conn.execute(text(statement))


@pytest.fixture
def db(fresh_database_url: str) -> Iterator[Database]:
    database = Database(fresh_database_url, pool_size=1)
    with database.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO namespaces (name, uid, resource_version, created_at, labels, "
                "annotations) VALUES ('default', 'ns-uid', 1, now(), '{}', '{}')"
            )
        )
    yield database
    database.dispose()


def pods_pages_read(url: str, db: Database) -> int:
    """Pages of the pods table read so far (the node loop's connection's counts flushed to the
    statistics first)."""
    db.read(lambda s: s.execute(text("SELECT pg_stat_force_next_flush()")))
    engine = create_engine(url)
    query = text(
        "SELECT heap_blks_read + heap_blks_hit FROM pg_statio_user_tables WHERE relname = 'pods'"
    )
    try:
        seen = -1
        for _ in range(50):  # the flush happens once that connection is idle
            time.sleep(0.05)
            with engine.connect() as conn:
                count = int(conn.execute(query).scalar_one())
            if count == seen:
                return count
            seen = count
        return seen
    finally:
        engine.dispose()


def test_the_lookups_use_their_partial_indexes_once_the_table_has_grown(
    fresh_database_url: str, db: Database
) -> None:
    # Every pass on an empty table, long enough for the connection to prepare the lookups and
    # for PostgreSQL to settle on a plan it would then keep.
    for _ in range(15):
        for lookup in LOOKUPS:
            assert db.read(lookup) == []
    populate(db)

    before = pods_pages_read(fresh_database_url, db)
    for _ in range(5):
        for lookup in LOOKUPS:
            assert db.read(lookup) == []
    assert pods_pages_read(fresh_database_url, db) - before < 10


def test_a_gangs_members_are_found_by_their_index(fresh_database_url: str, db: Database) -> None:
    populate(db)
    pending = {"namespace": "default", "pod_group": "gang-100", "uid": "new", "node_name": None}

    before = pods_pages_read(fresh_database_url, db)
    for _ in range(3):
        members = db.read(lambda s: repository.group_members(s, "default", "gang-100"))
        assert {m["name"] for m in members} == {f"pod-{i}" for i in range(100, 20001, 700)}
        batch = db.read(lambda s: build_batch(s, [pending], scheduler_name="tessera"))
        assert batch.requests == []  # its members are all bound
    # the 29 members' pages, twice a round: not the table's 2,000
    assert pods_pages_read(fresh_database_url, db) - before < 3 * 2 * 29 + 10


def test_the_scheduler_reads_the_waiting_pods_that_changed_by_their_index(
    fresh_database_url: str, db: Database
) -> None:
    populate(db)

    before = pods_pages_read(fresh_database_url, db)
    for _ in range(3):
        changes = db.read(lambda s: read_changes(s, 20010))
        assert sorted(p["name"] for p in changes.pending) == sorted(
            f"waiting-{i}" for i in range(11, 31)
        )
    assert pods_pages_read(fresh_database_url, db) - before < 3 * 20


def test_the_node_loop_starts_the_pods_bound_since_its_last_look_by_their_index(
    fresh_database_url: str, db: Database
) -> None:
    populate(
        db,
        # bound, not started: the thirty written last, and one written long before them
        "UPDATE pods SET node_name = 'node-7' WHERE name LIKE 'waiting-%'",
        # every pod was Pending once, as in a burst: until a vacuum, the phase index still
        # holds an entry of each as Pending
        "UPDATE pods SET phase = 'Pending' WHERE phase = 'Running'",
        "UPDATE pods SET phase = 'Running' WHERE name LIKE 'pod-%'",
        "UPDATE pods SET phase = 'Pending' WHERE name = 'pod-5'",
    )
    before = pods_pages_read(fresh_database_url, db)
    version, rows = db.read(partial(agent._bound_not_started, since=20000))
    assert len(rows) == 30
    assert pods_pages_read(fresh_database_url, db) - before < 100  # a look at every pod: ~700

    cursor = agent.StartCursor(version=20000, full_at=time.monotonic())  # looked up to 20000
    assert agent.start_bound(db, cursor) == 30
    assert cursor.version >= version
    assert agent.start_bound(db, cursor) == 0

    phases = "SELECT name, phase FROM pods WHERE name LIKE 'waiting-%' OR name = 'pod-5'"
    with db.engine.connect() as conn:
        phase = {name: value for name, value in conn.execute(text(phases))}
    assert phase.pop("pod-5") == "Pending"  # before the cursor: left for the next full look
    assert set(phase.values()) == {"Running"}

    cursor.full_at = time.monotonic() - agent.FULL_LOOK_SECONDS - 1
    assert agent.start_bound(db, cursor) == 1  # the full look finds it
    with db.engine.connect() as conn:
        assert ("pod-5", "Running") in [tuple(row) for row in conn.execute(text(phases))]
