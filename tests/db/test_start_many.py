"""The node loop's set-based start (`pods.prepare_start` + `pods.apply_updates`) against
`pods.start` one pod at a time, and the node loop starting every bound pod of its simulated
nodes (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from app import agent
from app.db.engine import Database, current_resource_version, flush_deferred
from app.db.models import Change, Event, table
from app.deps import Services
from app.kube.meta import now
from app.pods import repository
from app.pods import service as pods
from app.settings import Settings
from tests.conftest import unique
from tests.factories import pod as manifest
from tests.scheduler.test_bind_many import small_node
from tests.scheduler.test_loop import create, in_pool, new_tenant

changes_t = table(Change)
events_t = table(Event)


# A database of its own: the session's is shared with a running server whose node loop starts
# bound pods (these tests start them themselves, and count what changed).
pytestmark = pytest.mark.parametrize("fresh_database_url", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def db(fresh_database_url: str) -> Iterator[Database]:
    database = Database(fresh_database_url)
    yield database
    database.dispose()


def setup(db: Database) -> tuple[str, str, list[dict[str, Any]]]:
    """A node and six pods: four bound, one pending, one bound then deleted (terminating)."""
    pool = unique("sm-pool-")
    node = small_node(db, pool)
    ns = new_tenant(db)
    made = [
        create(db, ns, in_pool(pool, manifest(unique("p-"), cpu="1", memory="2Gi")))
        for _ in range(6)
    ]
    for obj in [*made[:4], *made[5:]]:
        name = obj["metadata"]["name"]
        db.write(lambda s, n=name: pods.bind(s, namespace=ns.name, name=n, node_name=node, gpus=[]))  # type: ignore[misc]
    terminating = made[5]["metadata"]["name"]
    db.write(lambda s: pods.delete(s, namespace=ns.name, name=terminating, grace_seconds=30))
    return ns.name, node, made


def observed(session: Session, uids: list[str]) -> dict[str, Any]:
    """What a start changes, without its timestamps: phase, conditions, started or not, the
    Started events and the pods' MODIFIED changes logged."""
    flush_deferred(session)  # as the transaction will commit it
    rows = session.execute(
        select(repository.pods).where(repository.pods.c.uid.in_(uids)).order_by("uid")
    ).mappings()
    names = {}
    state = []
    for row in rows:
        names[row["name"]] = row["uid"]
        state.append(
            (
                row["uid"],
                row["phase"],
                row["start_time"] is not None,
                [(c["type"], c["status"]) for c in row["conditions"]],
            )
        )
    started = sorted(
        session.scalars(
            select(events_t.c.involved_uid).where(
                events_t.c.involved_uid.in_(uids), events_t.c.reason == "Started"
            )
        )
    )
    written = session.execute(
        select(changes_t.c.kind, changes_t.c.name, changes_t.c.object).where(
            changes_t.c.kind == "Pod", changes_t.c.name.in_(list(names))
        )
    ).mappings()
    queued = session.info.get("pending_changes", [])  # logged as the transaction commits
    logged = sorted(
        (change["object"]["metadata"]["uid"], change["object"]["status"]["phase"])
        for change in [*written, *queued]
        if change["kind"] == "Pod"
        and change["name"] in names
        and change["object"]["status"]["phase"] == "Running"
    )
    return {"pods": state, "events": started, "logged": logged}


def test_start_many_starts_what_start_starts_one_by_one(db: Database) -> None:
    _, _, made = setup(db)
    uids = [obj["metadata"]["uid"] for obj in made] + ["no-such-pod"]
    # the first pod is already running: it is not started again
    db.write(lambda s: pods.start(s, uid=uids[0]))

    def one_by_one(session: Session) -> tuple[list[str], dict[str, Any]]:
        started = [uid for uid in uids if pods.start(session, uid=uid)]
        return started, observed(session, uids)

    def at_once(session: Session) -> tuple[list[str], dict[str, Any]]:
        rows = session.execute(
            select(repository.pods).where(repository.pods.c.uid.in_(uids))
        ).mappings()
        updates = [pods.prepare_start(r, at=now()) for r in rows if pods._startable(r)]
        done = pods.apply_updates(session, updates)
        return sorted(u.row["uid"] for u in done), observed(session, uids)

    before = db.read(lambda s: observed(s, uids))
    expected_started, expected = db.dry_run(one_by_one)
    started, got = db.dry_run(at_once)
    assert sorted(expected_started) == started == sorted([*uids[1:4], uids[5]])
    assert got == expected
    assert got != before
    assert db.read(lambda s: observed(s, uids)) == before  # both were rolled back


def rows_of(db: Database, uids: list[str]) -> list[Any]:
    return db.read(
        lambda s: list(
            s.execute(select(repository.pods).where(repository.pods.c.uid.in_(uids))).mappings()
        )
    )


def test_each_started_pod_gets_its_own_new_resource_version(db: Database) -> None:
    _, _, made = setup(db)
    uids = [obj["metadata"]["uid"] for obj in made[:4]]
    floor = db.read(current_resource_version)
    updates = [pods.prepare_start(row, at=now()) for row in rows_of(db, uids)]
    done = db.write(lambda s: pods.apply_updates(s, updates))
    assert sorted(u.row["uid"] for u in done) == sorted(uids)
    versions = db.read(
        lambda s: list(
            s.scalars(
                select(repository.pods.c.resource_version).where(repository.pods.c.uid.in_(uids))
            )
        )
    )
    assert len(set(versions)) == 4 and min(versions) > floor
    logged = db.read(
        lambda s: set(
            s.scalars(
                select(changes_t.c.resource_version).where(
                    changes_t.c.resource_version.in_(versions)
                )
            )
        )
    )
    assert logged == set(versions)  # a watch sees every start, at the pod's own version


def test_a_pod_changed_after_it_was_read_is_not_started_from_the_old_row(db: Database) -> None:
    namespace, _, made = setup(db)
    uids = [obj["metadata"]["uid"] for obj in made[:2]]
    updates = [pods.prepare_start(row, at=now()) for row in rows_of(db, uids)]
    # meanwhile the first pod is labelled: its prepared start is stale
    name = made[0]["metadata"]["name"]
    services = Services.build(Settings(), db=db)
    db.write(
        lambda s: pods.patch(
            s,
            namespace=namespace,
            name=name,
            body={"metadata": {"labels": {"stage": "test"}}},
            patch_type="application/merge-patch+json",
            context=services.admission(s),
        )
    )
    done = db.write(lambda s: pods.apply_updates(s, updates))
    assert [u.row["uid"] for u in done] == [uids[1]]
    first = db.read(lambda s: pods.get(s, namespace=namespace, name=name))
    assert first["status"]["phase"] == "Pending"  # not started from the old row
    assert first["metadata"]["labels"]["stage"] == "test"  # and the label kept


def test_the_node_loop_starts_every_bound_pod_in_batches(db: Database, monkeypatch: Any) -> None:
    namespace, _, made = setup(db)
    monkeypatch.setattr(agent, "START_BATCH", 2)  # four startable pods: several transactions
    agent.start_bound(db)
    phases = db.read(
        lambda s: {
            row.name: row.phase
            for row in s.execute(
                select(repository.pods.c.name, repository.pods.c.phase).where(
                    repository.pods.c.namespace == namespace
                )
            )
        }
    )
    names = [obj["metadata"]["name"] for obj in made]
    assert [phases[n] for n in names[:4]] == ["Running"] * 4
    assert phases[names[4]] == "Pending"  # not bound: nothing to start
    assert phases[names[5]] == "Pending"  # terminating: never started
