"""A burst of pods end to end: real processes, a realistic mix, bound pods per second.

    tessera bench burst --database postgresql --pods 10000 --gpus 8192 --out burst.json

Starts the production shape of Tessera on a fresh database and drives it from concurrent
HTTPS clients:

* **postgresql**: `tessera serve --workers W` + `tessera scheduler` + `tessera agent` (the
  control plane's node loop, which starts the pods of nodes without an agent of their own), as
  three or more processes, with Redis for watch notifications when `--redis-url` is given;
* **sqlite**: `tessera dev`, everything in one process on the embedded database.

The pool is `--gpus` H200 GPUs (nodes of 8, racks of 16 nodes, two zones) plus 128 CPU-only
nodes per zone: 1,280 nodes at 8,192 GPUs. The pods (seeded) are 50 % CPU-only, 30 % GPU
slices, 10 % whole GPUs (1 or 2) and 10 % gang members: gangs of four 2-GPU pods required on
one node and of four 4-GPU pods required in one rack. The PodGroups are made before the burst;
every pod is created during it, `--clients` connections each creating its share as fast as the
server answers.

Reported: pods bound per second end to end (first create sent to last bind), the creates' p50
and p99 latency during the burst, create-to-bind p50/p99 (from each pod's creationTimestamp
and the time it was bound, both the server's clock), each process's CPU seconds (PostgreSQL's
backends too), and, when `py-spy` is installed, a sampling profile of every Tessera process cut
into stages, so it says where the time goes. `--out FILE` writes it all as JSON, and a plot of
pods created and bound over time beside it (FILE with .png).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.api_create import _free_port, _fresh_postgres, _wait_ready
from bench.stats import quantile

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NAMESPACE = "burst"
# How often the bench counts the pods created and bound (the plot's timeline; the figures come
# from every pod's own timestamps at the end). The count reads every pod of the burst: a second
# keeps that off the database being measured.
POLL_SECONDS = 1.0
CPU_NODES_PER_ZONE = 128
ZONES = 2


# --- the pool and the pods --------------------------------------------------------------------


def pool_yaml(gpus: int, cpu_nodes_per_zone: int = CPU_NODES_PER_ZONE) -> str:
    """An inventory file: `gpus` H200s in nodes of 8 and racks of 16 nodes over two zones, and
    128 CPU-only nodes (racks of 16) per zone unless said otherwise."""
    if gpus % (8 * 16 * ZONES):
        raise typer.BadParameter(f"--gpus must be a multiple of {8 * 16 * ZONES}")
    racks = gpus // (8 * 16 * ZONES)
    zones = "\n".join(
        f"      - name: z{z}\n"
        f"        racks:\n"
        f"          - {{count: {racks}, prefix: g, nodes: {{h200x8: 16}}}}\n"
        f"          - {{count: {cpu_nodes_per_zone // 16}, prefix: c, nodes: {{cpu64: 16}}}}"
        for z in range(ZONES)
    )
    return (
        "nodeClasses:\n"
        "  h200x8:\n"
        "    cpu: 192\n"
        "    memory: 2048Gi\n"
        "    gpus: {model: H200, count: 8, nvlinkDomainSize: 8, numaNodes: 2, gpusPerSwitch: 2}\n"
        "  cpu64:\n"
        "    cpu: 64\n"
        "    memory: 256Gi\n"
        "    computeClasses: [general-purpose]\n"
        "regions:\n"
        "  - name: r1\n"
        "    zones:\n" + zones + "\n"
    )


def _pod(name: str, requests: dict[str, str], limits: dict[str, Any], **labels: str) -> dict:
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "burst", **labels}},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "resources": resources}
            ]
        },
    }


@dataclass
class Workload:
    groups: list[dict[str, Any]]  # PodGroups, made before the burst
    pods: list[dict[str, Any]]  # in the order they are created
    mix: dict[str, int]


def workload(pods: int, seed: int) -> Workload:
    """`pods` pods of the mix above (gang members in groups of four, created one after the
    other), shuffled by gang so that gangs and single pods arrive interleaved."""
    rng = random.Random(seed)
    units: list[list[dict[str, Any]]] = []
    groups: list[dict[str, Any]] = []
    mix: Counter[str] = Counter()
    n = 0
    while n < pods:
        # a gang (4 pods) with probability 0.1 / 3.7, so that a tenth of the pods are members
        draw = rng.random() * 0.9 if rng.random() >= 0.1 / 3.7 or pods - n < 4 else 1.0
        if draw < 0.50:
            cpu = rng.choice([0.5, 1, 2, 4])
            memory = int(max(1, cpu * rng.choice([1, 2, 4])))
            units.append([_pod(f"cpu-{n}", {"cpu": str(cpu), "memory": f"{memory}Gi"}, {})])
            mix["cpu"] += 1
        elif draw < 0.80:
            limits = {
                "tessera.io/gpu-memory": f"{rng.choice([10, 20, 40])}Gi",
                "tessera.io/gpu-core": str(rng.choice([10, 25, 50])),
            }
            units.append([_pod(f"slice-{n}", {"cpu": "2", "memory": "8Gi"}, limits)])
            mix["slice"] += 1
        elif draw < 0.90:
            count = 1 if rng.random() < 0.7 else 2
            requests = {"cpu": str(8 * count), "memory": f"{64 * count}Gi"}
            units.append([_pod(f"gpu-{n}", requests, {"nvidia.com/gpu": count})])
            mix["whole-gpu"] += 1
        else:
            per, level = rng.choice([(2, "node"), (4, "rack")])
            group = f"gang-{n}"
            groups.append(
                {
                    "apiVersion": "tessera.io/v1",
                    "kind": "PodGroup",
                    "metadata": {"name": group},
                    "spec": {"minMember": 4, "topology": {"required": level}},
                }
            )
            requests = {"cpu": str(8 * per), "memory": f"{64 * per}Gi"}
            units.append(
                [
                    _pod(
                        f"{group}-{i}",
                        requests,
                        {"nvidia.com/gpu": per},
                        **{"tessera.io/pod-group": group},
                    )
                    for i in range(4)
                ]
            )
            mix[f"gang-member-{level}"] += 4
        n += len(units[-1])
    rng.shuffle(units)
    return Workload(groups, [pod for unit in units for pod in unit], dict(mix))


# --- the clients ------------------------------------------------------------------------------


async def _post_all(
    port: int,
    context: ssl.SSLContext,
    path: str,
    token: str,
    bodies: Iterator[bytes],
    latencies: list[float],
    errors: list[str],
) -> None:
    """One keep-alive connection POSTing bodies until the shared iterator is empty."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
    try:
        for body in bodies:
            request = (
                f"{head}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            started = time.perf_counter()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            payload = await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if b" 201 " not in status:
                errors.append(
                    f"{status.decode().strip()}: {payload[:300].decode(errors='replace')}"
                )
    finally:
        writer.close()


async def _create(
    port: int, ca: Path, token: str, path: str, docs: list[dict[str, Any]], clients: int
) -> tuple[list[float], list[str], float, float]:
    """(latencies, errors, wall seconds, the clients' CPU seconds: TLS and HTTP on this
    machine's cores, beside the server's)."""
    cpu = time.thread_time()
    context = ssl.create_default_context(cafile=str(ca))
    bodies = iter([json.dumps(d).encode() for d in docs])
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(_post_all(port, context, path, token, bodies, latencies, errors) for _ in range(clients))
    )
    return latencies, errors, time.perf_counter() - started, time.thread_time() - cpu


