"""The ledger on both databases: written in the transition's transaction by the real bind and
removal paths, never twice, never for a transition that rolled back; reconciled after a restart
at the last known time; audited."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import delete, select

from app.db.models import Pod, UsageEvent
from app.pods import service as pods
from billing import ledger
from billing.usage import PodRef, Reason, Transition, fold, whole_second
from tests.billing.helpers import bound_pod
from tests.billing.lifecycle import SPECS, T0, stories


def _events(db, uid: str) -> list[UsageEvent]:
    return db.read(lambda s: list(s.scalars(select(UsageEvent).where(UsageEvent.pod_uid == uid))))


def test_bind_starts_and_removal_stops_billing_in_the_same_transaction(
    server, tenant, admin
) -> None:
    db = server.services.db
    obj = bound_pod(tenant, admin, "web", cpu="1.5", memory="2.5Gi", slice_gib=20, core=25)
    uid = obj["metadata"]["uid"]
    (start,) = _events(db, uid)
    bound_at = db.read(lambda s: s.scalar(select(Pod.bound_at).where(Pod.uid == uid)))
    assert start.id == f"{uid}/start/0" and start.reason == "bind"
    assert start.at == whole_second(bound_at)
    # billed for the spec it got (1.5 vCPU / 2.5 GiB is sold as 1.5-3Gi) and the slice it holds
    assert (start.cpu_milli, start.memory_mib) == (1500, 3072)
    assert (start.gpu_vram_mib, start.gpu_core_pct, start.gpu_model) == (20480, 25, "H100")
    assert (start.compute_class, start.qos) == ("gpu", "default")

    # a graceful delete keeps billing while the node stops the pod
    ns = tenant.tenant
    assert tenant.delete(f"/api/v1/namespaces/{ns}/pods/web").status_code == 200
    assert len(_events(db, uid)) == 1
    # the node has stopped it (what the agent reports when the grace period is over)
    assert db.write(lambda s: pods.finalize(s, uid=uid)) is True
    events = sorted(_events(db, uid), key=lambda e: e.kind)
    assert [(e.kind, e.reason) for e in events] == [("start", "bind"), ("stop", "delete")]
    audit = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=_tenant_id(db, ns)))
    assert audit.ok, audit.problems
    assert audit.billed_seconds == audit.held_seconds


def _tenant_id(db, name: str) -> int:
    from app.db.models import Tenant

    return db.read(lambda s: s.scalar(select(Tenant.id).where(Tenant.name == name)))


def test_forced_delete_stops_billing_and_unbound_pods_are_never_billed(
    server, tenant, admin
) -> None:
    db = server.services.db
    ns = tenant.tenant
    uid = bound_pod(tenant, admin, "job")["metadata"]["uid"]
    assert (
        tenant.delete(
            f"/api/v1/namespaces/{ns}/pods/job", params={"gracePeriodSeconds": 0}
        ).status_code
        == 200
    )
    assert {e.kind for e in _events(db, uid)} == {"start", "stop"}
    from tests.factories import pod

    pending = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("never")).json()
    assert tenant.delete(f"/api/v1/namespaces/{ns}/pods/never").status_code == 200
    assert _events(db, pending["metadata"]["uid"]) == []


def test_a_transition_that_rolls_back_writes_no_usage(server, tenant, admin) -> None:
    """A crash inside the bind's transaction loses the bind and its usage event together."""
    from app.inventory.service import GPUShare
    from tests.conftest import unique
    from tests.factories import gpu_node, pod

    db = server.services.db
    ns = tenant.tenant
    node = unique("crash-")
    admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1))
    uid = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("p", gpus=1)).json()["metadata"][
        "uid"
    ]

    class Crash(Exception):
        pass

    def bind_then_die(session):
        pods.bind(
            session,
            namespace=ns,
            name="p",
            node_name=node,
            gpus=[GPUShare(f"{node}-gpu0", 81920, 100)],
        )
        assert session.scalar(select(UsageEvent.id).where(UsageEvent.pod_uid == uid))
        raise Crash

    with pytest.raises(Crash):
        db.write(bind_then_die)
    assert _events(db, uid) == []
    assert db.read(lambda s: s.scalar(select(Pod.node_name).where(Pod.uid == uid))) is None


