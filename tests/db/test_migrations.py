"""The real Alembic migrations, on both databases."""

from __future__ import annotations

import orjson
import pytest
from sqlalchemy import create_engine, inspect, text

from app.db.migrate import downgrade, upgrade
from app.db.models import Base

pytestmark = pytest.mark.parametrize("empty_database_url", ["sqlite", "postgresql"], indirect=True)


def test_upgrade_creates_every_table_downgrade_removes_them(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        with engine.connect() as conn:
            assert (
                conn.execute(
                    text("SELECT value FROM counters WHERE name = 'resource_version'")
                ).scalar_one()
                == 0
            )
        downgrade(empty_database_url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(empty_database_url)
        upgrade(empty_database_url)  # idempotent
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_schema_matches_the_models(empty_database_url: str) -> None:
    """A model change without a migration fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()


def test_the_change_log_keeps_its_objects_across_0021(empty_database_url: str) -> None:
    """0021 stores the change log's objects as JSON text on PostgreSQL (JSONB before): what was
    logged comes back the same after the upgrade and after a downgrade."""
    upgrade(empty_database_url, "0020")
    engine = create_engine(empty_database_url)
    logged = {"metadata": {"name": "p", "uid": "u-1", "labels": {"a": "b"}}, "spec": {"n": [1, 2]}}
    insert = text(
        "INSERT INTO changes (resource_version, kind, namespace, name, tenant_id, type, object, "
        "previous) VALUES (7, 'Pod', 'ns', 'p', NULL, 'MODIFIED', :o, :p)"
    )
    read = text("SELECT object, previous FROM changes WHERE resource_version = 7")
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"o": orjson.dumps(logged).decode(), "p": '{"x": 1}'})
        for target in ("0021", "0020", "head"):
            if target == "0020":
                downgrade(empty_database_url, target)
            else:
                upgrade(empty_database_url, target)
            with engine.connect() as conn:
                obj, previous = conn.execute(read).one()
            as_dicts = [orjson.loads(v) if isinstance(v, str) else v for v in (obj, previous)]
            assert as_dicts == [logged, {"x": 1}], target
    finally:
        engine.dispose()


def test_callbacks_move_into_the_registry_across_0033(empty_database_url: str) -> None:
    """0033 makes each row of `callbacks` an object of the registry (same uid, name, labels,
    resourceVersion), its secret a row of `callback_secrets`, and keeps its deliveries; the
    registry's store then serves it as the old routes did. The downgrade puts it back whole."""
    from datetime import UTC, datetime

    from sqlalchemy import JSON, BigInteger, DateTime, Integer, String, column, table
    from sqlalchemy.orm import Session

    from app.registry.kinds.callbacks import CallbackStrategy
    from app.registry.store import Store

    upgrade(empty_database_url, "0032")
    engine = create_engine(empty_database_url)
    made, sent = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)
    old = {
        "uid": "cb-uid-1",
        "namespace": "team",
        "name": "hook",
        "tenant_id": None,
        "resource_version": 41,
        "created_at": made,
        "labels": {"app": "billing"},
        "annotations": {"owner": "ops"},
        "url": "https://hooks.example.com/tessera",
        "events": ["PodFinished", "GPUFault"],
        "description": "pager",
        "secret": "whsec_kept",
        "secret_rotated_at": made,
    }
    callbacks = table(
        "callbacks",
        *(column(k, String) for k in ("uid", "namespace", "name", "url", "description", "secret")),
        column("tenant_id", Integer),
        column("resource_version", BigInteger),
        column("created_at", DateTime(timezone=True)),
        column("secret_rotated_at", DateTime(timezone=True)),
        *(column(k, JSON) for k in ("labels", "annotations", "events")),
    )
    delivery = {
        "uid": "d-1",
        "callback_uid": "cb-uid-1",
        "event_id": "e-1",
        "type": "PodFinished",
        "subject": "namespaces/team/pods/p",
        "at": sent,
        "data": {"phase": "Succeeded"},
        "created_at": sent,
        "status": "Delivered",
        "attempts": 1,
        "next_attempt_at": sent,
    }
    deliveries = table(
        "callback_deliveries",
        *(
            column(k, String)
            for k in ("uid", "callback_uid", "event_id", "type", "subject", "status")
        ),
        column("attempts", Integer),
        column("data", JSON),
        *(column(k, DateTime(timezone=True)) for k in ("at", "created_at", "next_attempt_at")),
    )
    namespace = text(
        "INSERT INTO namespaces (name, uid, tenant_id, resource_version, created_at, labels, "
        "annotations) VALUES ('team', 'ns-uid', NULL, 1, :at, '{}', '{}')"
    )
    try:
        with engine.begin() as conn:
            conn.execute(namespace, {"at": made})
            conn.execute(callbacks.insert().values(**old))
            conn.execute(deliveries.insert().values(**delivery))

        def served() -> dict:
            with Session(engine) as session:
                return Store(CallbackStrategy()).get(session, namespace="team", name="hook")

        def foreign_keys() -> set[str]:
            found = inspect(engine).get_foreign_keys("callback_deliveries")
            return {fk["referred_table"] for fk in found}

        upgrade(empty_database_url, "0033")
        assert "callbacks" not in inspect(engine).get_table_names()
        assert foreign_keys() == {"objects"}
        obj = served()
        recent = obj["status"].pop("recentDeliveries")
        assert obj == {
            "apiVersion": "tessera.io/v1",
            "kind": "Callback",
            "metadata": {
                "name": "hook",
                "namespace": "team",
                "uid": "cb-uid-1",
                "resourceVersion": "41",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"app": "billing"},
                "annotations": {"owner": "ops"},
            },
            "spec": {
                "url": "https://hooks.example.com/tessera",
                "events": ["PodFinished", "GPUFault"],
                "description": "pager",
            },
            "status": {"secretRotationTime": "2026-01-02T03:04:05Z"},
        }
        assert [(d["eventId"], d["phase"]) for d in recent] == [("e-1", "Delivered")]
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT secret FROM callback_secrets")).scalars().all()
        assert kept == ["whsec_kept"]

        downgrade(empty_database_url, "0032")
        assert {"callback_secrets"} & set(inspect(engine).get_table_names()) == set()
        assert foreign_keys() == {"callbacks"}
        with engine.connect() as conn:
            (back,) = conn.execute(callbacks.select()).mappings().all()
            left = conn.execute(text("SELECT count(*) FROM objects")).scalar_one()
            (kept_delivery,) = conn.execute(deliveries.select()).mappings().all()

        def utc(at: datetime) -> datetime:
            return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)

        assert utc(back["created_at"]) == utc(back["secret_rotated_at"]) == made
        assert {**back, "created_at": made, "secret_rotated_at": made} == old
        assert left == 0 and kept_delivery["uid"] == "d-1"

        upgrade(empty_database_url)
        again = served()
        again["status"].pop("recentDeliveries")
        assert again == obj
    finally:
        engine.dispose()