def reference_loop_ms() -> float:
    """Milliseconds a fixed pure-Python loop takes on this machine now (the best of five): the
    same tree's figures differ by tens of per cent between sessions on shared machines, and
    this says how fast the machine was when they were taken."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


# --- processes, CPU and profiles --------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, float]:
    """(command name, parent pid, CPU seconds) of a process."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _processes() -> dict[int, tuple[str, int, float]]:
    seen = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                seen[int(entry.name)] = _stat(int(entry.name))
            except (OSError, ValueError):
                continue
    return seen


def roles_of(roots: dict[str, int], table: dict[int, tuple[str, int, float]]) -> dict[int, str]:
    """Every process of each role: its root and the root's descendants."""
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    owners: dict[int, str] = {}
    for role, root in roots.items():
        stack = [root]
        while stack:
            pid = stack.pop()
            owners[pid] = role
            stack.extend(children.get(pid, []))
    return owners


def cpu_by_role(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each role's process and its descendants, and of every `postgres`
    process (the database server is shared, so its idle backends count too: they cost little)."""
    table = _processes()
    result = dict.fromkeys(roots, 0.0)
    for pid, role in roles_of(roots, table).items():
        if pid in table:
            result[role] += table[pid][2]
    result["postgresql"] = sum(cpu for name, _, cpu in table.values() if name == "postgres")
    return result


def write_profile(
    prefix: Path, owners: dict[int, str], start: float, end: float
) -> dict[str, dict[str, float]]:
    """What each role's write transactions that began in [start, end] spent, from the files
    TESSERA_TRACE_WRITES made (app/db/engine.py): how many and the changes they logged; seconds
    waiting for the write lock (SQLite; none on PostgreSQL, where no lock is shared by every
    writer), working in the transaction, flushing what was deferred and committing; and the
    share of the window the role had a transaction open (on PostgreSQL the roles' transactions
    overlap: the shares may add up to more than 100)."""
    totals: dict[str, dict[str, float]] = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        role = owners.get(int(path.suffix[1:]), "other")
        for line in path.read_text().splitlines():
            _thread, *stamps, changes = line.split()
            asked, locked, worked, flushed, committed = map(float, stamps)
            if not start <= asked <= end:
                continue
            row = totals.setdefault(
                role,
                dict.fromkeys(("transactions", "changes", "wait", "work", "flush", "commit"), 0.0),
            )
            row["transactions"] += 1
            row["changes"] += int(changes)
            row["wait"] += locked - asked
            row["work"] += worked - locked
            row["flush"] += flushed - worked
            row["commit"] += committed - flushed
    window = max(end - start, 1e-9)
    for row in totals.values():
        row["held_pct"] = 100 * (row["work"] + row["flush"] + row["commit"]) / window
        for key in ("wait", "work", "flush", "commit"):
            row[key] = round(row[key], 3)
        row["held_pct"] = round(row["held_pct"], 1)
    return totals


# Where a sample of each role's profile goes. The scheduler's and the agent's stages are the
# functions a stack passes through (root first: the first marker found in the stack wins); the
# API's are what the sampled code itself was doing (leaf first: the innermost frame that matches
# a marker wins), so a validation step that runs inside the write transaction counts as
# validation and the driver's round trips as database work. A marker is a function name or a
# path fragment as py-spy prints frames ("name (path/file.py:line)").
API_STAGES = [
    ("database (driver, ORM)", "psycopg"),
    ("database (driver, ORM)", "sqlalchemy/"),
    ("database (driver, ORM)", "app/db/"),
    ("HTTP and TLS", "ssl.py"),
    ("HTTP and TLS", "uvicorn/"),
    ("HTTP and TLS", "h11/"),
    ("HTTP and TLS", "httptools"),
    ("HTTP and TLS", "starlette/"),
    ("HTTP and TLS", "fastapi/"),
    ("HTTP and TLS", "asyncio/"),
    ("request parsing and validation", "pydantic"),
    ("request parsing and validation", "orjson"),
    ("request parsing and validation", "json/"),
    ("authentication", "app/auth/"),
    ("watch and notifications", "app/watch/"),
    ("watch and notifications", "redis/"),
    ("pod logic (admission, specs, records)", "app/"),
]
LOOP_STAGES = [
    ("snapshot", "build_snapshot"),
    ("snapshot", "read_changes"),
    ("snapshot", "Mirror."),
    ("snapshot", "build_batch"),
    ("solve", "solve_reserving"),
    ("bind", "plan_binds"),
    ("bind", "bind_planned"),
    ("bind", "mark_unschedulable"),
    ("preemption", "_preempt"),
    ("lease", "campaign"),
    ("agent: start pods", "app/agent.py"),
]
STAGES: dict[str, tuple[bool, list[tuple[str, str]]]] = {  # role -> (leaf first, markers)
    "api": (True, API_STAGES),
    # the scheduler's writer thread commits its binds outside `bind_planned`
    "scheduler": (False, [*LOOP_STAGES, ("bind", "app/db/engine.py")]),
    # the node loop starts pods through a write queue (its own thread)
    "agent": (False, [*LOOP_STAGES[-1:], ("agent: start pods", "app/db/engine.py")]),
    # one process: the loops by function first, the API's requests by what they were doing
    "dev": (False, LOOP_STAGES),
}


def stage_of(stack: str, role: str) -> str:
    leaf_first, markers = STAGES[role]
    frames = stack.split(";")
    if not leaf_first:
        found = next((s for s, marker in markers if marker in stack), None)
        if found is not None or role != "dev":
            return found or "other"
        leaf_first, markers = STAGES["api"]
    for frame in reversed(frames):
        for stage, marker in markers:
            if marker in frame:
                return stage
        if _tessera_frame(frame):
            return API_STAGES[-1][0]
    return "other"


def _tessera_frame(frame: str) -> bool:
    """py-spy prints some of Tessera's own frames with the file name alone ("create
    (service.py:120)"); a bare file name that is no standard-library module is one of them."""
    where = frame.rpartition("(")[2]
    file = where.split(":", 1)[0]
    return "/" not in file and file.endswith(".py") and file[:-3] not in sys.stdlib_module_names


def stages(collapsed: Path, role: str) -> dict[str, int]:
    """Samples per stage of a py-spy raw (collapsed stacks) file."""
    counts: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack, role)] += int(count)
    return dict(counts.most_common())


