"""`tessera bench stall`: a writer that stalls holds no other writer up.

The production shape on PostgreSQL (`tessera serve`, two `tessera scheduler`s, one leading
and one standing by, and the node loop), a steady stream of pod creates from a few clients,
and, `--pauses` times, the scheduler that leads or the node loop SIGSTOPped for
`--pause-seconds` at a random moment, inside a write transaction when it opens one soon
enough (its connections are found in `pg_stat_activity` by their ports), then resumed (a long GC pause, a swapped-out process, a
stalled network). A process paused inside its transaction keeps its row locks until
PostgreSQL ends the transaction (`idle_in_transaction_session_timeout`); no write waits for
it unless it needs one of those rows: creates do not.

Measured: create latency (p50, p99, max) while a process is paused and while none is; for
each pause of the leader, how long until the standby held the scheduler's Lease (read
through the API every 100 ms); pods bound; and afterwards that no pod was bound twice and no
node holds more than it has. A plot shows each create's latency over time, pauses shaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from bench.api_create import _free_port, _fresh_postgres
from bench.burst import NAMESPACE, _tessera, start_stack
from bench.stats import quantile

LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-scheduler"


@dataclass
class Pause:
    target: str  # "scheduler" (the leader) or "node loop"
    started: float  # seconds since the run began
    seconds: float
    takeover: float | None = None  # the standby held the lease this long after the pause began
    # ...and this long after the stopped leader's lease expired (its last renewal committed,
    # plus the lease's duration, to the new holder's acquireTime: the database's clock)
    after_expiry: float | None = None
    in_transaction: bool = False  # stopped with a write transaction open


def _ports_of(pid: int) -> set[int]:
    """The local TCP ports of `pid`'s sockets (Linux: its fds' socket inodes, looked up in
    /proc/net/tcp and tcp6)."""
    inodes: set[str] = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


_OPEN_WRITES = (
    "SELECT client_port FROM pg_stat_activity WHERE datname = current_database()"
    " AND backend_xid IS NOT NULL AND state IN ('active', 'idle in transaction')"
)


class Watcher:
    """Tells whether a process has a write transaction open: one of its connections (matched
    by port) holds a transaction id in `pg_stat_activity`."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self._ports: dict[int, tuple[float, set[int]]] = {}

    def ports(self, pid: int) -> set[int]:
        read, ports = self._ports.get(pid, (0.0, set()))
        if time.monotonic() - read > 0.5:  # its pool may have opened connections since
            ports = _ports_of(pid)
            self._ports[pid] = (time.monotonic(), ports)
        return ports

    def writing(self, pid: int) -> bool:
        open_now = {row[0] for row in self.conn.execute(_OPEN_WRITES)}
        return bool(open_now & self.ports(pid))

    def stop_inside_a_transaction(self, process: Any, within: float) -> bool:
        """SIGSTOP `process` at a moment it has a write transaction open, if one comes within
        `within` seconds (else then); whether it was stopped inside one."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.writing(process.pid):
                process.send_signal(signal.SIGSTOP)
                if self.writing(process.pid):
                    return True
                process.send_signal(signal.SIGCONT)  # it had just committed: try again
        process.send_signal(signal.SIGSTOP)
        return self.writing(process.pid)

    def activity(self, owners: dict[str, int]) -> list[str]:
        """One line per connection of the processes `owners` names (name -> pid): its state,
        what it waits for and who blocks it, its transaction's age and statement; what a
        standby that does not take over is waiting for (`--logs`, activity.log)."""
        by_port = {port: name for name, pid in owners.items() for port in _ports_of(pid)}
        lines = []
        for port, pid, state, wait, blockers, age, xid, query in self.conn.execute(_ACTIVITY):
            if port in by_port:
                lines.append(
                    f"{by_port[port]} backend={pid} state={state} wait={wait} "
                    f"blocked_by={blockers} xact_age={age} xid={xid} query={query!r}"
                )
        return lines

    def lease_expiry(self) -> datetime | None:
        """When the scheduler's lease expires, as last renewed (committed)."""
        row = self.conn.execute(_EXPIRY).fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        self.conn.close()