def test_versions_go_on_increasing_across_0035_and_a_restore(empty_database_url: str) -> None:
    """0035 (PostgreSQL) hands versions out by transaction id from then on, above every
    version the counter handed out; downgraded, the counter goes on above those. A store
    restored into a cluster whose transaction ids are lower (its newest change far above what
    they give) is lifted above it by `tessera migrate`."""
    from app.db.engine import Database, current_resource_version, next_resource_version

    upgrade(empty_database_url, "0034")
    engine = create_engine(empty_database_url)
    far = 1 << 52  # above what any transaction id of this cluster gives

    def versions() -> tuple[int, int]:
        db = Database(empty_database_url, pool_size=1)
        try:
            return db.write(next_resource_version), db.read(current_resource_version)
        finally:
            db.dispose()

    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE counters SET value = :v WHERE name = 'resource_version'"), {"v": far}
            )
        upgrade(empty_database_url, "0035")
        taken, horizon = versions()
        assert taken > far and horizon >= taken
        downgrade(empty_database_url, "0034")
        with engine.connect() as conn:
            counter = conn.execute(
                text("SELECT value FROM counters WHERE name = 'resource_version'")
            ).scalar_one()
        assert counter >= taken  # the counter hands out what follows it
        upgrade(empty_database_url)
        assert versions()[0] > counter
        if engine.dialect.name == "sqlite":
            return  # one writer, one counter: nothing comes from elsewhere
        restored = versions()[0] + far  # as if the store came from a cluster far ahead
        with engine.begin() as conn:
            # as a restore writes it (pg_restore --disable-triggers): not through Tessera
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(
                text(
                    "INSERT INTO changes (resource_version, kind, namespace, name, tenant_id, "
                    "type, object) VALUES (:v, 'Pod', 'ns', 'p', NULL, 'ADDED', '{}')"
                ),
                {"v": restored},
            )
        upgrade(empty_database_url)  # `tessera migrate`, after the restore
        taken, horizon = versions()
        assert taken > restored and horizon >= restored
    finally:
        engine.dispose()