@dataclass
class Profiler:
    """py-spy recording one process (and its children) until stopped."""

    role: str
    out: Path
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, role: str, pid: int, folder: Path, *, rate: int = 40) -> Profiler:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        profiler = cls(role, folder / f"{role}.txt")
        if not Path(spy).exists():
            return profiler
        profiler.process = subprocess.Popen(
            [
                *(spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"),
                *("--nonblocking", "--subprocesses", "--output", str(profiler.out)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return profiler

    def stop(self) -> dict[str, int]:
        if self.process is None:
            return {}
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return stages(self.out, self.role) if self.out.exists() else {}


# --- one run ----------------------------------------------------------------------------------


@dataclass
class Result:
    database: str
    api_workers: int
    gpus: int
    nodes: int
    pods: int
    clients: int
    mix: dict[str, int]
    created: int
    create_errors: int
    first_error: str
    bound: int
    running: int
    seconds_to_last_bind: float
    creates_per_second: float
    bound_per_second: float
    create_p50_ms: float
    create_p99_ms: float
    create_to_bind_p50_s: float
    create_to_bind_p99_s: float
    cpu_seconds: dict[str, float]
    client_cpu_seconds: float  # the bench's HTTPS clients, on the same cores
    reference_loop_ms: float  # `reference_loop_ms()` just before the burst: the machine's speed
    # The floor (bench/floor.py) in the same run, with the same clients and pods: a bare HTTPS
    # create, two INSERTs in PostgreSQL; Tessera's creates/s and bound/s as fractions of it.
    floor_creates_per_second: float
    creates_fraction: float
    bound_fraction: float
    gpu_sm_allocated_pct: float
    gpu_vram_allocated_pct: float
    gpus_untouched: int  # no slice or pod on them at the end
    unbound: dict[str, int] = field(default_factory=dict)  # pod kind: why not bound -> pods
    profile: dict[str, dict[str, int]] = field(default_factory=dict)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (s, created, bound)
    # role -> its write transactions during the burst (`--trace-writes`; see `write_profile`)
    writes: dict[str, dict[str, float]] = field(default_factory=dict)


def _tessera(env: dict[str, str], *args: str) -> str:
    tessera = str(Path(sys.executable).with_name("tessera"))
    done = subprocess.run([tessera, *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tessera {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


@dataclass
class Stack:
    """Tessera's processes on a fresh database, with a tenant and its token."""

    env: dict[str, str]
    token: str
    processes: dict[str, subprocess.Popen[bytes]]
    data: Path
    logs: Path

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.env['TESSERA_PORT']}"

    @property
    def ca(self) -> Path:
        return self.data / "tls" / "ca.crt"

    def start_agent(self, runtime: str, node: str) -> subprocess.Popen[bytes]:
        """A node agent of its own for `node` (`tessera agent --runtime RUNTIME`, its node
        token), as the process `agent-RUNTIME`."""
        inventory = self.data / f"{runtime}-nodes.json"
        node_token = _tessera(self.env, "token", "create", "--node", node)
        nodes = {"server": self.base, "caCert": str(self.ca)}
        inventory.write_text(json.dumps({**nodes, "nodes": [{"name": node, "token": node_token}]}))
        tessera = str(Path(sys.executable).with_name("tessera"))
        agent = subprocess.Popen(
            [tessera, "agent", "--runtime", runtime, "--nodes", str(inventory)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=(self.logs / f"agent-{runtime}.log").open("wb"),
        )
        self.processes[f"agent-{runtime}"] = agent
        return agent

    def stop_process(self, role: str) -> None:
        _stop([self.processes.pop(role)])

    def stop(self) -> None:
        _stop(list(self.processes.values()))
        self.processes.clear()


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start_stack(
    database: str,
    *,
    data: Path,
    url: str,
    port: int,
    gpus: int,
    redis_url: str | None,
    logs: Path,
    api_workers: int = 1,
    controllers: bool = False,
    env: dict[str, str] | None = None,
    cpu_nodes_per_zone: int = CPU_NODES_PER_ZONE,
    pool: bool = True,
    node_loop: bool = True,
    tenant: str = NAMESPACE,
    wrap: dict[str, list[str]] | None = None,
) -> Stack:
    """The production shape on `url`: `tessera dev` on SQLite; on PostgreSQL `tessera serve`,
    `tessera scheduler`, `tessera agent` (the node loop; not without `node_loop`, for nodes
    that each get an agent of their own: `Stack.start_agent`) and, with `controllers`, the
    controller manager, as separate processes (Redis between them when `redis_url` is given).
    The pool of `gpus` (pool_yaml; not without `pool`) is loaded and the tenant made first.
    `wrap` puts a command before a role's (a profiler: `python -m cProfile -o FILE`)."""
    extra, env = env or {}, dict(os.environ)
    for key in ("TESSERA_REDIS_URL", "TESSERA_TRACE_WRITES", "TESSERA_AGENT_RUNTIME"):
        env.pop(key, None)
    env.update(
        TESSERA_DATA_DIR=str(data),
        TESSERA_DATABASE_URL=url,
        TESSERA_PORT=str(port),
        TESSERA_RATE_LIMIT_PER_SECOND="0",
        TESSERA_DEV_VIRTUAL_AGENT="false",
        **extra,
    )
    if redis_url and database != "sqlite":
        env["TESSERA_REDIS_URL"] = redis_url
    _tessera(env, "migrate")
    if pool:
        inventory = data / "pool.yaml"
        inventory.write_text(pool_yaml(gpus, cpu_nodes_per_zone))
        _tessera(env, "inventory", "load", str(inventory))
    _tessera(env, "tenant", "create", tenant)
    token = _tessera(env, "token", "create", "--tenant", tenant)
    tessera = str(Path(sys.executable).with_name("tessera"))
    if database == "sqlite":
        commands = {"dev": [tessera, "dev"]}  # the controller manager is in it
    else:
        commands = {
            "api": [tessera, "serve", "--workers", str(api_workers)],
            "scheduler": [tessera, "scheduler"],
            **({"agent": [tessera, "agent"]} if node_loop else {}),
        }
        if controllers:
            commands["controllers"] = [tessera, "controllers", "--issue-token"]
    for role, prefix in (wrap or {}).items():
        commands[role] = [*prefix, *commands[role]]
    logs.mkdir(parents=True, exist_ok=True)
    processes = {
        role: subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=(logs / f"{role}.log").open("wb")
        )
        for role, command in commands.items()
    }
    stack = Stack(env, token, processes, data, logs)
    try:
        _wait_ready(port, data / "tls" / "ca.crt")
    except BaseException:
        stack.stop()
        raise
    return stack


def measure_floor(
    docs: list[dict[str, Any]], *, clients: int, workers: int, postgres_url: str, tls_dir: Path
) -> float:
    """Creates per second of the floor (bench/floor.py) on a fresh PostgreSQL database, driven
    by `clients` connections with `docs`: the least a create costs on this machine now."""
    from app.tls import ensure_tls

    tls = ensure_tls(tls_dir, ["127.0.0.1", "localhost"])
    url, drop = _fresh_postgres(postgres_url)
    port = _free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.floor", "--port", str(port), "--database-url", url),
            *("--cert", str(tls.cert), "--key", str(tls.key), "--workers", str(workers)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port, tls.ca_cert)
        latencies, errors, seconds, _ = asyncio.run(
            _create(
                port, tls.ca_cert, "floor", f"/api/v1/namespaces/{NAMESPACE}/pods", docs, clients
            )
        )
    finally:
        server.terminate()
        server.wait(timeout=20)
        drop()
    if errors:
        raise RuntimeError(f"the floor refused a create: {errors[0]}")
    return round(len(latencies) / seconds, 1)


def measure(
    database: str,
    *,
    pods: int,
    gpus: int,
    clients: int,
    api_workers: int,
    seed: int,
    postgres_url: str,
    redis_url: str | None,
    profile: bool,
    logs_dir: Path | None = None,
    settle_seconds: float = 60.0,
    trace_writes: bool = False,
) -> Result:
    from sqlalchemy import create_engine, text

    load = workload(pods, seed)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        drop: Callable[[], None] | None = None
        if database == "sqlite":  # kept with the logs, if they are kept
            (logs_dir or data).mkdir(parents=True, exist_ok=True)
            url = f"sqlite:///{(logs_dir or data) / 'bench.db'}"
        else:
            url, drop = _fresh_postgres(postgres_url)
        port = _free_port()
        traces = (logs_dir or data) / "writes"
        if trace_writes:
            traces.parent.mkdir(parents=True, exist_ok=True)
        print(f"  the floor: {len(load.pods)} bare creates from {clients} clients", file=sys.stderr)
        floor = measure_floor(
            load.pods,
            clients=clients,
            workers=api_workers if database != "sqlite" else 1,
            postgres_url=postgres_url,
            tls_dir=data / "tls",
        )
        try:
            stack = start_stack(
                database,
                data=data,
                url=url,
                port=port,
                gpus=gpus,
                redis_url=redis_url,
                logs=logs_dir or data,
                api_workers=api_workers,
                env={"TESSERA_TRACE_WRITES": str(traces)} if trace_writes else None,
            )
        except BaseException:
            if drop:
                drop()
            raise
        started, token, logs = stack.processes, stack.token, logs_dir or data
        engine = create_engine(url)
        try:
            ca = data / "tls" / "ca.crt"
            _, failed, _, _ = asyncio.run(
                _create(
                    port,
                    ca,
                    token,
                    f"/apis/tessera.io/v1/namespaces/{NAMESPACE}/podgroups",
                    load.groups,
                    4,
                )
            )
            if failed:
                raise RuntimeError(f"could not create the PodGroups: {failed[0]}")
            time.sleep(2)  # the processes settle (first cycles, leases) before the burst
            reference = reference_loop_ms()
            roots = {role: p.pid for role, p in started.items()}
            cpu_before = cpu_by_role(roots)
            profilers = (
                [Profiler.start(role, pid, logs) for role, pid in roots.items()] if profile else []
            )
            timeline: list[tuple[float, int, int]] = []
            outcome: dict[str, Any] = {}
            began = time.perf_counter()

            def drive() -> None:
                outcome["create"] = asyncio.run(
                    _create(
                        port,
                        ca,
                        token,
                        f"/api/v1/namespaces/{NAMESPACE}/pods",
                        load.pods,
                        clients,
                    )
                )

            import threading

            driver = threading.Thread(target=drive, name="burst-clients")
            driver.start()
            counted = text(
                "SELECT count(*), count(bound_at) FROM pods WHERE namespace = :ns"
            ).bindparams(ns=NAMESPACE)
            last_change, last_bound = time.perf_counter(), -1
            cpu_at_last_bind = cpu_before
            settled = False
            while True:
                time.sleep(POLL_SECONDS)
                with engine.connect() as conn:
                    created, bound = conn.execute(counted).one()
                now = time.perf_counter()
                timeline.append((round(now - began, 2), int(created), int(bound)))
                if bound != last_bound:
                    last_change, last_bound = now, bound
                    cpu_at_last_bind = cpu_by_role(roots)
                done = not driver.is_alive()
                if done and bound >= created:
                    break
                if done and now - last_change > settle_seconds:
                    settled = True  # the rest does not fit (or is stuck): reported as not bound
                    break
                if len(timeline) % 5 == 0:
                    print(
                        f"  {now - began:6.1f} s: {created} created, {bound} bound",
                        file=sys.stderr,
                    )
            driver.join()
            owners = roles_of(roots, _processes())
            time.sleep(1.0)  # the agent starts the last pods
            profiled = {p.role: p.stop() for p in profilers}
            # the CPU of the burst: without the wait for pods that never fit, if there were any
            cpu_after = cpu_at_last_bind if settled else cpu_by_role(roots)
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT created_at, bound_at, phase FROM pods WHERE namespace = :ns"
                    ).bindparams(ns=NAMESPACE)
                ).all()
                pool = conn.execute(
                    text(
                        "SELECT count(*), sum(100 - core_free_pct), sum(vram_mib - vram_free_mib),"
                        " sum(vram_mib), sum(CASE WHEN core_free_pct = 100 THEN 1 ELSE 0 END)"
                        " FROM gpu_devices"
                    )
                ).one()
                unbound = conn.execute(
                    text(
                        "SELECT name, conditions FROM pods"
                        " WHERE namespace = :ns AND bound_at IS NULL"
                    ).bindparams(ns=NAMESPACE)
                ).all()
        finally:
            engine.dispose()
            stack.stop()
            if drop:
                drop()
        writes = write_profile(traces, owners, began, last_change) if trace_writes else {}
    latencies, errors, create_seconds, client_cpu = outcome["create"]
    waits = [(_aware(b) - _aware(c)).total_seconds() for c, b, _ in rows if b is not None]
    ends = [b for _, b, _ in rows if b is not None]
    first = min((_aware(c) for c, _, _ in rows), default=None)
    span = (max(_aware(b) for b in ends) - first).total_seconds() if ends and first else 0.0
    return Result(
        database=database,
        api_workers=api_workers if database != "sqlite" else 1,
        gpus=gpus,
        nodes=gpus // 8 + CPU_NODES_PER_ZONE * ZONES,
        pods=len(load.pods),
        clients=clients,
        mix=load.mix,
        created=len(rows),
        create_errors=len(errors),
        first_error=errors[0] if errors else "",
        bound=len(ends),
        running=sum(1 for _, _, phase in rows if phase == "Running"),
        seconds_to_last_bind=round(span, 2),
        creates_per_second=round(len(latencies) / create_seconds, 1),
        bound_per_second=round(len(ends) / span, 1) if span else 0.0,
        floor_creates_per_second=floor,
        creates_fraction=round(len(latencies) / create_seconds / floor, 2),
        bound_fraction=round(len(ends) / span / floor, 2) if span else 0.0,
        create_p50_ms=round(statistics.median(latencies) * 1000, 1),
        create_p99_ms=round(quantile(latencies, 0.99) * 1000, 1),
        create_to_bind_p50_s=round(quantile(waits, 0.5), 2),
        create_to_bind_p99_s=round(quantile(waits, 0.99), 2),
        cpu_seconds={k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1) for k in cpu_after},
        client_cpu_seconds=round(client_cpu, 2),
        reference_loop_ms=reference,
        gpu_sm_allocated_pct=round(100 * (pool[1] or 0) / (100 * pool[0]), 1),
        gpu_vram_allocated_pct=round(100 * (pool[2] or 0) / (pool[3] or 1), 1),
        gpus_untouched=int(pool[4] or 0),
        unbound=dict(
            Counter(
                f"{name.split('-')[0]}: {_unscheduled(conditions)[:160]}"
                for name, conditions in unbound
            ).most_common(5)
        ),
        profile=profiled,
        timeline=timeline,
        writes=writes,
    )


def _unscheduled(conditions: Any) -> str:
    """The message of a pod's PodScheduled=False condition (the scheduler's reason)."""
    if isinstance(conditions, str):
        conditions = json.loads(conditions)
    for condition in conditions or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return "not tried yet"


def _aware(value: Any) -> Any:
    from datetime import UTC, datetime

    if isinstance(value, str):  # SQLite's text timestamps
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- the report -------------------------------------------------------------------------------


def report(result: Result) -> str:
    lines = [
        f"{result.database}, {result.api_workers} API process(es), {result.gpus} GPUs in "
        f"{result.nodes} nodes, {result.pods} pods from {result.clients} clients:",
        f"  bound {result.bound}/{result.created} ({result.running} running) in "
        f"{result.seconds_to_last_bind} s: {result.bound_per_second} pods/s end to end",
        f"  creates {result.creates_per_second}/s, p50 {result.create_p50_ms} ms, "
        f"p99 {result.create_p99_ms} ms; errors {result.create_errors} {result.first_error}",
        f"  create to bind p50 {result.create_to_bind_p50_s} s, p99 {result.create_to_bind_p99_s} s",
        f"  the floor (a bare HTTPS create, two INSERTs) {result.floor_creates_per_second}/s: "
        f"creates {result.creates_fraction} of it, pods bound end to end {result.bound_fraction}",
        f"  GPUs at the end: SMs {result.gpu_sm_allocated_pct} % allocated, VRAM "
        f"{result.gpu_vram_allocated_pct} %, {result.gpus_untouched} GPUs untouched",
        "  CPU seconds: "
        + ", ".join(f"{k} {v}" for k, v in result.cpu_seconds.items())
        + f"; the clients {result.client_cpu_seconds}",
        "  CPU ms per pod: "
        + ", ".join(
            f"{k} {1000 * v / max(result.created, 1):.2f}" for k, v in result.cpu_seconds.items()
        ),
        f"  the machine: a reference loop took {result.reference_loop_ms} ms "
        "(bench.burst.reference_loop_ms; lower is faster)",
    ]
    for role, row in result.writes.items():
        n = max(row["transactions"], 1)
        per = ", ".join(
            f"{key} {1000 * row[key] / n:.1f}" for key in ("wait", "work", "flush", "commit")
        )
        lines.append(
            f"  writes of {role}: {int(row['transactions'])} transactions of "
            f"{row['changes'] / n:.0f} changes, in a transaction {row['held_pct']} % of the burst; "
            f"ms each: {per}"
        )
    for why, count in result.unbound.items():
        lines.append(f"  not bound: {count} x {why}")
    for role, counts in result.profile.items():
        total = sum(counts.values()) or 1
        lines.append(
            f"  {role} profile: "
            + ", ".join(f"{stage} {100 * n / total:.0f} %" for stage, n in counts.items())
        )
    return "\n".join(lines)


def plot(results: list[Result], path: Path, *, names: list[str] | None = None) -> None:
    """Created and bound over time, a line pair per run; `names` (one per run) say which run is
    which where the settings do not (the same run before and after a change)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for index, result in enumerate(results):
        label = (
            f"{result.database}, {result.api_workers} API, {result.gpus} GPUs, "
            f"{result.clients} clients"
        )
        if names is not None:
            label = f"{names[index]}: {label}"
        seconds = [t for t, _, _ in result.timeline]
        (line,) = axes.plot(seconds, [b for _, _, b in result.timeline], label=f"bound: {label}")
        axes.plot(
            seconds,
            [c for _, c, _ in result.timeline],
            linestyle="--",
            color=line.get_color(),
            label=f"created: {label}",
        )
    axes.set_xlabel("seconds since the first create")
    axes.set_ylabel("pods")
    axes.set_title("A burst of pods: created and bound over time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(
    database: Annotated[
        str, typer.Option(help="postgresql, sqlite, or both (comma-separated).")
    ] = "postgresql,sqlite",
    pods: Annotated[int, typer.Option(min=4, max=200_000, help="Pods in the burst.")] = 10_000,
    gpus: Annotated[
        str,
        typer.Option(help="GPUs in the pool, a multiple of 256; a comma-separated list runs each."),
    ] = "8192",
    clients: Annotated[
        str, typer.Option(help="Concurrent connections; a comma-separated list runs each.")
    ] = "16",
    api_workers: Annotated[
        str, typer.Option(help="API processes on PostgreSQL; a comma-separated list runs each.")
    ] = "1",
    seed: Annotated[int, typer.Option(help="Seed of the pod mix.")] = 42,
    profile: Annotated[
        bool, typer.Option(help="Sample every process with py-spy (if installed).")
    ] = True,
    postgres_url: Annotated[
        str, typer.Option(envvar="TESSERA_TEST_POSTGRES_URL")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    redis_url: Annotated[
        str | None, typer.Option(help="Redis for the PostgreSQL stack's watch notifications.")
    ] = "redis://127.0.0.1:6379/0",
    out: Annotated[
        Path | None, typer.Option(help="Write the results here (JSON; plot .png).")
    ] = None,
    logs: Annotated[
        Path | None, typer.Option(help="Keep each run's process logs in this folder.")
    ] = None,
    trace_writes: Annotated[
        bool,
        typer.Option(
            help="Time every write transaction (TESSERA_TRACE_WRITES): the lock's wait, the "
            "work under it, the flush and the commit, by process."
        ),
    ] = False,
    workload: Annotated[
        bool,
        typer.Option(
            "--workload",
            help="Deployments and Jobs instead (bench/workloads.py): their pods bound per "
            "second beside as many bare pods', and the controllers' lag.",
        ),
    ] = False,
    deployments: Annotated[int, typer.Option(min=0, max=10_000)] = 100,
    replicas: Annotated[int, typer.Option(min=1, max=1_000)] = 50,
    jobs: Annotated[int, typer.Option(min=0, max=10_000)] = 200,
    completions: Annotated[int, typer.Option(min=1, max=1_000)] = 25,
    controllers_profile: Annotated[
        Path | None,
        typer.Option(
            help="With --workload on PostgreSQL: run the controller manager under cProfile and "
            "write its statistics (pstats) here; it slows the manager."
        ),
    ] = None,
) -> None:
    """Pods bound per second end to end, create latency and where the CPU goes, in a burst."""
    results = []
    connections = [int(c) for c in clients.split(",")]
    if any(not 1 <= c <= 512 for c in connections):
        raise typer.BadParameter("--clients takes 1 to 512 connections")
    if workload:
        from bench import workloads

        measured = []
        for kind in [d.strip() for d in database.split(",") if d.strip()]:
            typer.secho(f"{kind}: workloads", err=True)
            one = workloads.measure(
                kind,
                deployments=deployments,
                replicas=replicas,
                jobs=jobs,
                completions=completions,
                clients=connections[0],
                postgres_url=postgres_url,
                redis_url=redis_url,
                controllers_profile=controllers_profile,
                logs_dir=logs / kind if logs else None,
            )
            measured.append(one)
            typer.echo(workloads.report(one))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps([asdict(r) for r in measured], indent=2) + "\n")
            workloads.plot(measured, out.with_suffix(".png"))
        return
    for kind in [d.strip() for d in database.split(",") if d.strip()]:
        for workers in [int(w) for w in api_workers.split(",")] if kind != "sqlite" else [1]:
            for size in [int(g) for g in gpus.split(",")]:
                for count in connections:
                    typer.secho(
                        f"{kind}: {pods} pods onto {size} GPUs, {workers} API process(es), "
                        f"{count} clients",
                        err=True,
                    )
                    result = measure(
                        kind,
                        pods=pods,
                        gpus=size,
                        clients=count,
                        api_workers=workers,
                        seed=seed,
                        postgres_url=postgres_url,
                        redis_url=redis_url,
                        profile=profile,
                        logs_dir=logs / f"{kind}-{workers}-{size}-{count}" if logs else None,
                        trace_writes=trace_writes,
                    )
                    results.append(result)
                    typer.echo(report(result))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
        plot(results, out.with_suffix(".png"))
