"""One active scheduler, with real processes on both databases: two `tessera scheduler`
processes elect a leader through the Lease kube-system/<name>-scheduler; the leader is SIGKILLed
again and again while pods and gangs arrive, a standby takes over each time, and in the end every
pod was bound exactly once, every gang whole, and no capacity leaked."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.db.engine import Database
from app.db.models import GPUAllocation, GPUDevice, Node, Pod
from tests.conftest import unique
from tests.e2e.conftest import TESSERA, Process
from tests.factories import gpu_node, pod

POOL = "tessera.io/test-pool"
ROUNDS = 3
LEASE_SECONDS = 2


class Schedulers:
    def __init__(self, tessera: Process, name: str, logs: Path) -> None:
        self.tessera, self.name, self.logs = tessera, name, logs
        self.running: dict[int, subprocess.Popen[bytes]] = {}
        self.env = {**tessera.env, "TESSERA_SCHEDULER_LEASE_SECONDS": str(LEASE_SECONDS)}

    def start(self) -> None:
        log = (self.logs / f"scheduler-{len(self.running)}-{time.monotonic_ns()}.log").open("w")
        process = subprocess.Popen(
            [TESSERA, "scheduler", "--scheduler-name", self.name, "--interval", "0.2"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.running[process.pid] = process

    def holder(self) -> int | None:
        """The pid of the process holding the lease now (holders are `host_pid_random`)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{self.name}-scheduler"
        with self.tessera.admin() as http:
            response = http.get(path)
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        holder = response.json()["spec"].get("holderIdentity", "")
        return int(holder.split("_")[-2])

    def wait_for_leader(self, other_than: int | None = None, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.holder()
            if pid is not None and pid != other_than and pid in self.running:
                return pid
            time.sleep(0.1)
        raise AssertionError(f"no scheduler took the lease (was {other_than})")

    def stop(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.terminate()
        for process in self.running.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def schedulers(tessera: Process, tmp_path: Path) -> Iterator[Schedulers]:
    running = Schedulers(tessera, unique("ha-"), tmp_path)
    yield running
    running.stop()


def test_a_standby_takes_over_from_a_killed_leader_and_nothing_is_half_bound(
    tessera: Process, schedulers: Schedulers, database_url: str
) -> None:
    name = schedulers.name
    ns = unique("hat")
    tessera.create_tenant(ns)
    nodes = [unique("han-") for _ in range(2)]
    with tessera.admin() as http:
        for node in nodes:
            body = gpu_node(node, gpus=8, zone=unique("haz"))
            body["metadata"]["labels"][POOL] = name
            assert http.post("/api/v1/nodes", json=body).status_code == 201

    def in_pool(document: dict) -> dict:
        document["spec"]["schedulerName"] = name
        document["spec"]["nodeSelector"] = {POOL: name}
        return document

    schedulers.start()
    schedulers.start()
    leader = schedulers.wait_for_leader()
    created: list[str] = []
    gangs: dict[str, list[str]] = {}
    takeovers = []
    for round_ in range(ROUNDS):
        with tessera.admin() as http:
            group = f"gang-{round_}"
            made = http.post(
                f"/apis/tessera.io/v1/namespaces/{ns}/podgroups",
                json={"metadata": {"name": group}, "spec": {"minMember": 2}},
            )
            assert made.status_code == 201, made.text
            gangs[group] = [f"{group}-{i}" for i in range(2)]
            for member in gangs[group]:
                body = in_pool(pod(member, gpus=1, labels={"tessera.io/pod-group": group}))
                assert http.post(f"/api/v1/namespaces/{ns}/pods", json=body).status_code == 201
            for i in range(2):
                single = f"single-{round_}-{i}"
                body = in_pool(pod(single, gpus=1))
                assert http.post(f"/api/v1/namespaces/{ns}/pods", json=body).status_code == 201
                created.append(single)
        created.extend(gangs[group])
        time.sleep(0.1 * round_)  # kill it before, during or after it binds this round's pods
        os.kill(leader, signal.SIGKILL)
        killed_at = time.monotonic()
        schedulers.running.pop(leader).wait(timeout=10)
        schedulers.start()  # a new standby, so that there are two again
        leader = schedulers.wait_for_leader(other_than=leader)
        takeovers.append(time.monotonic() - killed_at)
    print(f"takeover after a SIGKILL: {', '.join(f'{t:.1f}' for t in takeovers)} s")

    with tessera.admin() as http:
        deadline = time.monotonic() + 60
        while True:
            listed = http.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
            bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in listed}
            if all(bound.get(p) for p in created) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(bound.get(p) for p in created), bound
        events = http.get(
            f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "reason=Scheduled"}
        ).json()["items"]
    scheduled: dict[str, int] = {}
    for event in events:
        scheduled[event["involvedObject"]["name"]] = scheduled.get(
            event["involvedObject"]["name"], 0
        ) + event.get("count", 1)
    assert scheduled == dict.fromkeys(created, 1)  # bound once each, by one scheduler

    db = Database(database_url)
    try:
        with db.session(write=False) as session:
            for node in nodes:
                # No capacity leaked: what is free is what the pods bound to the node leave.
                held = session.scalar(
                    select(func.count())
                    .select_from(GPUAllocation)
                    .join(GPUDevice, GPUDevice.name == GPUAllocation.gpu_name)
                    .where(GPUDevice.node_name == node)
                )
                pods_there = session.scalar(
                    select(func.count()).select_from(Pod).where(Pod.node_name == node)
                )
                assert held == pods_there
                free = session.scalar(
                    select(func.count())
                    .select_from(GPUDevice)
                    .where(GPUDevice.node_name == node, GPUDevice.core_free_pct == 100)
                )
                assert free == 8 - pods_there
                row = session.get(Node, node)
                assert row is not None and row.cpu_free_milli >= 0
    finally:
        db.dispose()