def test_pod_groups_move_into_the_registry_across_0036(empty_database_url: str) -> None:
    """0036 makes each row of `pod_groups` (either API group) an object of the registry (same
    uid, name, labels, resourceVersion; annotations, ownerReferences and spec in the body) and
    keeps what the scheduler reads and writes in `pod_groups`, keyed by the object's uid; the
    registry's store then serves both as the old routes did. The downgrade puts them back."""
    from datetime import UTC, datetime

    from sqlalchemy import JSON, BigInteger, DateTime, Integer, String, Text, column, table
    from sqlalchemy.orm import Session

    from app.registry.kinds.podgroups import CoschedulingPodGroupStrategy, PodGroupStrategy
    from app.registry.store import Store

    upgrade(empty_database_url, "0035")
    engine = create_engine(empty_database_url)
    made, tried = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js", "uid": "j"}
    common = {
        "namespace": "team",
        "tenant_id": None,
        "created_at": made,
        "schedule_timeout_seconds": None,
        "min_resources": None,
        "scheduling_since": None,
        "failed_reason": None,
        "owner_references": None,
        "required_topology": None,
        "preferred_topology": None,
    }
    tessera = {
        **common,
        "uid": "pg-1",
        "name": "train",
        "api_group": "tessera.io",
        "resource_version": 41,
        "labels": {"app": "llm"},
        "annotations": {"owner": "ops"},
        "min_member": 4,
        "required_topology": "rack",
        "preferred_topology": "node",
        "owner_references": [owner],
    }
    coscheduling = {
        **common,
        "uid": "pg-2",
        "name": "kubeflow",
        "api_group": "scheduling.x-k8s.io",
        "resource_version": 42,
        "labels": {},
        "annotations": {"tessera.io/topology-required": "zone"},
        "min_member": 2,
        "required_topology": "zone",
        "schedule_timeout_seconds": 60,
        "min_resources": {"cpu": "12"},
        "scheduling_since": tried,
        "failed_reason": "not placed within scheduleTimeoutSeconds (60s): no room",
    }
    groups = table(
        "pod_groups",
        *(column(k, String) for k in ("uid", "namespace", "name", "api_group")),
        *(column(k, String) for k in ("required_topology", "preferred_topology")),
        *(column(k, Integer) for k in ("tenant_id", "min_member", "schedule_timeout_seconds")),
        column("resource_version", BigInteger),
        *(column(k, DateTime(timezone=True)) for k in ("created_at", "scheduling_since")),
        column("failed_reason", Text),
        *(column(k, JSON) for k in ("labels", "annotations", "min_resources", "owner_references")),
    )
    namespace = text(
        "INSERT INTO namespaces (name, uid, tenant_id, resource_version, created_at, labels, "
        "annotations) VALUES ('team', 'ns-uid', NULL, 1, :at, '{}', '{}')"
    )
    scheduler_reads = text(
        "SELECT uid, namespace, name, api_group, min_member, required_topology, "
        "preferred_topology, schedule_timeout_seconds, failed_reason FROM pod_groups ORDER BY uid"
    )
    try:
        with engine.begin() as conn:
            conn.execute(namespace, {"at": made})
            conn.execute(groups.insert().values(**tessera))
            conn.execute(groups.insert().values(**coscheduling))
            before = [tuple(r) for r in conn.execute(scheduler_reads)]

        def served() -> tuple[dict, dict]:
            with Session(engine) as session:
                return (
                    Store(PodGroupStrategy()).get(session, namespace="team", name="train"),
                    Store(CoschedulingPodGroupStrategy()).get(
                        session, namespace="team", name="kubeflow"
                    ),
                )

        upgrade(empty_database_url, "0036")
        columns = {c["name"] for c in inspect(engine).get_columns("pod_groups")}
        assert "labels" not in columns and "resource_version" not in columns
        found = inspect(engine).get_foreign_keys("pod_groups")
        assert [fk["referred_table"] for fk in found] == ["objects"]
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(scheduler_reads)] == before
        first, second = served()
        meta = {"namespace": "team", "creationTimestamp": "2026-01-02T03:04:05Z"}
        assert first == {
            "apiVersion": "tessera.io/v1",
            "kind": "PodGroup",
            "metadata": {
                "name": "train",
                **meta,
                "uid": "pg-1",
                "resourceVersion": "41",
                "labels": {"app": "llm"},
                "annotations": {"owner": "ops"},
                "ownerReferences": [owner],
            },
            "spec": {"minMember": 4, "topology": {"required": "rack", "preferred": "node"}},
            "status": {"phase": "Pending", "members": 0, "scheduled": 0, "running": 0},
        }
        assert second["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
        assert second["metadata"]["annotations"] == {"tessera.io/topology-required": "zone"}
        assert second["spec"] == {
            "minMember": 2,
            "scheduleTimeoutSeconds": 60,
            "minResources": {"cpu": "12"},
        }
        assert second["status"]["scheduleStartTime"] == "2026-01-03T00:00:00Z"
        assert second["status"]["conditions"][0]["message"] == coscheduling["failed_reason"]

        downgrade(empty_database_url, "0035")
        with engine.connect() as conn:
            back = {r["uid"]: dict(r) for r in conn.execute(groups.select()).mappings()}
            left = conn.execute(text("SELECT count(*) FROM objects")).scalar_one()

        def utc(at: datetime | None) -> datetime | None:
            if at is None:
                return None
            return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)

        for old in (tessera, coscheduling):
            row = back[old["uid"]]
            row["created_at"], row["scheduling_since"] = (
                utc(row["created_at"]),
                utc(row["scheduling_since"]),
            )
            assert row == old
        assert left == 0

        upgrade(empty_database_url)
        assert served() == (first, second)
    finally:
        engine.dispose()


