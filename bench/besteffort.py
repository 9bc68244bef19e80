"""Benchmark: a pool kept full by BestEffort work while regular pods and gangs arrive in bursts.

The real control plane runs on a fresh SQLite database: pods are admitted and created by
`app.pods.service`, placed (and preemption planned and carried out) by the real
`SchedulingLoop`, started, finished and stopped through the same service calls the agent makes.
Only the clock is simulated: each step advances it by ``--step`` seconds, so an hour of a pool's
life takes a minute or two, and a victim's notice (``--notice``) is counted on that clock.

Three runs side by side, with the same seed and the same regular arrivals:

* ``preemption``: a BestEffort backlog keeps the pool full; regular pods preempt;
* ``no-preemption``: the same backlog, preemption off: regular pods wait for BestEffort pods
  to finish on their own;
* ``empty``: no BestEffort work at all: the wait a regular pod has on an idle pool.

Figures: GPU utilization of the pool, regular pods' wait from creation to binding (p50/p99),
victims per preemption against the minimum possible (every subset of the running BestEffort pods
of each node is tried: the workload is whole GPUs on single nodes, so that is exhaustive),
wasted evictions (victims whose preemptor did not then bind where it was nominated: must be 0)
and the BestEffort GPU-hours served, the revenue recovered from capacity regular pods left idle.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from sqlalchemy import select, text

from app.auth import service as auth
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Pod, table
from app.deps import Services
from app.inventory import service as inventory
from app.inventory.service import NodeSpec, default_gpu_layout
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.pods.admission import admit
from app.pods.schemas import Pod as PodSchema
from app.registry.kinds.podgroups import PodGroupStrategy
from app.registry.store import Store
from app.settings import Settings
from bench.stats import quantile
from scheduler.loop import LoopConfig, SchedulingLoop
from scheduler.preempt import PreemptionConfig

pods_t = table(Pod)
GPUS_PER_NODE = 8
PODGROUPS = Store(PodGroupStrategy())
BEST_EFFORT_PRICE = 0.2  # of the list price (TESSERA's default BestEffort fraction)


@dataclass(frozen=True)
class Workload:
    nodes: int = 8
    seconds: int = 3600  # simulated
    step: int = 5  # simulated seconds per scheduling cycle
    notice: int = 30
    burst_every: int = 240
    backlog: int = 6  # BestEffort pods kept pending
    seed: int = 0


@dataclass
class Run:
    mode: str
    utilization: list[float] = field(default_factory=list)  # per step, GPUs held / GPUs
    waits: list[int] = field(default_factory=list)  # regular pods, creation to binding
    still_waiting: int = 0
    preemptions: int = 0
    victims: int = 0
    minimum_victims: int = 0
    wasted_evictions: int = 0
    best_effort_gpu_seconds: int = 0
    regular_gpu_seconds: int = 0
    cycle_ms: list[float] = field(default_factory=list)

    def summary(self, work: Workload) -> dict[str, Any]:
        def pct(q: float) -> float | None:
            return round(quantile(self.waits, q / 100), 1) if self.waits else None

        gpu_hours = self.best_effort_gpu_seconds / 3600
        return {
            "mode": self.mode,
            "gpu_utilization": round(statistics.fmean(self.utilization), 4),
            "regular_bound": len(self.waits),
            "regular_still_waiting": self.still_waiting,
            "wait_p50_s": pct(50),
            "wait_p99_s": pct(99),
            "wait_max_s": max(self.waits) if self.waits else None,
            "preemptions": self.preemptions,
            "victims": self.victims,
            "victims_per_preemption": round(self.victims / self.preemptions, 3)
            if self.preemptions
            else None,
            "minimum_victims": self.minimum_victims,
            "wasted_evictions": self.wasted_evictions,
            "best_effort_gpu_hours": round(gpu_hours, 2),
            "best_effort_revenue_list_gpu_hours": round(gpu_hours * BEST_EFFORT_PRICE, 2),
            "regular_gpu_hours": round(self.regular_gpu_seconds / 3600, 2),
            "cycle_ms_p50": round(statistics.median(self.cycle_ms), 1),
            "notice_s": work.notice,
        }


@dataclass
class Live:
    """What the simulation knows of a pod it created."""

    uid: str
    name: str
    best_effort: bool
    gpus: int
    runs_for: int
    created: int
    bound: int | None = None
    ends: int | None = None


def manifest(name: str, gpus: int, *, best_effort: bool, group: str | None = None) -> PodSchema:
    labels = {"tessera.io/gpu-model": "H100"}
    if best_effort:
        labels["tessera.io/compute-qos"] = "best-effort"
    if group:
        labels["tessera.io/pod-group"] = group
    resources = {"requests": {"cpu": str(8 * gpus), "memory": f"{64 * gpus}Gi"}}
    resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return PodSchema.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "bench", "resources": resources}]},
        }
    )


def minimum_victims(free: dict[str, int], best_effort: dict[str, list[int]], need: int) -> int:
    """The fewest running BestEffort pods whose release leaves ``need`` whole GPUs free on one
    node, by trying every subset of each node's pods (small nodes: at most 2**8 subsets)."""
    best = sys.maxsize
    for node, sizes in best_effort.items():
        for k in range(0, min(len(sizes), best - 1) + 1):
            if any(free.get(node, 0) + sum(c) >= need for c in itertools.combinations(sizes, k)):
                best = min(best, k)
                break
    return best