_EXPIRY = (
    "SELECT renew_time + lease_duration_seconds * interval '1 second' FROM leases"
    " WHERE namespace = 'kube-system' AND name = 'tessera-scheduler'"
)


_ACTIVITY = (
    "SELECT client_port, pid, state, wait_event_type || ':' || wait_event,"
    " pg_blocking_pids(pid), round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 2),"
    " backend_xid, left(query, 100)"
    " FROM pg_stat_activity WHERE datname = current_database() ORDER BY client_port"
)


@dataclass
class StallResult:
    pauses: list[Pause] = field(default_factory=list)
    creates: list[tuple[float, float, int]] = field(default_factory=list)  # at, latency, status
    bound: int = 0
    created: int = 0
    bound_twice: int = 0
    overcommitted_nodes: int = 0
    lease_seconds: int = 4

    def latencies(self, *, paused: bool) -> list[float]:
        spans = [(p.started, p.started + p.seconds) for p in self.pauses]
        return [
            latency
            for at, latency, _ in self.creates
            if any(a <= at <= b for a, b in spans) == paused
        ]

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            if not values:
                return {"count": 0}
            return {
                "count": len(values),
                "p50_ms": round(quantile(values, 0.5) * 1000, 1),
                "p99_ms": round(quantile(values, 0.99) * 1000, 1),
                "max_ms": round(max(values) * 1000, 1),
            }

        takeovers = [p.takeover for p in self.pauses if p.takeover is not None]
        late = [p.after_expiry for p in self.pauses if p.after_expiry is not None]
        return {
            "pauses": len(self.pauses),
            "pause_seconds": self.pauses[0].seconds if self.pauses else 0,
            "scheduler_pauses": sum(p.target == "scheduler" for p in self.pauses),
            "inside_a_transaction": sum(p.in_transaction for p in self.pauses),
            "creates_while_paused": stats(self.latencies(paused=True)),
            "creates_otherwise": stats(self.latencies(paused=False)),
            "failed_creates": sum(status != 201 for _, _, status in self.creates),
            "takeover_s": {
                "count": len(takeovers),
                "max": round(max(takeovers), 2) if takeovers else None,
                "p50": round(quantile(takeovers, 0.5), 2) if takeovers else None,
            },
            "takeover_after_expiry_s": {
                "count": len(late),
                "min": round(min(late), 3) if late else None,
                "max": round(max(late), 2) if late else None,
                "p50": round(quantile(late, 0.5), 2) if late else None,
            },
            "lease_seconds": self.lease_seconds,
            "created": self.created,
            "bound": self.bound,
            "bound_twice": self.bound_twice,
            "overcommitted_nodes": self.overcommitted_nodes,
        }


class Creator:
    """`clients` connections, each creating a pod every `every` seconds (paced, not as fast as
    it can: a stall shows as the latency of the creates it held up)."""

    def __init__(self, port: int, ca: Path, token: str, clients: int, every: float) -> None:
        self.port, self.ca, self.token = port, ca, token
        self.clients, self.every = clients, every
        self.stop = threading.Event()
        self.creates: list[tuple[float, float, int]] = []
        self.origin = time.monotonic()
        self._count = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca))
        async with httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{self.port}",
            verify=context,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
            limits=httpx.Limits(max_connections=self.clients),
        ) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        await asyncio.sleep(self.every * index / self.clients)  # spread out
        next_at = time.monotonic()
        while not self.stop.is_set():
            self._count += 1
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"stall-{self._count}"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                        }
                    ]
                },
            }
            sent = time.monotonic()
            response = await client.post(path, json=doc)
            self.creates.append((sent - self.origin, time.monotonic() - sent, response.status_code))
            next_at = max(next_at + self.every, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())


def _lease(admin: httpx.Client) -> dict[str, Any]:
    """The scheduler lease's spec ({} when it cannot be read)."""
    response = admin.get(LEASE)
    if response.status_code != 200:
        return {}
    spec: dict[str, Any] = response.json().get("spec", {})
    return spec


def _holder(admin: httpx.Client) -> str | None:
    holder: str | None = _lease(admin).get("holderIdentity")
    return holder


