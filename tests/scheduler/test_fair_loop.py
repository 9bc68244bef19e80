"""Fair share and the maximum pending time through the real scheduling loop, on both databases,
with every pod, tenant and node made over real HTTP.

Cycles are counted, never seconds: the loop runs by a fixed clock, so no back-off is ever over
by time; a pod is tried again only when it is new, or when capacity was given back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.auth import service as auth
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.settings import Settings
from scheduler.loop import CONTENDED, CycleResult, LoopConfig, SchedulingLoop
from tests.conftest import Api, ThreadedServer, migrated_database, unique
from tests.factories import gpu_node, pod

POOL_LABEL = "tessera.io/test-pool"
MERGE = {"Content-Type": "application/merge-patch+json"}
NOW = 1000.0  # the loops' clock: it never moves


@dataclass
class Stack:
    db: Database
    server: ThreadedServer
    admin: Api

    def tenant(self, weight: int | None = None) -> Api:
        name = unique("fs")
        body: dict[str, Any] = {"metadata": {"name": name}}
        if weight is not None:
            body["spec"] = {"weight": weight}
        created = self.admin.post("/apis/tessera.io/v1/tenants", json=body)
        assert created.status_code == 201, created.text
        token = self.db.write(lambda s: auth.create_token(s, role="tenant", tenant=name)).value
        return Api(self.server.url, token, tenant=name)


@pytest.fixture(scope="module")
def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A database and an API server of this module's own: its loops count every pending pod
    of their pools, which no other test's node loop may start or end meanwhile."""
    backend = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    with migrated_database(backend, tmp_path_factory) as url:
        db = Database(url)
        bootstrap(db)
        settings = Settings(
            data_dir=Path(tmp_path_factory.mktemp("fair")),
            database_url=url,
            auth_cache_seconds=0,
            rate_limit_per_second=0,
            node_rate_limit_per_second=0,
            auth_failures_per_second=0,
            callback_delivery=False,
        )
        with ThreadedServer(settings, db) as server:
            token = db.write(lambda s: auth.create_token(s, role="admin")).value
            yield Stack(db, server, Api(server.url, token))
        db.dispose()


class Pool:
    """Nodes of a pool of their own, and a scheduler that places only this pool's pods."""

    def __init__(self, stack: Stack, **config: Any) -> None:
        self.stack, self.name = stack, unique("fair-")
        self.loop = SchedulingLoop(stack.db, LoopConfig(scheduler_name=self.name, **config))
        self.cycles = 0

    def node(self, gpus: int) -> str:
        name = unique("fn-")
        manifest = gpu_node(name, gpus=gpus, zone=self.name)
        manifest["metadata"]["labels"][POOL_LABEL] = self.name
        created = self.stack.admin.post("/api/v1/nodes", json=manifest)
        assert created.status_code == 201, created.text
        return name

    def pods(self, api: Api, prefix: str, count: int = 1, gpus: int = 1) -> list[str]:
        names = []
        for i in range(count):
            body = pod(f"{prefix}-{i}", cpu="4", memory="16Gi", gpus=gpus)
            body["spec"]["schedulerName"] = self.name
            body["spec"]["nodeSelector"] = {POOL_LABEL: self.name}
            created = api.post(f"/api/v1/namespaces/{api.tenant}/pods", json=body)
            assert created.status_code == 201, created.text
            names.append(f"{prefix}-{i}")
        return names

    def cycle(self) -> CycleResult:
        self.cycles += 1
        return self.loop.run_once(now=NOW)


def listed(api: Api) -> list[dict[str, Any]]:
    answer = api.get(f"/api/v1/namespaces/{api.tenant}/pods")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def bound(api: Api) -> set[str]:
    return {p["metadata"]["name"] for p in listed(api) if p["spec"].get("nodeName")}