def test_commitments_move_into_the_registry_across_0038(empty_database_url: str) -> None:
    """0038 makes each row of `commitments` an object of the registry (same uid, name, tenant,
    labels, resourceVersion; annotations and the amount, in the currency's minor digits, in the
    body) and keeps the tenant and the amount in minor units beside it; the store then serves
    it as the old routes did, and billing's terms are untouched. The downgrade puts it back."""
    from datetime import UTC, datetime

    from sqlalchemy.orm import Session

    from app.billing_api.service import Money
    from app.registry.kinds.commitments import CommitmentStrategy
    from app.registry.store import Store

    upgrade(empty_database_url, "0037")
    engine = create_engine(empty_database_url)
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    plan = (
        "INSERT INTO commitments (uid, namespace, name, tenant_id, resource_version, created_at, "
        "labels, annotations, amount_minor) VALUES ('c-1', 'acme', 'daily', 1, 77, :at, "
        """'{"tier": "gold"}', '{"owner": "ops"}', 12345)"""
    )
    old_row = text(
        "SELECT uid, namespace, name, tenant_id, resource_version, amount_minor FROM commitments"
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, uid, created_at, weight) "
                    "VALUES (1, 'acme', 't-uid', :at, 1)"
                ),
                {"at": made},
            )
            conn.execute(
                text(
                    "INSERT INTO namespaces (name, uid, tenant_id, resource_version, created_at, "
                    "labels, annotations) VALUES ('acme', 'ns-uid', 1, 1, :at, '{}', '{}')"
                ),
                {"at": made},
            )
            conn.execute(text(plan), {"at": made})
            before = [tuple(r) for r in conn.execute(old_row)]

        def served() -> dict:
            with Session(engine) as session:
                store = Store(CommitmentStrategy(Money("USD", 2)))
                obj = store.get(session, namespace="acme", name="daily")
                obj.pop("status")  # computed from the terms and the clock
                return obj

        upgrade(empty_database_url, "0038")
        with engine.connect() as conn:
            beside = [tuple(r) for r in conn.execute(text("SELECT * FROM commitments"))]
        assert beside == [("c-1", 1, 12345)]
        first = served()
        assert first == {
            "apiVersion": "billing.tessera.io/v1",
            "kind": "Commitment",
            "metadata": {
                "name": "daily",
                "namespace": "acme",
                "uid": "c-1",
                "resourceVersion": "77",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"tier": "gold"},
                "annotations": {"owner": "ops"},
            },
            "spec": {"amountPerDay": "123.45"},
        }

        downgrade(empty_database_url, "0037")
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(old_row)] == before
            assert conn.execute(text("SELECT count(*) FROM objects")).scalar_one() == 0
        upgrade(empty_database_url)
        assert served() == first
    finally:
        engine.dispose()


