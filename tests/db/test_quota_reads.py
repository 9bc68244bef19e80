"""A batch of creates reads and locks its namespace's quotas once (`quotas.quotas_of`), and
that read stays right: a quota the batch itself writes is read again, and a lock undone with a
failed write's savepoint is taken again."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.db.engine import Database, WriteQueue
from app.errors import Forbidden
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.quotas import service as quotas
from app.registry.kinds import ResourceQuotaStrategy
from app.registry.store import Store
from tests.db.test_write_queue import held_back
from tests.factories import pod as pod_manifest
from tests.scheduler.test_loop import new_tenant, prepared


def write_quota(ns: NamespaceInfo, name: str, **hard: str) -> Any:
    def work(session: Session) -> Any:
        body = {"metadata": {"name": name}, "spec": {"hard": hard}}
        return Store(ResourceQuotaStrategy()).create(session, namespace=ns, obj=body)

    return work


def test_a_quota_the_batch_writes_counts_for_its_later_creates(db: Database) -> None:
    """Pod a is admitted with no quota (the namespace's quotas are read, none), the batch then
    writes a quota of one pod, and pod b of the same batch is refused: a is already there."""
    ns = new_tenant(db)
    first, second = (prepared(db, ns, pod_manifest(n)) for n in ("a", "b"))
    queue = WriteQueue(db)
    release = held_back(queue)
    futures = [
        queue.submit(partial(pods.insert, new=first), clean=True),
        queue.submit(write_quota(ns, "one", pods="1")),
        queue.submit(partial(pods.insert, new=second), clean=True),
    ]
    release.set()
    assert futures[0].result(10)["metadata"]["name"] == "a"
    futures[1].result(10)
    with pytest.raises(Forbidden, match="exceeded quota: one"):
        futures[2].result(10)
    queue.close()


def test_a_lock_undone_with_a_failed_write_is_taken_again(db: Database) -> None:
    """PostgreSQL: the first write of a batch locks the namespace's quota and fails, and its
    savepoint's rollback releases that lock; the next write of the batch must lock it again
    (another transaction then cannot), not trust the read it cached."""
    if db.is_sqlite:
        pytest.skip("SQLite has one writer at a time: no row locks")
    ns = new_tenant(db)
    db.write(write_quota(ns, "held", pods="10"))
    adds = quotas.Usage(pods=1)

    def check_then_fail(session: Session) -> None:
        quotas.check(session, namespace=ns.name, pod="x", adds=adds, tenant_id=ns.tenant_id)
        raise RuntimeError("this write fails after its check")

    def check_then_probe(session: Session) -> bool:
        quotas.check(session, namespace=ns.name, pod="y", adds=adds, tenant_id=ns.tenant_id)
        with db.engine.connect() as other:
            try:
                other.execute(
                    text(
                        "SELECT name FROM objects WHERE resource = 'resourcequotas'"
                        " AND namespace = :ns FOR UPDATE NOWAIT"
                    ),
                    {"ns": ns.name},
                )
            except OperationalError as exc:
                assert getattr(exc.orig, "sqlstate", None) == "55P03"  # lock not available
                return True
            finally:
                other.rollback()
        return False

    queue = WriteQueue(db)
    release = held_back(queue)
    failing = queue.submit(check_then_fail)
    probing = queue.submit(check_then_probe)
    release.set()
    with pytest.raises(RuntimeError):
        failing.result(10)
    assert probing.result(10), "the quota's row was not locked for the second write's check"
    queue.close()
