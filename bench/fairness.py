"""Benchmark: one tenant floods the pool while another keeps creating pods.

The real control plane on a fresh SQLite database: two tenants made by `app.auth.service`,
their pods admitted and created by `app.pods.service`, placed by the real `SchedulingLoop`,
started, finished and deleted through the same service calls the agent makes. Only the clock is
simulated: each step is one scheduling cycle and advances it by ``--step`` seconds (back-offs
are counted on that clock), so the figures are in cycles, which is what fair share promises.

The *steady* tenant creates one-GPU pods at random (``--steady-every`` seconds apart on
average, each running 1 to 5 minutes: about a quarter of the pool); at ``--flood-at`` the
*flood* tenant creates ``--flood`` one-GPU pods at once (each running 1 to 3 minutes), far more
than the pool holds. Three runs with the same arrivals:

* ``alone``: no flood: what the steady tenant's pods wait on a pool of their own;
* ``flood``: the flood, with fair share (weighted DRF between tenants);
* ``flood, no fair share``: the flood, pods taken by priority then age whatever their tenant
  (the order before fair share; ``LoopConfig.fair_share=False``).

Figures: the steady tenant's create-to-bind wait in cycles (p50, p99, max, and pods still
waiting at the end), each tenant's share of the pool's GPUs over time against its fair share
(max-min fair: weighted water-filling of the pool over what each tenant holds and waits for),
and the loop's wall time per cycle.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from sqlalchemy import select

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
from app.settings import Settings
from bench.stats import quantile
from scheduler.loop import LoopConfig, SchedulingLoop

pods_t = table(Pod)
GPUS_PER_NODE = 8
TENANTS = ("steady", "flood")
MODES = ("alone", "flood", "flood, no fair share")
INSERT_CHUNK = 500  # flood pods created per write


@dataclass(frozen=True)
class Workload:
    nodes: int = 8
    seconds: int = 1800  # simulated
    step: int = 5  # simulated seconds per scheduling cycle
    flood: int = 10_000
    flood_at: int = 300
    steady_every: float = 12.0  # mean seconds between the steady tenant's pods
    flood_weight: int = 1
    seed: int = 0


@dataclass
class Run:
    mode: str
    waits: list[int] = field(default_factory=list)  # steady pods: cycles from create to bind
    still_waiting: int = 0  # steady pods not bound by the end
    steady_created: int = 0
    flood_bound: int = 0
    times: list[int] = field(default_factory=list)  # simulated seconds of each step
    shares: dict[str, list[float]] = field(default_factory=dict)  # tenant -> GPUs held / pool
    fair: dict[str, list[float]] = field(default_factory=dict)  # tenant -> fair share of pool
    cycle_ms: list[float] = field(default_factory=list)

    def summary(self, work: Workload) -> dict[str, Any]:
        def pct(q: float) -> float | None:
            return round(quantile(self.waits, q / 100), 2) if self.waits else None

        after = [i for i, t in enumerate(self.times) if t > work.flood_at + 60]
        gap = {
            tenant: round(
                statistics.fmean(self.shares[tenant][i] - self.fair[tenant][i] for i in after), 4
            )
            if after
            else None
            for tenant in TENANTS
        }
        return {
            "mode": self.mode,
            "steady_created": self.steady_created,
            "steady_bound": len(self.waits),
            "steady_still_waiting": self.still_waiting,
            "steady_wait_p50_cycles": pct(50),
            "steady_wait_p99_cycles": pct(99),
            "steady_wait_max_cycles": max(self.waits) if self.waits else None,
            "steady_wait_p99_s": None if pct(99) is None else pct(99) * work.step,  # type: ignore[operator]
            "flood_bound": self.flood_bound,
            # mean of (share of the pool - fair share) from a minute after the flood on
            "share_minus_fair": gap,
            "gpu_utilization": round(
                statistics.fmean(sum(s[i] for s in self.shares.values()) for i in after), 4
            )
            if after
            else None,
            "cycle_ms_p50": round(statistics.median(self.cycle_ms), 1),
            "cycle_ms_p99": round(quantile(self.cycle_ms, 0.99), 1),
            "cycle_ms_max": round(max(self.cycle_ms), 1),
        }


@dataclass
class Live:
    tenant: str
    created_step: int  # the first cycle after its creation
    runs_for: int
    bound: int | None = None
    ends: int | None = None


def fair_shares(
    demand: dict[str, float], weights: dict[str, float], capacity: float
) -> dict[str, float]:
    """Max-min fair shares of `capacity` with weights: every tenant gets its weighted part of
    what is left, none more than it asks for, what one does not take goes to the others."""
    share = dict.fromkeys(demand, 0.0)
    hungry = {t for t, d in demand.items() if d > 0}
    left = capacity
    while hungry and left > 1e-9:
        total = sum(weights[t] for t in hungry)
        given = {t: left * weights[t] / total for t in hungry}
        left = 0.0
        for tenant, amount in given.items():
            room = demand[tenant] - share[tenant]
            take = min(room, amount)
            share[tenant] += take
            left += amount - take
            if share[tenant] >= demand[tenant] - 1e-9:
                hungry.discard(tenant)
    return share


def manifest(name: str) -> PodSchema:
    resources = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    return PodSchema.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"tessera.io/gpu-model": "H100"}},
            "spec": {"containers": [{"name": "main", "image": "bench", "resources": resources}]},
        }
    )


class Simulation:
    def __init__(self, mode: str, work: Workload, folder: Path) -> None:
        self.mode, self.work = mode, work
        url = f"sqlite:///{folder / (mode.replace(' ', '').replace(',', '-') + '.db')}"
        upgrade(url)
        self.db = Database(url)
        bootstrap(self.db)
        self.services = Services.build(Settings(), db=self.db)
        self.weights = {"steady": 1.0, "flood": float(work.flood_weight)}
        self.ns = {t: self._tenant(t, int(self.weights[t])) for t in TENANTS}
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
        self.loop = SchedulingLoop(self.db, LoopConfig(fair_share=mode != "flood, no fair share"))
        rng = np.random.default_rng(work.seed)  # the same arrivals in every mode
        self.steady_at: list[tuple[int, int]] = []  # (second, runs for)
        t = float(rng.exponential(work.steady_every))
        while t < work.seconds:
            self.steady_at.append((int(t), int(rng.integers(60, 301))))
            t += float(rng.exponential(work.steady_every))
        self.flood_runs = rng.integers(60, 181, size=work.flood)
        self.pods: dict[str, Live] = {}
        self.run = Run(mode, shares={t: [] for t in TENANTS}, fair={t: [] for t in TENANTS})
        self.total_gpus = work.nodes * GPUS_PER_NODE

    def _tenant(self, name: str, weight: int) -> NamespaceInfo:
        tenant = self.db.write(lambda s: auth.create_tenant(s, name=name, weight=weight))
        return NamespaceInfo(name, tenant.id, False)

    def _create(self, tenant: str, names: list[str], runs: list[int], step: int) -> None:
        ns = self.ns[tenant]

        def work(session: Any) -> list[dict[str, Any]]:
            context = self.services.admission(session)
            created = []
            for name in names:
                body = manifest(name)
                admitted = admit(
                    body, specs=context.specs, pool=context.pool, default_spec=context.default_spec
                )
                created.append(
                    pods.insert(
                        session, new=pods.prepare(namespace=ns, pod=body, admitted=admitted)
                    )
                )
            return created

        for obj, runs_for in zip(self.db.write(work), runs, strict=True):
            self.pods[obj["metadata"]["uid"]] = Live(tenant, step, runs_for)

    def arrive(self, t: int, step: int) -> None:
        due = [(at, runs) for at, runs in self.steady_at if t - self.work.step < at <= t]
        if due:
            names = [f"steady-{at}-{i}" for i, (at, _) in enumerate(due)]
            self._create("steady", names, [r for _, r in due], step)
            self.run.steady_created += len(due)
        if self.mode != "alone" and t - self.work.step < self.work.flood_at <= t:
            for start in range(0, self.work.flood, INSERT_CHUNK):
                end = min(start + INSERT_CHUNK, self.work.flood)
                self._create(
                    "flood",
                    [f"flood-{i}" for i in range(start, end)],
                    [int(r) for r in self.flood_runs[start:end]],
                    step,
                )

    def observe(self, step: int) -> None:
        """Start the pods bound by this cycle; note the steady tenant's waits."""
        bound = self.db.read(
            lambda s: list(
                s.scalars(
                    select(pods_t.c.uid).where(
                        pods_t.c.node_name.is_not(None), pods_t.c.phase == "Pending"
                    )
                )
            )
        )
        for uid in bound:
            live = self.pods.get(uid)
            if live is None or live.bound is not None:
                continue
            live.bound, live.ends = step, step + max(1, live.runs_for // self.work.step)
            if live.tenant == "steady":
                self.run.waits.append(step - live.created_step + 1)
            else:
                self.run.flood_bound += 1
            self.db.write(partial(pods.start, uid=uid))

    def advance(self, step: int) -> None:
        """Pods whose work is done end and are deleted; what each tenant holds and wants."""
        for uid, live in list(self.pods.items()):
            if live.ends is not None and live.ends <= step:
                self.db.write(partial(pods.finish, uid=uid))
                self.db.write(partial(_delete, uid=uid))
                del self.pods[uid]
        held = dict.fromkeys(TENANTS, 0)
        wants = dict.fromkeys(TENANTS, 0)
        for live in self.pods.values():
            wants[live.tenant] += 1
            if live.bound is not None:
                held[live.tenant] += 1
        fair = fair_shares(
            {t: float(n) for t, n in wants.items()}, self.weights, float(self.total_gpus)
        )
        for tenant in TENANTS:
            self.run.shares[tenant].append(held[tenant] / self.total_gpus)
            self.run.fair[tenant].append(fair[tenant] / self.total_gpus)

    def simulate(self) -> Run:
        for step, t in enumerate(range(0, self.work.seconds, self.work.step)):
            self.arrive(t, step)
            started = time.perf_counter()
            self.loop.run_once(now=float(t))
            self.run.cycle_ms.append((time.perf_counter() - started) * 1000)
            self.observe(step)
            self.advance(step)
            self.run.times.append(t)
        self.run.still_waiting = sum(
            1 for p in self.pods.values() if p.tenant == "steady" and p.bound is None
        )
        self.loop.writer.close()
        self.db.dispose()
        return self.run


def _delete(session: Any, *, uid: str) -> None:
    row = session.execute(
        select(pods_t.c.namespace, pods_t.c.name).where(pods_t.c.uid == uid)
    ).first()
    if row is not None:
        pods.delete(session, namespace=row.namespace, name=row.name, grace_seconds=0)


def plot(runs: list[Run], work: Workload, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = {"steady": "tab:blue", "flood": "tab:orange"}
    for axis, run in ((left, runs[1]), (middle, runs[2])):
        minutes = [t / 60 for t in run.times]
        for tenant in TENANTS:
            axis.plot(
                minutes,
                [s * 100 for s in run.shares[tenant]],
                color=colors[tenant],
                linewidth=1,
                label=f"{tenant}: share held",
            )
            axis.plot(
                minutes,
                [s * 100 for s in run.fair[tenant]],
                color=colors[tenant],
                linewidth=1,
                linestyle="--",
                label=f"{tenant}: fair share",
            )
        axis.axvline(work.flood_at / 60, color="grey", linestyle=":", label="flood")
        axis.set(
            xlabel="simulated minutes",
            ylabel="GPUs of the pool (%)",
            title=f"{run.mode}",
            ylim=(0, 105),
        )
    for run in runs:
        if run.waits:
            waits = sorted(run.waits)
            right.step(
                waits,
                [(i + 1) / len(waits) for i in range(len(waits))],
                label=run.mode,
                where="post",
            )
    right.set(
        xlabel="cycles from create to bind",
        ylabel="share of the steady tenant's pods bound",
        title="steady tenant's wait",
        xscale="log",
    )
    for axis in (left, middle, right):
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    nodes: Annotated[int, typer.Option(help="8-GPU nodes in the pool.")] = 8,
    minutes: Annotated[int, typer.Option(help="Simulated minutes of each run.")] = 30,
    step: Annotated[int, typer.Option(help="Simulated seconds per scheduling cycle.")] = 5,
    flood: Annotated[int, typer.Option(help="Pods the flooding tenant creates at once.")] = 10_000,
    flood_at: Annotated[int, typer.Option(help="Simulated second of the flood.")] = 300,
    steady_every: Annotated[
        float, typer.Option(help="Mean seconds between the steady tenant's pods.")
    ] = 12.0,
    flood_weight: Annotated[int, typer.Option(help="The flooding tenant's weight.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals.")] = 0,
    quick: Annotated[bool, typer.Option(help="A short run (2,000 pods, 15 minutes).")] = False,
    out: Annotated[Path | None, typer.Option(help="Write DIR/fairness.json and .png.")] = None,
) -> None:
    """One tenant floods the pool while another creates pods: the other's create-to-bind
    wait (in cycles) with and without the flood, and each tenant's share against its fair
    share."""
    work = Workload(
        nodes=nodes,
        seconds=(15 if quick else minutes) * 60,
        step=step,
        flood=2000 if quick else flood,
        flood_at=flood_at,
        steady_every=steady_every,
        flood_weight=flood_weight,
        seed=seed,
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as folder:
        for mode in MODES:
            print(f"{mode}: {work.seconds // 60} simulated minutes ...", file=sys.stderr)
            started = time.perf_counter()
            runs.append(Simulation(mode, work, Path(folder)).simulate())
            print(f"  {time.perf_counter() - started:.0f} s", file=sys.stderr)
    result: dict[str, Any] = {"workload": asdict(work), "runs": [r.summary(work) for r in runs]}
    header = (
        "mode",
        "steady",
        "p50 cyc",
        "p99 cyc",
        "max cyc",
        "waiting",
        "flood bound",
        "cycle ms",
    )
    print("  ".join(f"{h:>20}" for h in header))
    for s in result["runs"]:
        cells = (
            s["mode"],
            s["steady_created"],
            s["steady_wait_p50_cycles"],
            s["steady_wait_p99_cycles"],
            s["steady_wait_max_cycles"],
            s["steady_still_waiting"],
            s["flood_bound"],
            f"{s['cycle_ms_p50']} / {s['cycle_ms_p99']}",
        )
        print("  ".join(f"{'-' if c is None else c!s:>20}" for c in cells))
    for s in result["runs"]:
        print(f"{s['mode']}: share - fair share: {s['share_minus_fair']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fairness.json").write_text(json.dumps(result, indent=2) + "\n")
        plot(runs, work, out / "fairness.png")
        print(f"wrote {out / 'fairness.json'} and {out / 'fairness.png'}", file=sys.stderr)
