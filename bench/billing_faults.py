"""Billing through process faults: real processes (`tessera serve`, `tessera scheduler`, the node
loop `tessera agent`, virtual node agents `tessera agent --virtual`) on a real database, killed
with SIGKILL while pods are in every phase of their lives, and restarted after a while; then what
was billed is compared with what the nodes observed.

One *cell* kills one component (or all of them) for a downtime, with pods at once:
- `run`: running since well before the kill, still running;
- `fin`: a job that ends halfway through the downtime;
- `del`: deleted (grace 2 s) just before the kill, its containers stopping during the downtime;
- `new`: created just before the kill (pending, binding or starting when it comes).

What each pod should have been billed, by the documented policy: from its bind to the end its node
observed (its containers' last `finishedAt`; a deleted pod's grace deadline at the latest; a pod
still running: now), less the silences of its node (its node renewed no lease for longer than
the lease: not billed; a node never back: billed to its last renewal). The error of a pod is what
was billed minus that. A cell also checks that no pod ran twice (a container started again from
the beginning after a restart) and runs the billing audit over the cell's tenant.

Used by tests/faults/test_process_matrix.py and `tessera bench billing --faults N`.
"""

from __future__ import annotations

import os
import random
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import select

from app.auth import service as auth
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Change, Pod
from app.inventory import service as inventory
from billing import ledger
from billing.usage import PodUsage, finished_at, whole_second