class Simulation:
    def __init__(self, mode: str, work: Workload, folder: Path) -> None:
        self.mode, self.work = mode, work
        url = f"sqlite:///{folder / f'{mode}.db'}"
        upgrade(url)
        self.db = Database(url)
        bootstrap(self.db)
        self.services = Services.build(Settings(), db=self.db)
        self.rng = np.random.default_rng(work.seed)
        self.arrivals = np.random.default_rng(work.seed + 1)  # the same in every mode
        self.regular = self._tenant("paying")
        self.spare = self._tenant("spare")
        for i in range(work.nodes):
            name = f"bench-gpu-{i:02d}"
            spec = NodeSpec(
                name=name,
                cpu_milli=128_000,
                memory_mib=1024 * 1024,
                zone="z1",
                rack=f"r{i // 4}",
                gpus=default_gpu_layout(name, GPUS_PER_NODE, "H100"),
            )
            self.db.write(partial(inventory.create_node, spec=spec))
        preemption = PreemptionConfig(min_runtime_s=0) if mode != "no-preemption" else None
        self.loop = SchedulingLoop(
            self.db, LoopConfig(preemption=preemption, notice_seconds=work.notice, backoff=0.0)
        )
        self.pods: dict[str, Live] = {}
        self.deadlines: dict[str, int] = {}  # victims: when their notice is over
        self.nominated: dict[str, tuple[str, int, int]] = {}  # preemptor -> (node, victims, at)
        self.counter = 0
        self.run = Run(mode)

    def _tenant(self, name: str) -> NamespaceInfo:
        tenant = self.db.write(lambda s: auth.create_tenant(s, name=name))
        return NamespaceInfo(name, tenant.id, False)

    def _create(
        self, ns: NamespaceInfo, body: PodSchema, *, gpus: int, runs_for: int, at: int
    ) -> None:
        def work(session: Any) -> dict[str, Any]:
            context = self.services.admission(session)
            admitted = admit(
                body, specs=context.specs, pool=context.pool, default_spec=context.default_spec
            )
            return pods.create(session, namespace=ns, pod=body, admitted=admitted)

        created: dict[str, Any] = self.db.write(work)
        uid = created["metadata"]["uid"]
        self.pods[uid] = Live(uid, body.metadata.name or "", ns is self.spare, gpus, runs_for, at)

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def arrive(self, t: int) -> None:
        if t % self.work.burst_every == 0:
            for _ in range(int(self.arrivals.integers(2, 5))):
                gpus = int(self.arrivals.choice([1, 2, 4]))
                runs = int(self.arrivals.integers(300, 900))
                self._create(
                    self.regular,
                    manifest(self._name("job"), gpus, best_effort=False),
                    gpus=gpus,
                    runs_for=runs,
                    at=t,
                )
            if self.arrivals.random() < 0.5:  # a gang of two 4-GPU members on one node
                group = self._name("gang")
                group_body = {
                    "metadata": {"name": group},
                    "spec": {"minMember": 2, "topology": {"required": "node"}},
                }
                self.db.write(partial(PODGROUPS.create, namespace=self.regular, obj=group_body))
                runs = int(self.arrivals.integers(300, 900))
                for m in range(2):
                    pod = manifest(f"{group}-{m}", 4, best_effort=False, group=group)
                    self._create(self.regular, pod, gpus=4, runs_for=runs, at=t)
        if self.mode == "empty":
            return
        pending = sum(1 for p in self.pods.values() if p.best_effort and p.bound is None)
        for _ in range(self.work.backlog - pending):
            gpus = int(self.rng.choice([1, 1, 2, 4]))
            runs = int(self.rng.integers(900, 3600))
            body = manifest(self._name("spare"), gpus, best_effort=True)
            self._create(self.spare, body, gpus=gpus, runs_for=runs, at=t)

    def observe(self, t: int) -> None:
        """Bindings, new victims and nominations since the last cycle."""
        rows = self.db.read(
            lambda s: s.execute(
                select(
                    pods_t.c.uid,
                    pods_t.c.node_name,
                    pods_t.c.nominated_node_name,
                    pods_t.c.disruption_deadline,
                ).where(pods_t.c.uid.in_(list(self.pods)))
            ).all()
        )
        state = {r.uid: r for r in rows}
        new_victims = [
            uid
            for uid, r in state.items()
            if r.disruption_deadline is not None and uid not in self.deadlines
        ]
        for uid in new_victims:
            self.deadlines[uid] = t + self.work.notice
        new_preemptors = [
            uid
            for uid, r in state.items()
            if r.nominated_node_name and r.node_name is None and uid not in self.nominated
        ]
        if new_victims:
            self.run.preemptions += 1
            self.run.victims += len(new_victims)
            need = sum(self.pods[u].gpus for u in new_preemptors)
            self.run.minimum_victims += self._minimum(state, new_victims, need)
            for uid in new_preemptors:
                self.nominated[uid] = (state[uid].nominated_node_name, len(new_victims), t)
        for uid, r in state.items():
            live = self.pods[uid]
            if r.node_name is not None and live.bound is None:
                live.bound, live.ends = t, t + live.runs_for
                if not live.best_effort:
                    self.run.waits.append(t - live.created)
                self.db.write(partial(pods.start, uid=uid))
                node, victims, _ = self.nominated.pop(uid, (None, 0, 0))
                if node is not None and node != r.node_name:
                    self.run.wasted_evictions += victims

    def _minimum(self, state: dict[str, Any], victims: Sequence[str], need: int) -> int:
        stopping = {u for u in self.deadlines if u not in victims}
        held = {self.nominated[u][0] for u in self.nominated}
        free: dict[str, int] = dict(
            self.db.read(
                lambda s: s.execute(
                    text(
                        "SELECT node_name, count(*) FROM gpu_devices "
                        "WHERE core_free_pct = 100 GROUP BY node_name"
                    )
                ).all()
            )
        )
        running: dict[str, list[int]] = {}
        for uid, r in state.items():
            live = self.pods[uid]
            if live.best_effort and r.node_name and uid not in stopping and r.node_name not in held:
                running.setdefault(r.node_name, []).append(live.gpus)
        for node in free:
            running.setdefault(node, [])
        best = minimum_victims({n: c for n, c in free.items() if n not in held}, running, need)
        return best if best != sys.maxsize else len(victims)

    def advance(self, t: int) -> None:
        """Notices that are over, pods whose work is done; what the pool held this step."""
        for uid, deadline in list(self.deadlines.items()):
            if deadline <= t:
                del self.deadlines[uid]
                self.db.write(partial(pods.end_preempted, uid=uid))
                self.pods.pop(uid, None)  # failed (or requeued under a new uid)
                self._delete_if_there(uid)
        for uid, live in list(self.pods.items()):
            if live.ends is not None and live.ends <= t and uid not in self.deadlines:
                self.db.write(partial(pods.finish, uid=uid))
                self._delete_if_there(uid)
                del self.pods[uid]
        held = {True: 0, False: 0}
        for live in self.pods.values():
            if live.bound is not None:
                held[live.best_effort] += live.gpus
        self.run.best_effort_gpu_seconds += held[True] * self.work.step
        self.run.regular_gpu_seconds += held[False] * self.work.step
        self.run.utilization.append((held[True] + held[False]) / (self.work.nodes * GPUS_PER_NODE))

    def _delete_if_there(self, uid: str) -> None:
        def work(session: Any) -> None:
            row = session.execute(
                select(pods_t.c.namespace, pods_t.c.name).where(pods_t.c.uid == uid)
            ).first()
            if row is not None:
                pods.delete(session, namespace=row.namespace, name=row.name, grace_seconds=0)

        self.db.write(work)

    def simulate(self) -> Run:
        for t in range(0, self.work.seconds, self.work.step):
            self.arrive(t)
            started = time.perf_counter()
            self.loop.run_once(now=float(t))
            self.run.cycle_ms.append((time.perf_counter() - started) * 1000)
            self.observe(t)
            self.advance(t)
        # A preemptor still unbound well after its victims stopped evicted them for nothing.
        late = self.work.seconds - self.work.notice - 3 * self.work.step
        self.run.wasted_evictions += sum(v for _, v, at in self.nominated.values() if at < late)
        self.run.still_waiting = sum(
            1 for p in self.pods.values() if not p.best_effort and p.bound is None
        )
        self.loop.writer.close()
        self.db.dispose()
        return self.run