def _pid_of(holder: str | None) -> int | None:
    """A scheduler's identity is host_pid_random."""
    if not holder:
        return None
    parts = holder.rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def run(
    *,
    pauses: int,
    pause_seconds: float,
    gap_seconds: float,
    clients: int,
    every: float,
    seed: int,
    url: str,
    redis_url: str | None,
    gpus: int = 1024,
    logs: Path | None = None,
) -> StallResult:
    from sqlalchemy.engine import make_url

    rng = random.Random(seed)
    result = StallResult()
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with tempfile.TemporaryDirectory(prefix="tessera-stall-") as tmp:
        data, port = Path(tmp), _free_port()
        stack = start_stack(
            "postgresql",
            data=data,
            url=url,
            port=port,
            gpus=gpus,
            redis_url=redis_url,
            logs=logs or data / "logs",
        )
        try:
            result.lease_seconds = int(stack.env.get("TESSERA_SCHEDULER_LEASE_SECONDS", "4"))
            standby = subprocess.Popen(
                [str(Path(sys.executable).with_name("tessera")), "scheduler"],
                env=stack.env,
                stdout=subprocess.DEVNULL,
                stderr=((logs or data / "logs") / "standby.log").open("wb"),
            )
            stack.processes["standby"] = standby
            admin_token = _tessera(stack.env, "token", "create", "--admin")
            ca = data / "tls" / "ca.crt"
            admin = httpx.Client(
                base_url=f"https://127.0.0.1:{port}",
                verify=str(ca),
                headers={"Authorization": f"Bearer {admin_token}"},
                timeout=30,
            )
            deadline = time.monotonic() + 60
            while _holder(admin) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            creator = Creator(port, ca, stack.token, clients, every)
            creator.start()
            watcher = Watcher(conninfo)
            # what the processes' connections wait for while a standby has not taken over
            activity = (logs / "activity.log").open("a") if logs is not None else None
            schedulers = {p.pid: p for p in (stack.processes["scheduler"], standby)}
            for index in range(pauses):
                time.sleep(rng.uniform(0.5, 1.5) * gap_seconds)
                target = rng.choice(["scheduler", "node loop"])
                holder = _holder(admin)
                if target == "scheduler":
                    process = schedulers.get(_pid_of(holder) or -1)
                    if process is None:  # no leader at this moment: pause the node loop
                        target, process = "node loop", stack.processes["agent"]
                else:
                    process = stack.processes["agent"]
                inside = watcher.stop_inside_a_transaction(process, within=gap_seconds)
                began = time.monotonic()
                expiry = watcher.lease_expiry() if target == "scheduler" else None
                pause = Pause(target, began - creator.origin, pause_seconds, in_transaction=inside)
                owners = {"paused": process.pid}
                owners.update(("standby", p.pid) for p in schedulers.values() if p is not process)
                shown = 0.0
                try:
                    while time.monotonic() - began < pause_seconds:
                        if target == "scheduler" and pause.takeover is None:
                            lease = _lease(admin)
                            now_holder = lease.get("holderIdentity")
                            if now_holder not in (None, holder):
                                pause.takeover = time.monotonic() - began
                                if expiry is not None and lease.get("acquireTime"):
                                    acquired = datetime.fromisoformat(lease["acquireTime"])
                                    pause.after_expiry = (acquired - expiry).total_seconds()
                            elif activity is not None and time.monotonic() - shown >= 0.5:
                                shown = time.monotonic()
                                at = f"{datetime.now(UTC).isoformat()} pause {index + 1}"
                                for line in watcher.activity(owners):
                                    activity.write(f"{at} {line}\n")
                                activity.flush()
                        time.sleep(0.1)
                finally:
                    process.send_signal(signal.SIGCONT)
                result.pauses.append(pause)
                typer.echo(
                    f"pause {index + 1}/{pauses}: {target}"
                    + (" inside a transaction" if inside else "")
                    + (f", standby led after {pause.takeover:.1f} s" if pause.takeover else "")
                    + (
                        f" ({pause.after_expiry:.1f} s after the lease expired)"
                        if pause.after_expiry is not None
                        else ""
                    )
                    + f"; {len(creator.creates)} creates so far",
                    err=True,
                )
            time.sleep(gap_seconds)
            creator.join()
            result.creates = sorted(creator.creates)
            _check(admin, result)
            admin.close()
            watcher.close()
            if activity is not None:
                activity.close()
        finally:
            stack.stop()
    return result