def read(api: Api, name: str) -> dict[str, Any]:
    answer = api.get(f"/api/v1/namespaces/{api.tenant}/pods/{name}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def delete_now(api: Api, name: str) -> None:
    gone = api.delete(f"/api/v1/namespaces/{api.tenant}/pods/{name}?gracePeriodSeconds=0")
    assert gone.status_code == 200, gone.text


def test_a_flood_by_one_tenant_does_not_delay_another_tenants_pods(stack: Stack) -> None:
    """Tenant a creates 200 one-GPU pods for a pool of 8 GPUs, then b creates one: the first
    cycle binds b's pod with seven of a's, though 200 of a's came first and a cycle takes 64.
    Then, while a's flood waits, b creates a pod at a time and a GPU is given back each time:
    b's pod is bound by the first cycle after the GPU is free (the second after its create),
    and a takes whatever b leaves (the pool stays full)."""
    pool = Pool(stack, batch=64)
    pool.node(gpus=8)
    flooding, other = stack.tenant(), stack.tenant()
    flood = pool.pods(flooding, "flood", 200)
    pool.pods(other, "first")

    result = pool.cycle()
    assert result.bound == 8
    assert bound(other) == {"first-0"}
    assert len(bound(flooding)) == 7

    for round_ in range(3):
        created_at = pool.cycles
        (name,) = pool.pods(other, f"later{round_}")
        assert pool.cycle().bound == 0  # the pool is full: it waits
        assert name not in bound(other)
        delete_now(flooding, sorted(bound(flooding))[0])  # a GPU is given back
        assert pool.cycle().bound == 1
        assert name in bound(other)
        assert pool.cycles - created_at <= 2
    assert len(bound(flooding)) == 4 and len(bound(other)) == 4
    assert len(listed(flooding)) == len(flood) - 3  # the rest of the flood still waits

    # the flood is told why it waits: what was free went to a tenant below its fair share
    waiting = [p for p in listed(flooding) if not p["spec"].get("nodeName")]
    messages = {
        c.get("message", "")
        for p in waiting
        for c in p["status"].get("conditions", [])
        if c["type"] == "PodScheduled"
    }
    assert any(CONTENDED.strip("; ") in m for m in messages), messages


def test_a_tenant_given_twice_the_weight_gets_twice_the_share(stack: Stack) -> None:
    """Two pools of 12 GPUs, two tenants each, 30 one-GPU pods each, the first tenant's
    created first. With equal weights the GPUs go 6 and 6; once the admin gives the first
    tenant weight 2 (PATCH over HTTP), 8 and 4."""
    shares: dict[str, tuple[int, int]] = {}
    for label, weight in (("equal", 1), ("weighted", 2)):
        pool = Pool(stack)
        pool.node(gpus=8)
        pool.node(gpus=4)
        heavy, light = stack.tenant(), stack.tenant()
        if weight != 1:
            patched = stack.admin.patch(
                f"/apis/tessera.io/v1/tenants/{heavy.tenant}",
                json={"spec": {"weight": weight}},
                headers=MERGE,
            )
            assert patched.status_code == 200, patched.text
            assert patched.json()["spec"] == {"weight": weight}
        pool.pods(heavy, "h", 30)
        pool.pods(light, "l", 30)
        assert pool.cycle().bound == 12
        shares[label] = (len(bound(heavy)), len(bound(light)))
    assert shares == {"equal": (6, 6), "weighted": (8, 4)}


def test_the_weight_is_the_admins_and_bounded(stack: Stack) -> None:
    api = stack.tenant(weight=3)
    path = f"/apis/tessera.io/v1/tenants/{api.tenant}"
    assert stack.admin.get(path).json()["spec"] == {"weight": 3}
    refused = stack.admin.patch(path, json={"spec": {"weight": 0}}, headers=MERGE)
    assert refused.status_code == 422, refused.text
    assert "spec.weight" in refused.json()["message"]
    assert api.patch(path, json={"spec": {"weight": 1000}}, headers=MERGE).status_code == 403
    assert stack.admin.get(path).json()["spec"] == {"weight": 3}


def test_a_pod_pending_longer_than_the_maximum_fails_with_its_reason(stack: Stack) -> None:
    """With a maximum pending time of 0 s, a pod that does not fit fails at the end of the
    cycle that tried it (phase Failed, reason PendingTimeout, why it did not fit, an event),
    while the one that fits is bound; a failed pod is never bound afterwards. A maximum of an
    hour leaves a pod that does not fit Pending."""
    pool = Pool(stack, max_pending_seconds=0)
    pool.node(gpus=1)
    api = stack.tenant()
    fits, late = pool.pods(api, "fits")[0], pool.pods(api, "late")[0]
    result = pool.cycle()
    assert (result.bound, result.failed) == (1, 1)
    assert bound(api) == {fits}
    failed = read(api, late)
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["reason"] == "PendingTimeout"
    assert "longer than the maximum pending time of 0s" in failed["status"]["message"]
    # why it did not fit, in the solver's words: the one GPU went to the other pod
    assert "it did not fit: fits on 1/" in failed["status"]["message"]
    assert "took that capacity" in failed["status"]["message"]
    events = api.get(f"/api/v1/namespaces/{api.tenant}/events").json()["items"]
    assert [e["type"] for e in events if e["reason"] == "PendingTimeout"] == ["Warning"]
    assert {e["involvedObject"]["name"] for e in events if e["reason"] == "PendingTimeout"} == {
        late
    }

    delete_now(api, fits)  # the GPU is free again: the failed pod stays failed
    assert pool.cycle().bound == 0
    assert read(api, late)["status"]["phase"] == "Failed"
    assert not read(api, late)["spec"].get("nodeName")

    patient = Pool(stack, max_pending_seconds=3600)
    patient.node(gpus=1)
    names = patient.pods(api, "patient", 2)
    assert (patient.cycle().bound, patient.cycle().failed) == (1, 0)
    phases = Counter(read(api, n)["status"]["phase"] for n in names)
    assert phases == {"Pending": 2} or phases == {"Pending": 1, "Running": 1}


def test_the_maximum_pending_time_is_an_operator_setting_off_by_default() -> None:
    assert Settings().max_pending_seconds is None
    assert LoopConfig.from_settings(Settings()).max_pending_seconds is None
    assert LoopConfig.from_settings(Settings(max_pending_seconds=600)).max_pending_seconds == 600