def plot(runs: list[Run], work: Workload, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        minutes = [i * work.step / 60 for i in range(len(run.utilization))]
        left.plot(minutes, [u * 100 for u in run.utilization], label=run.mode, linewidth=1)
        if run.waits:
            waits = sorted(run.waits)
            right.step(waits, [(i + 1) / len(waits) for i in range(len(waits))], label=run.mode)
    left.set(xlabel="simulated minutes", ylabel="GPUs held (%)", title="pool utilization")
    right.axvline(work.notice, color="grey", linestyle=":", label="notice period")
    right.set(
        xlabel="seconds from creation to binding",
        ylabel="share of regular pods",
        title="regular pods' wait",
        xscale="symlog",
    )
    right.set_xlim(left=0)
    for axis in (left, right):
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    nodes: Annotated[int, typer.Option(help="8-GPU nodes in the pool.")] = 8,
    minutes: Annotated[int, typer.Option(help="Simulated minutes of each run.")] = 120,
    step: Annotated[int, typer.Option(help="Simulated seconds per scheduling cycle.")] = 5,
    notice: Annotated[int, typer.Option(help="A victim's notice, in simulated seconds.")] = 30,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals.")] = 0,
    quick: Annotated[bool, typer.Option(help="A short run (30 simulated minutes).")] = False,
    out: Annotated[Path | None, typer.Option(help="Write DIR/besteffort.json and .png.")] = None,
) -> None:
    """A full pool with and without preemption, and an empty one, side by side."""
    work = Workload(
        nodes=nodes, seconds=(30 if quick else minutes) * 60, step=step, notice=notice, seed=seed
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as folder:
        for mode in ("preemption", "no-preemption", "empty"):
            print(f"{mode}: {work.seconds // 60} simulated minutes ...", file=sys.stderr)
            started = time.perf_counter()
            runs.append(Simulation(mode, work, Path(folder)).simulate())
            print(f"  {time.perf_counter() - started:.0f} s", file=sys.stderr)
    result: dict[str, Any] = {"workload": asdict(work), "runs": [r.summary(work) for r in runs]}
    header = (
        "mode",
        "util",
        "p50 wait",
        "p99 wait",
        "waiting",
        "preempt",
        "victims",
        "min",
        "wasted",
        "BE GPU-h",
    )
    print("  ".join(f"{h:>13}" for h in header))
    for s in result["runs"]:
        cells = (
            s["mode"],
            f"{s['gpu_utilization']:.1%}",
            s["wait_p50_s"],
            s["wait_p99_s"],
            s["regular_still_waiting"],
            s["preemptions"],
            s["victims"],
            s["minimum_victims"],
            s["wasted_evictions"],
            s["best_effort_gpu_hours"],
        )
        print("  ".join(f"{'-' if c is None else c!s:>13}" for c in cells))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "besteffort.json").write_text(json.dumps(result, indent=2) + "\n")
        plot(runs, work, out / "besteffort.png")
        print(f"wrote {out / 'besteffort.json'} and {out / 'besteffort.png'}", file=sys.stderr)