TESSERA = str(Path(sys.executable).with_name("tessera"))
# A process restarts in seconds (imports, the database checked, TLS, its first requests: 5-7 s
# on a busy two-core machine), so a "short" downtime is shorter than a lease only with leases
# longer than that.
LEASE = 10.0  # seconds: a node's lease
LOST_GRACE = 10.0  # seconds after the lease expired that a node's pods are lost
HEARTBEAT = 0.3
TIMING = {
    "TESSERA_NODE_LEASE_SECONDS": str(int(LEASE)),
    "TESSERA_NODE_LOST_GRACE_SECONDS": str(int(LOST_GRACE)),
    "TESSERA_AGENT_HEARTBEAT_SECONDS": str(HEARTBEAT),
    "TESSERA_AGENT_START_DELAY_SECONDS": "0.2",
    "TESSERA_AGENT_STOP_SECONDS": "0.5",
    "TESSERA_WATCH_POLL_SECONDS": "0.2",
    "TESSERA_AGENT_LOG_STEP_SECONDS": "5",
    "TESSERA_AUTH_CACHE_SECONDS": "0",
    "TESSERA_RATE_LIMIT_PER_SECOND": "0",
    "TESSERA_NODE_RATE_LIMIT_PER_SECOND": "0",
    "TESSERA_WATCH_BOOKMARK_SECONDS": "1",
    "TESSERA_CALLBACK_DELIVERY": "false",
}
COMPONENTS = ("serve", "scheduler", "control", "agents")
TARGETS = ("serve", "scheduler", "agents", "all")
# Downtimes (the sleep between the kill and the restart; the restart itself adds seconds):
# shorter than the lease; past the lease (the nodes are silent, not yet lost); past the lease
# and the lost grace (the nodes' pods are lost unless they renewed).
DOWNTIMES = {"short": 0.5, "past-lease": 11.0, "past-lost": 22.0}
GRACE = 2  # the `del` pod's grace period
STARTED = "tessera-runtime: started container"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Plane:
    """A control plane of separate processes, each of which can be killed and started again."""

    def __init__(self, database_url: str, data_dir: Path, *, nodes: int = 2) -> None:
        self.database_url = database_url
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "TESSERA_DATA_DIR": str(data_dir),
            "TESSERA_DATABASE_URL": database_url,
            "TESSERA_PORT": str(self.port),
            **TIMING,
        }
        self.env.pop("TESSERA_REDIS_URL", None)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        upgrade(database_url)
        self.db = Database(database_url)
        bootstrap(self.db)
        self.nodes = [f"fn-{uuid.uuid4().hex[:6]}-{i}" for i in range(nodes)]
        entries = []
        for name in self.nodes:
            spec = inventory.NodeSpec(
                name, 16000, 65536, compute_classes=("general-purpose",), zone="faults"
            )
            self.db.write(partial(inventory.create_node, spec=spec))
            token = self.db.write(partial(auth.create_token, role="node", node=name))
            entries.append({"name": name, "token": token.value})
        self.admin_token = self.db.write(lambda s: auth.create_token(s, role="admin")).value
        self.inventory = data_dir / "virtual-nodes.yaml"
        self.inventory.write_text(
            yaml.safe_dump(
                {"server": self.url, "caCert": str(data_dir / "tls" / "ca.crt"), "nodes": entries}
            )
        )
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            verify = ssl.create_default_context(cafile=str(self.data_dir / "tls" / "ca.crt"))
            self._http = httpx.Client(
                base_url=self.url,
                headers={"Authorization": f"Bearer {self.admin_token}"},
                verify=verify,
                timeout=10,
            )
        return self._http

    def start(self, what: str) -> None:
        args = {
            "serve": ["serve"],
            "scheduler": ["scheduler", "--interval", "0.1", "--min-interval", "0.02"],
            "control": ["agent", "--interval", "0.1"],
            "agents": ["agent", "--virtual", "--nodes", str(self.inventory)],
        }[what]
        log = (self.data_dir / f"{what}.log").open("a")
        self.procs[what] = subprocess.Popen(
            [TESSERA, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        if what == "serve":
            until(self._ready, 180, "tessera serve to answer")

    def _ready(self) -> bool:
        proc = self.procs["serve"]
        if proc.poll() is not None:
            raise RuntimeError((self.data_dir / "serve.log").read_text()[-3000:])
        if not (self.data_dir / "tls" / "ca.crt").exists():
            return False
        try:
            return self.http.get("/readyz", timeout=1).is_success
        except httpx.HTTPError:
            return False

    def start_all(self, since: datetime | None = None) -> None:
        """Every process running, every node Ready; with `since`, also every node's renewal
        after it seen by the node loop (it keeps them with its heartbeats): the loop and the
        agents are both back, not just started."""
        for what in COMPONENTS:
            if what not in self.procs:
                self.start(what)
        for node in self.nodes:
            until(partial(self._ready_node, node), 180, f"node {node} Ready")
        if since is not None:
            until(partial(self._renewed_since, since), 180, "the node loop to see the nodes renew")

    def _renewed_since(self, since: datetime) -> bool:
        seen = self.db.read(ledger.last_renewals)
        return all(node in seen and seen[node][0] > since for node in self.nodes)

    def _ready_node(self, node: str) -> bool:
        try:
            got = self.http.get(f"/api/v1/nodes/{node}")
        except httpx.HTTPError:
            return False
        lease = self.http.get(
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        )
        ready = got.json()["status"]["conditions"][0]["status"] == "True"
        return got.is_success and ready and lease.status_code == 200

    def kill(self, what: str) -> None:
        proc = self.procs.pop(what, None)
        if proc is not None:
            proc.send_signal(signal.SIGKILL)  # no goodbye
            proc.wait(timeout=10)
        if what == "serve" and self._http is not None:
            self._http.close()
            self._http = None

    def close(self) -> None:
        for what in list(self.procs):
            proc = self.procs.pop(what)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self._http is not None:
            self._http.close()
        self.db.dispose()

    # --- pods ---------------------------------------------------------------------------------

    def tenant(self) -> str:
        name = f"ft{uuid.uuid4().hex[:8]}"
        made = self.http.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}})
        made.raise_for_status()
        return name

    def create(self, ns: str, name: str, run_seconds: float | None = None) -> None:
        annotations = {} if run_seconds is None else {"tessera.io/run-seconds": f"{run_seconds}"}
        resources = {"cpu": "1", "memory": "1Gi"}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": GRACE,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/app:1.0",
                        "resources": {"requests": resources, "limits": resources},
                    }
                ],
            },
        }
        self.http.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()

    def phase(self, ns: str, name: str) -> str | None:
        got = self.http.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return str(got.json()["status"]["phase"]) if got.status_code == 200 else None

    def clean(self, ns: str) -> None:
        """Every pod of the namespace removed at once (grace 0)."""
        listed = self.http.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
        for item in listed:
            name = item["metadata"]["name"]
            self.http.delete(
                f"/api/v1/namespaces/{ns}/pods/{name}", params={"gracePeriodSeconds": "0"}
            )