def _check(admin: httpx.Client, result: StallResult) -> None:
    """Every pod's binding, counted: none scheduled twice (two `Scheduled` events), no node
    holding more CPU than it has."""
    pods = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
    result.created = len(pods)
    held: dict[str, float] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            result.bound += 1
            held[node] = held.get(node, 0.0) + 0.5
    events = admin.get(f"/api/v1/namespaces/{NAMESPACE}/events").json()["items"]
    scheduled: dict[str, int] = {}
    for event in events:
        if event.get("reason") == "Scheduled":
            uid = event["involvedObject"].get("uid", "")
            scheduled[uid] = scheduled.get(uid, 0) + 1
    result.bound_twice = sum(count > 1 for count in scheduled.values())
    for node in admin.get("/api/v1/nodes").json()["items"]:
        cpu = str(node.get("status", {}).get("allocatable", {}).get("cpu", "0"))
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        if held.get(node["metadata"]["name"], 0.0) > cores:
            result.overcommitted_nodes += 1


def plot(result: StallResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for pause in result.pauses:
        color = "tab:red" if pause.target == "scheduler" else "tab:orange"
        ax.axvspan(pause.started, pause.started + pause.seconds, color=color, alpha=0.15)
    ax.scatter(
        [at for at, _, _ in result.creates],
        [latency * 1000 for _, latency, _ in result.creates],
        s=2,
        color="tab:blue",
    )
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run (red: the leading scheduler paused; orange: node loop)")
    ax.set_ylabel("create latency (ms)")
    ax.set_title("Pod creates while a scheduler or the node loop is SIGSTOPped")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    pauses: Annotated[int, typer.Option(min=1, max=200, help="How many pauses.")] = 20,
    pause_seconds: Annotated[
        float, typer.Option(min=1, max=120, help="How long each process is stopped.")
    ] = 10.0,
    gap_seconds: Annotated[
        float, typer.Option(min=0.5, max=120, help="About how long between pauses.")
    ] = 4.0,
    clients: Annotated[int, typer.Option(min=1, max=256, help="Creating connections.")] = 8,
    every: Annotated[
        float, typer.Option(min=0.001, max=60, help="Seconds between one client's creates.")
    ] = 0.25,
    seed: Annotated[int, typer.Option(help="Chooses what is paused, and when.")] = 1,
    postgres_url: Annotated[
        str,
        typer.Option(
            envvar="TESSERA_TEST_POSTGRES_URL", help="A server where a fresh database is made."
        ),
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    redis_url: Annotated[str, typer.Option(help="Redis between the processes.")] = (
        "redis://127.0.0.1:6379/0"
    ),
    out: Annotated[Path, typer.Option(help="Where stall.json and stall.png go.")] = Path(
        "bench/results/stall"
    ),
    logs: Annotated[
        Path | None, typer.Option(help="Keep the processes' logs here (else they go).")
    ] = None,
) -> None:
    """Stall the scheduler or the node loop (SIGSTOP) again and again during a steady stream
    of creates: how long creates take meanwhile, and how soon the standby scheduler leads."""
    database_url, drop = _fresh_postgres(postgres_url)
    try:
        result = run(
            pauses=pauses,
            pause_seconds=pause_seconds,
            gap_seconds=gap_seconds,
            clients=clients,
            every=every,
            seed=seed,
            url=database_url,
            redis_url=redis_url or None,
            logs=logs,
        )
    finally:
        drop()
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    (out / "stall.json").write_text(
        json.dumps({"summary": summary, "pauses": [asdict(p) for p in result.pauses]}, indent=2)
    )
    plot(result, out / "stall.png")
    typer.echo(json.dumps(summary, indent=2))
    if os.environ.get("TESSERA_BENCH_STRICT") and (
        summary["bound_twice"] or summary["overcommitted_nodes"] or summary["failed_creates"]
    ):
        raise typer.Exit(1)
