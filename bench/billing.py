"""Billing at scale: a day of usage for 10,000 pods with frequent resizes, on PostgreSQL.

    tessera bench billing --database postgresql --pods 10000

1. The ledger's write rate: every transition of the day (a start, a resize every 20 minutes on
   average, a stop) appended with `ledger.record` in batches, as scheduling cycles write them.
2. What metering adds to a bind: pods bound one per transaction through `pods.bind`, alternately
   with metering on and off (`meter=False`) in the same run, so that drift and noise fall on both
   alike; CPU milliseconds of this process and wall milliseconds (PostgreSQL's own work shows
   only in the wall time).
3. The reports a tenant asks for: its day by hour (grouped by resource), and one pod's day by
   the second, each through the same code as `GET .../usage` with every row produced. The day
   by hour is measured twice: from the events, and from the hourly rollups after housekeeping's
   `ledger.roll_up` (timed too) has rolled the day.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from app.auth import service as auth
from app.billing_api import service as billing
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.migrate import upgrade
from app.deps import Services
from app.inventory import service as inventory
from app.inventory.service import NodeSpec
from app.namespaces.service import NamespaceInfo
from app.pods import service as pods
from app.pods.admission import admit
from app.pods.schemas import Pod as PodSchema
from app.settings import Settings
from billing import ledger
from billing.usage import PodRef, Reason, Spec, Transition

DAY = datetime(2026, 1, 15, tzinfo=UTC)
BATCH = 500  # transitions per ledger write (one scheduling cycle's worth)
MONEY = billing.Money("USD", 2)
SPECS = [(500, 1024), (1000, 2048), (2000, 4096), (4000, 16384), (8000, 32768)]


@dataclass
class Result:
    database: str
    pods: int
    events: int
    ledger_seconds: float
    events_per_second: float
    binds: int
    bind_cpu_ms_metered: float
    bind_cpu_ms_unmetered: float
    bind_cpu_overhead_pct: float
    bind_wall_ms_metered: float
    bind_wall_ms_unmetered: float
    bind_wall_overhead_pct: float
    tenant_day_hourly_seconds: float
    tenant_day_hourly_rows: int
    tenant_day_rollup_seconds: float
    tenant_day_hourly_rolled_seconds: float
    pod_day_per_second_seconds: float
    pod_day_per_second_rows: int


def day_of_transitions(tenant_id: int, namespace: str, count: int, seed: int) -> list[Transition]:
    """Every pod starts some time in the day, is resized every 20 minutes on average and stops
    before the day ends (a tenth of them run on past midnight); ordered by time."""
    rng = np.random.default_rng(seed)
    out: list[Transition] = []
    for i in range(count):
        pod = PodRef(str(uuid.uuid4()), tenant_id, namespace, f"job-{i}")
        start = int(rng.integers(0, 80_000))
        stop = start + int(rng.integers(600, 86_400 - start + 1))
        cpu, memory = SPECS[int(rng.integers(len(SPECS)))]
        spec = Spec(cpu, memory, "general-purpose", "default")
        at = start
        out.append(Transition(pod, Reason.BIND, DAY + timedelta(seconds=at), spec=spec))
        seq = 0
        while True:
            at += int(rng.exponential(1200)) + 1
            if at >= stop:
                break
            seq += 1
            cpu, memory = SPECS[int(rng.integers(len(SPECS)))]
            spec = Spec(cpu, memory, "general-purpose", "default")
            out.append(
                Transition(pod, Reason.RESIZE, DAY + timedelta(seconds=at), spec=spec, seq=seq)
            )
        if rng.random() < 0.9:
            out.append(Transition(pod, Reason.DELETE, DAY + timedelta(seconds=stop)))
    out.sort(key=lambda t: t.at)
    return out


def _batches(items: list[Transition], size: int) -> Iterator[list[Transition]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _append(session: Any, *, batch: list[Transition]) -> None:
    ledger.record(session, batch, recorded_at=batch[-1].at)


def _cpu_pod(name: str) -> PodSchema:
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    return PodSchema.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "bench", "resources": resources}]},
        }
    )


def measure_binds(db: Database, ns: NamespaceInfo, binds: int) -> dict[str, list[float]]:
    """Bind `binds` pending pods one per transaction, metering every other one."""
    services = Services.build(Settings(), db=db)
    nodes = max(1, binds // 200 + 1)
    for n in range(nodes):
        spec = NodeSpec(name=f"bench-cpu-{n}", cpu_milli=128_000, memory_mib=512 * 1024)
        db.write(partial(inventory.create_node, spec=spec))
    samples: dict[str, list[float]] = {"cpu_on": [], "cpu_off": [], "wall_on": [], "wall_off": []}
    for i in range(binds):
        name = f"bind-{i}"

        def create(session: Any, name: str = name) -> dict[str, Any]:
            body = _cpu_pod(name)
            context = services.admission(session)
            admitted = admit(
                body, specs=context.specs, pool=context.pool, default_spec=context.default_spec
            )
            return pods.create(session, namespace=ns, pod=body, admitted=admitted)

        db.write(create)
        meter = i % 2 == 0
        node = f"bench-cpu-{i // 200}"
        cpu, wall = time.process_time(), time.perf_counter()
        db.write(
            partial(pods.bind, namespace=ns.name, name=name, node_name=node, gpus=[], meter=meter)
        )
        key = "on" if meter else "off"
        samples[f"cpu_{key}"].append((time.process_time() - cpu) * 1000)
        samples[f"wall_{key}"].append((time.perf_counter() - wall) * 1000)
    return samples


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = fn()
    return time.perf_counter() - started, rows


def run(database: str, url: str, *, count: int, binds: int, seed: int) -> Result:
    upgrade(url)
    db = Database(url)
    try:
        bootstrap(db)
        tenant = db.write(lambda s: auth.create_tenant(s, name="bench"))
        ns = NamespaceInfo("bench", tenant.id, False)
        body = {
            "metadata": {"name": "bench-prices"},
            "spec": {
                "effectiveFrom": "2026-01-14T00:00:00Z",
                "bestEffortFraction": "0.2",
                "compute": {
                    c: {"vcpuHour": "0.036", "memoryGiBHour": "0.004"}
                    for c in ("general-purpose", "performance", "gpu")
                },
                "gpus": {"*": {"vramGiBHour": "0.02", "smPercentHour": "0.012"}},
                "commitmentTiers": [],
            },
        }
        db.write(
            lambda s: billing.create_price(s, body=body, money=MONEY, at=DAY - timedelta(days=1))
        )

        transitions = day_of_transitions(tenant.id, ns.name, count, seed)
        print(
            f"  {database}: {len(transitions):,} transitions of {count:,} pods ...", file=sys.stderr
        )
        started = time.perf_counter()
        for batch in _batches(transitions, BATCH):
            db.write(partial(_append, batch=batch))
        ledger_seconds = time.perf_counter() - started

        print(f"  {database}: {binds} binds, metered and not ...", file=sys.stderr)
        samples = measure_binds(db, ns, binds)

        end = DAY + timedelta(days=1)
        at = end + timedelta(hours=1)

        def hourly() -> int:
            query = billing.report_query(
                start=DAY.isoformat(),
                end=end.isoformat(),
                granularity="hour",
                group_by="resource",
                at=at,
            )
            report = db.read(
                lambda s: billing.usage_report(
                    s, query=query, tenant_id=tenant.id, namespace=None, money=MONEY, at=at
                )
            )
            return sum(1 for _ in report.rows)

        def per_second() -> int:
            query = billing.report_query(
                start=DAY.isoformat(),
                end=end.isoformat(),
                granularity="second",
                group_by="pod,resource",
                at=at,
            )
            one = transitions[0].pod
            report = db.read(
                lambda s: billing.usage_report(
                    s,
                    query=query,
                    tenant_id=tenant.id,
                    namespace=one.namespace,
                    money=MONEY,
                    at=at,
                    pod=one.name,
                )
            )
            return sum(1 for _ in report.rows)

        print(f"  {database}: reports ...", file=sys.stderr)
        hourly_s, hourly_rows = _timed(hourly)
        second_s, second_rows = _timed(per_second)
        print(f"  {database}: hourly rollups, and the day's report again ...", file=sys.stderr)
        rollup_s, _ = _timed(
            lambda: db.write(
                lambda s: ledger.roll_up(s, at=at, currency=MONEY.currency, tenant_id=tenant.id)
            )
        )
        rolled_s, rolled_rows = _timed(hourly)
        if rolled_rows != hourly_rows:
            raise AssertionError(f"{rolled_rows} rows from rollups, {hourly_rows} from events")
    finally:
        db.dispose()

    def median(key: str) -> float:
        return statistics.median(samples[key])

    def overhead(on: str, off: str) -> float:
        return 100 * (median(on) - median(off)) / median(off)

    return Result(
        database=database,
        pods=count,
        events=len(transitions),
        ledger_seconds=round(ledger_seconds, 2),
        events_per_second=round(len(transitions) / ledger_seconds),
        binds=binds,
        bind_cpu_ms_metered=round(median("cpu_on"), 3),
        bind_cpu_ms_unmetered=round(median("cpu_off"), 3),
        bind_cpu_overhead_pct=round(overhead("cpu_on", "cpu_off"), 1),
        bind_wall_ms_metered=round(median("wall_on"), 3),
        bind_wall_ms_unmetered=round(median("wall_off"), 3),
        bind_wall_overhead_pct=round(overhead("wall_on", "wall_off"), 1),
        tenant_day_hourly_seconds=round(hourly_s, 3),
        tenant_day_hourly_rows=hourly_rows,
        tenant_day_rollup_seconds=round(rollup_s, 3),
        tenant_day_hourly_rolled_seconds=round(rolled_s, 3),
        pod_day_per_second_seconds=round(second_s, 3),
        pod_day_per_second_rows=second_rows,
    )


def main(
    database: Annotated[
        str, typer.Option(help="postgresql, sqlite, or both (comma-separated).")
    ] = "postgresql",
    pods: Annotated[int, typer.Option(help="Pods with a day of usage each.")] = 10_000,
    binds: Annotated[int, typer.Option(help="Binds measured (half of them metered).")] = 1000,
    seed: Annotated[int, typer.Option()] = 0,
    postgres_url: Annotated[
        str, typer.Option(help="An existing database to create a fresh one next to.")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    quick: Annotated[bool, typer.Option(help="2,000 pods and 400 binds.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write DIR/billing.json.")] = None,
    faults: Annotated[
        int,
        typer.Option(
            help="Instead: N random fault schedules of real processes (bench/billing_faults.py), "
            "each killing a component for a while; reports the largest billing error and plots "
            "it (DIR/faults.png with --out). The first --database only."
        ),
    ] = 0,
) -> None:
    """The ledger's write rate, metering's cost on the bind path, and report times."""
    from bench.api_create import _fresh_postgres

    if faults > 0:
        from bench import billing_faults

        first = next(d.strip() for d in database.split(",") if d.strip())
        billing_faults.bench(first, faults, seed, out, postgres_url)
        return

    if quick:
        pods, binds = min(pods, 2000), min(binds, 400)
    results = []
    for name in [d.strip() for d in database.split(",") if d.strip()]:
        if name == "postgresql":
            url, drop = _fresh_postgres(postgres_url)
            try:
                results.append(run(name, url, count=pods, binds=binds, seed=seed))
            finally:
                drop()
        elif name == "sqlite":
            with tempfile.TemporaryDirectory(prefix="tessera-bench-") as folder:
                url = f"sqlite:///{Path(folder) / 'billing.db'}"
                results.append(run(name, url, count=pods, binds=binds, seed=seed))
        else:
            raise typer.BadParameter(f"unknown database {name!r}: postgresql or sqlite")
    header = (
        "database",
        "pods",
        "events",
        "events/s",
        "bind cpu ms on/off",
        "cpu +%",
        "bind wall ms on/off",
        "wall +%",
        "day hourly s: events / rolled (roll)",
        "pod per-second s",
    )
    print(" | ".join(header))
    for r in results:
        print(
            " | ".join(
                [
                    r.database,
                    f"{r.pods:,}",
                    f"{r.events:,}",
                    f"{r.events_per_second:,}",
                    f"{r.bind_cpu_ms_metered} / {r.bind_cpu_ms_unmetered}",
                    f"{r.bind_cpu_overhead_pct:+}",
                    f"{r.bind_wall_ms_metered} / {r.bind_wall_ms_unmetered}",
                    f"{r.bind_wall_overhead_pct:+}",
                    f"{r.tenant_day_hourly_seconds} / {r.tenant_day_hourly_rolled_seconds} "
                    f"({r.tenant_day_rollup_seconds}; {r.tenant_day_hourly_rows} rows)",
                    f"{r.pod_day_per_second_seconds} ({r.pod_day_per_second_rows} rows)",
                ]
            )
        )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "billing.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