@dataclass
class PodCheck:
    name: str
    billed: int
    expected: int
    pauses: list[tuple[datetime, datetime | None]]
    ended: str  # how its end was known

    @property
    def error(self) -> int:
        return self.billed - self.expected


@dataclass
class Cell:
    target: str
    downtime: str
    namespace: str = ""
    killed_at: datetime | None = None
    restarted_at: datetime | None = None  # when the restart began
    back_at: datetime | None = None  # when every process was back and every node Ready
    pods: list[PodCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # when a job was to end, by its plan (the truth where its node's report never came)
    planned_ends: dict[str, datetime] = field(default_factory=dict)

    @property
    def largest_error(self) -> int:
        return max((abs(p.error) for p in self.pods), default=0)


def run_cell(plane: Plane, target: str, downtime: str, *, lead: float = 1.0) -> Cell:
    """Kill `target` ("all": every process) for the `downtime` while pods are in each phase,
    start it again, let things settle, and measure. The plane is whole again afterwards."""
    cell = Cell(target, downtime, plane.tenant())
    ns, seconds = cell.namespace, DOWNTIMES[downtime]
    plane.create(ns, "run")
    plane.create(ns, "del")
    until(
        lambda: all(plane.phase(ns, n) == "Running" for n in ("run", "del")),
        30,
        "the pods running",
    )
    # the job last: it must end during the downtime, `lead` after it is seen running
    run_seconds = round(lead + seconds / 2, 2)
    plane.create(ns, "fin", run_seconds=run_seconds)
    until(lambda: plane.phase(ns, "fin") == "Running", 30, "the job running")
    # it runs for run_seconds from about now (its agent reported it Running just before)
    cell.planned_ends["fin"] = datetime.now(UTC) + timedelta(seconds=run_seconds)
    kill_at = time.monotonic() + lead
    time.sleep(max(0.0, kill_at - 0.3 - time.monotonic()))
    plane.http.delete(f"/api/v1/namespaces/{ns}/pods/del").raise_for_status()
    plane.create(ns, "new")
    time.sleep(max(0.0, kill_at - time.monotonic()))
    victims = list(COMPONENTS) if target == "all" else [target]
    cell.killed_at = datetime.now(UTC)
    for what in victims:
        plane.kill(what)
    time.sleep(seconds)
    cell.restarted_at = datetime.now(UTC)
    for what in ("serve", *[v for v in victims if v != "serve"]):
        if what in victims:
            plane.start(what)
    plane.start_all(since=cell.killed_at + timedelta(seconds=seconds))
    cell.back_at = datetime.now(UTC)
    _settle(plane, ns)
    measure(plane, cell)
    plane.clean(ns)
    return cell


def _settle(plane: Plane, ns: str, timeout: float = 30.0) -> None:
    """Until the job has ended, the deleted pod is gone and the new one runs (or the timeout:
    a pod left hanging is what the measure is for)."""

    def settled() -> bool:
        return (
            plane.phase(ns, "fin") in ("Succeeded", "Failed")
            and plane.phase(ns, "del") is None
            and plane.phase(ns, "new") in ("Running", "Failed")
        )

    with suppress(TimeoutError):
        until(settled, timeout, "the pods to settle")
    time.sleep(1.0)  # late reports, and a node loop pass


def measure(plane: Plane, cell: Cell) -> None:
    """What each pod of the cell was billed against what it should have been, whether any ran
    twice, and the audit of the cell's tenant."""
    ns = cell.namespace
    now = whole_second(datetime.now(UTC))

    def read(session: Any) -> tuple[dict[str, PodUsage], dict[str, Any], dict[str, Any], Any]:
        usages = ledger.usage(session, namespace=ns)
        live = {
            r["uid"]: r
            for r in session.execute(select(Pod.__table__).where(Pod.namespace == ns)).mappings()
        }
        gone = {
            obj["metadata"]["uid"]: obj
            for (obj,) in session.execute(
                select(Change.object).where(
                    Change.kind == "Pod", Change.type == "DELETED", Change.namespace == ns
                )
            )
        }
        tenant = session.scalar(select(Pod.tenant_id).where(Pod.namespace == ns)) or next(
            (u.pod.tenant_id for u in usages.values()), None
        )
        audit = ledger.audit(session, at=now, tenant_id=tenant)
        return usages, live, gone, audit

    usages, live, gone, audit = plane.db.read(read)
    cell.problems += audit.problems
    for uid, usage in usages.items():
        if usage.started is None:
            continue
        end, how = _observed_end(live.get(uid), gone.get(uid), usage)
        planned = cell.planned_ends.get(usage.pod.name)
        if planned is not None and end is None:
            # a job ends when its run does, reported or not (its report was lost: still
            # running in the ledger's view); a report, when there is one, is more exact
            end, how = planned, f"planned end ({how} in the ledger's view)"
        end = max(end or now, usage.started)
        # not billed while its node was silent, up to the end
        expected = int((end - usage.started).total_seconds()) - usage.paused_seconds(end)
        cell.pods.append(
            PodCheck(usage.pod.name, usage.billed_seconds(now), expected, list(usage.pauses), how)
        )
        cell.problems += _pause_problems(cell, usage)
    for row in live.values():
        text = plane.http.get(f"/api/v1/namespaces/{ns}/pods/{row['name']}/log")
        if text.status_code == 200 and text.text.count(STARTED) > 1:
            cell.problems.append(f"{row['name']}: its container started again from the beginning")
    for check in cell.pods:
        if abs(check.error) > 1:
            cell.problems.append(
                f"{check.name}: billed {check.billed} s, ran {check.expected} s ({check.ended})"
            )


def _observed_end(
    row: Any, obj: dict[str, Any] | None, usage: PodUsage
) -> tuple[datetime | None, str]:
    """When the pod's run ended, as its node observed it (None: it still runs)."""
    if row is not None:
        if row["status_reason"] == "NodeLost":
            return usage.stopped, "lost: its node's last renewal"
        if row["phase"] in ("Succeeded", "Failed"):
            return finished_at(row["container_statuses"]) or usage.stopped, "reported end"
        return None, "running"
    if obj is None:
        return usage.stopped, "removed (no record)"
    reported = finished_at(obj.get("status", {}).get("containerStatuses"))
    text = obj["metadata"].get("deletionTimestamp")
    deadline = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    ends = [t for t in (reported, deadline) if t is not None]
    return (min(ends) if ends else usage.stopped), "deleted"


def _pause_problems(cell: Cell, usage: PodUsage) -> list[str]:
    """A pause is a node's silence: only where the node could not renew past its lease (the
    API or its agent down that long), from about the kill to about the restart; and a node
    silent well past its lease is not billed for it."""
    out = []
    assert cell.killed_at is not None and cell.back_at is not None
    # how long the nodes could not renew: from the kill until every process was back
    silence = (cell.back_at - cell.killed_at).total_seconds()
    silent_possible = cell.target != "scheduler" and silence > LEASE - 1
    for start, end in usage.pauses:
        if not silent_possible:
            out.append(f"{usage.pod.name}: paused at {start} though no node was silent")
            continue
        # the last renewal seen: by the node loop before the kill, or the one it kept (every
        # tenth pass) when it was killed too
        earliest = cell.killed_at - timedelta(seconds=HEARTBEAT + 3)
        if not earliest <= start <= cell.killed_at + timedelta(seconds=1):
            out.append(f"{usage.pod.name}: paused at {start}, not at the kill ({cell.killed_at})")
        # resumed once the node loop sees the node renew: a restarted loop needs its start
        if end is not None and not cell.killed_at < end <= cell.back_at + timedelta(seconds=15):
            out.append(f"{usage.pod.name}: resumed at {end}, not once back ({cell.back_at})")
    held_through = (
        usage.started is not None
        and usage.started < cell.killed_at - timedelta(seconds=1)
        and (usage.stopped is None or usage.stopped > cell.killed_at + timedelta(seconds=1))
    )
    if cell.target != "scheduler" and silence > LEASE + 2 and held_through and not usage.pauses:
        out.append(f"{usage.pod.name}: billed through {silence:.0f} s of its node's silence")
    return out


@contextmanager
def plane_on(database_url: str, data_dir: Path) -> Iterator[Plane]:
    plane = Plane(database_url, data_dir)
    try:
        plane.start_all()
        yield plane
    finally:
        plane.close()


def random_cells(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(rng.choice(TARGETS), rng.choice(list(DOWNTIMES))) for _ in range(count)]


# --- `tessera bench billing --faults N` ---------------------------------------------------------


def bench(database: str, count: int, seed: int, out: Path | None, postgres_url: str) -> None:
    """N random fault schedules (a target and a downtime each) on a fresh database: the largest
    billing error of each, and over all of them; a plot of them (out/faults.png)."""
    import json
    import tempfile

    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="tessera-faults-") as folder:
        if database == "postgresql":
            from bench.api_create import _fresh_postgres

            url, drop = _fresh_postgres(postgres_url)
        else:
            url, drop = f"sqlite:///{Path(folder) / 'faults.db'}", (lambda: None)
        try:
            with plane_on(url, Path(folder)) as plane:
                for i, (target, downtime) in enumerate(random_cells(count, seed), 1):
                    cell = run_cell(plane, target, downtime)
                    cells.append(cell)
                    print(
                        f"{i:>3}. {target:<9} {downtime:<10} largest error {cell.largest_error:>4} s"
                        + (f"  ({len(cell.problems)} problems)" if cell.problems else ""),
                        flush=True,
                    )
                    for problem in cell.problems:
                        print(f"       {problem}", flush=True)
        finally:
            drop()
    largest = max((c.largest_error for c in cells), default=0)
    clean = [c for c in cells if not c.problems]
    print(
        f"largest billing error over {len(cells)} fault schedules: {largest} s "
        f"(goal: 1 s); {len(clean)} schedules with no problem; largest among them: "
        f"{max((c.largest_error for c in clean), default=0)} s"
    )
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "target": c.target,
            "downtime": c.downtime,
            "silence_seconds": round((c.back_at - c.killed_at).total_seconds(), 1)
            if c.back_at and c.killed_at
            else None,
            "largest_error_seconds": c.largest_error,
            "pods": [
                {"name": p.name, "billed": p.billed, "expected": p.expected, "ended": p.ended}
                for p in c.pods
            ],
            "problems": c.problems,
        }
        for c in cells
    ]
    (out / "faults.json").write_text(
        json.dumps({"database": database, "seed": seed, "cells": rows}, indent=2) + "\n"
    )
    _plot(cells, out / "faults.png", database)
    print(f"wrote {out / 'faults.json'} and {out / 'faults.png'}")


def _plot(cells: list[Cell], path: Path, database: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colours = {
        "serve": "tab:blue",
        "scheduler": "tab:green",
        "agents": "tab:orange",
        "all": "tab:red",
    }
    for i, cell in enumerate(cells):
        ax.bar(
            i,
            max(cell.largest_error, 0.05),
            color=colours.get(cell.target, "grey"),
            hatch="//" if cell.problems else None,
            edgecolor="black",
            linewidth=0.5,
        )
    ax.axhline(1, color="black", linestyle="--", linewidth=1, label="goal: 1 s")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{c.target}\n{c.downtime}" for c in cells], fontsize=7, rotation=90)
    ax.set_ylabel("largest billing error of a pod (s)")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_title(f"Billing error per random fault schedule ({database}; hatched: a problem found)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend([*handles, ax.lines[0]], [*colours, "goal: 1 s"], fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