def test_reconcile_closes_a_vanished_pod_at_its_nodes_last_heartbeat(server, tenant, admin) -> None:
    db = server.services.db
    ns = tenant.tenant
    obj = bound_pod(tenant, admin, "lost")
    uid, node = obj["metadata"]["uid"], obj["spec"]["nodeName"]
    start = _events(db, uid)[0].at
    beat = start + timedelta(seconds=300)
    db.write(lambda s: ledger.heartbeat(s, nodes=[node], at=beat))
    # the pod disappears while the control plane is down (no transition ran, so no stop)
    db.write(lambda s: s.execute(delete(Pod).where(Pod.uid == uid)))
    restart = start + timedelta(hours=5)
    result = db.write(lambda s: ledger.reconcile(s, at=restart))
    assert [t.pod.uid for t in result.closed if t.pod.uid == uid] == [uid]
    stop = next(e for e in _events(db, uid) if e.kind == "stop")
    assert stop.at == beat and stop.reason == "reconcile"  # not the restart time
    again = db.write(lambda s: ledger.reconcile(s, at=restart + timedelta(hours=1)))
    assert uid not in {t.pod.uid for t in again.closed}
    assert len(_events(db, uid)) == 2
    audit = db.read(lambda s: ledger.audit(s, at=restart, tenant_id=_tenant_id(db, ns)))
    assert audit.ok, audit.problems


def test_reconcile_starts_a_bound_pod_that_was_never_metered(server, tenant, admin) -> None:
    db = server.services.db
    ns = tenant.tenant
    uid = bound_pod(tenant, admin, "old")["metadata"]["uid"]
    db.write(lambda s: s.execute(delete(UsageEvent).where(UsageEvent.pod_uid == uid)))
    before = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=_tenant_id(db, ns)))
    assert not before.ok and any("never billed" in p for p in before.problems)
    db.write(lambda s: ledger.reconcile(s, at=datetime.now(UTC)))
    bound_at = db.read(lambda s: s.scalar(select(Pod.bound_at).where(Pod.uid == uid)))
    (start,) = _events(db, uid)
    assert start.kind == "start" and start.at == whole_second(bound_at)
    after = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=_tenant_id(db, ns)))
    assert after.ok, after.problems


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=stories(max_pods=6))
def test_any_lifecycle_replayed_in_any_batches_gives_the_pure_folds_totals(db, data) -> None:
    """Random lifecycles written through `record` in random batches, each batch written twice,
    in shuffled order: the ledger's segments are the pure fold's, seconds equal held seconds."""
    story_list, now = data
    salt = uuid.uuid4().int >> 88  # not `random`: hypothesis seeds it the same for each example
    renamed = []
    for story in story_list:
        pod = PodRef(
            f"{salt:010x}-{story.pod.uid[-12:]}",
            90_000 + salt % 1000,
            story.pod.namespace,
            story.pod.name,
        )
        renamed.append(
            [Transition(pod, t.reason, t.at, t.spec, t.seq, t.node_name) for t in story.transitions]
        )
    transitions = [t for ts in renamed for t in ts]
    rnd = random.Random(salt)
    rnd.shuffle(transitions)
    while transitions:
        size = rnd.randint(1, 5)
        batch, transitions = transitions[:size], transitions[size:]
        db.write(lambda s, b=batch: ledger.record(s, b))
        db.write(lambda s, b=batch: ledger.record(s, list(reversed(b))))
    for ts, story in zip(renamed, story_list, strict=True):
        uid = ts[0].pod.uid
        usage = db.read(lambda s, uid=uid: ledger.usage(s, pod_uid=uid))[uid]
        assert usage.billed_seconds(now) == story.held_seconds(now)
        assert usage.segments == fold(t.event() for t in ts)[uid].segments


def test_record_refuses_a_start_without_a_spec() -> None:
    with pytest.raises(ValueError, match="needs the spec"):
        Transition(PodRef("u", 1, "n", "p"), Reason.BIND, T0).event()
    assert SPECS