def test_leases_keep_their_rows_across_0039(empty_database_url: str) -> None:
    """0039 gives `leases` the registry's columns: each row keeps its uid, name, labels,
    resourceVersion and spec columns, its annotations move into its body, and it takes its
    namespace's tenant; the registry's store then serves it as the old routes did, and the
    node loop's columns are untouched. The downgrade puts the annotations back."""
    from datetime import UTC, datetime

    from sqlalchemy.orm import Session

    from app.registry.kinds.leases import LeaseStrategy
    from app.registry.store import Store

    upgrade(empty_database_url, "0038")
    engine = create_engine(empty_database_url)
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    renewed = datetime(2026, 1, 2, 3, 5, 6, 789012, tzinfo=UTC)
    old_row = text(
        "SELECT uid, namespace, name, resource_version, labels, annotations, holder_identity, "
        "lease_duration_seconds, lease_transitions FROM leases"
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, uid, created_at, weight) "
                    "VALUES (1, 'acme', 't-uid', :at, 1)"
                ),
                {"at": made},
            )
            for name, tenant in (("acme", 1), ("kube-node-lease", None)):
                conn.execute(
                    text(
                        "INSERT INTO namespaces (name, uid, tenant_id, resource_version, "
                        "created_at, labels, annotations) "
                        "VALUES (:name, :uid, :tenant, 1, :at, '{}', '{}')"
                    ),
                    {"name": name, "uid": f"ns-{name}", "tenant": tenant, "at": made},
                )
            conn.execute(
                text(
                    "INSERT INTO leases (uid, namespace, name, resource_version, created_at, "
                    "labels, annotations, holder_identity, lease_duration_seconds, acquire_time, "
                    "renew_time, lease_transitions) VALUES ('l-1', 'kube-node-lease', 'gpu-1', "
                    """77, :at, '{"zone": "a"}', '{"owner": "ops"}', 'gpu-1', 40, :at, """
                    ":renewed, 2)"
                ),
                {"at": made, "renewed": renewed},
            )
            conn.execute(
                text(
                    "INSERT INTO leases (uid, namespace, name, resource_version, created_at, "
                    "labels, annotations) VALUES ('l-2', 'acme', 'mine', 78, :at, '{}', '{}')"
                ),
                {"at": made},
            )
            before = sorted(tuple(orjson.dumps(v) for v in r) for r in conn.execute(old_row))

        def served(namespace: str, name: str) -> dict:
            with Session(engine) as session:
                return Store(LeaseStrategy()).get(session, namespace=namespace, name=name)

        upgrade(empty_database_url, "0039")
        first = served("kube-node-lease", "gpu-1")
        assert first == {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "gpu-1",
                "namespace": "kube-node-lease",
                "uid": "l-1",
                "resourceVersion": "77",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"zone": "a"},
                "annotations": {"owner": "ops"},
            },
            "spec": {
                "holderIdentity": "gpu-1",
                "leaseDurationSeconds": 40,
                "leaseTransitions": 2,
                "acquireTime": "2026-01-02T03:04:05.000000Z",
                "renewTime": "2026-01-02T03:05:06.789012Z",
            },
        }
        assert served("acme", "mine")["spec"] == {}
        with engine.connect() as conn:
            tenants = dict(conn.execute(text("SELECT uid, tenant_id FROM leases")).all())
            assert tenants == {"l-1": None, "l-2": 1}

        downgrade(empty_database_url, "0038")
        with engine.connect() as conn:
            after = sorted(tuple(orjson.dumps(v) for v in r) for r in conn.execute(old_row))
            assert after == before
        upgrade(empty_database_url)
        assert served("kube-node-lease", "gpu-1") == first
    finally:
        engine.dispose()
