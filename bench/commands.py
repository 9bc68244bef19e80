"""How long the everyday `tessera` commands take, against a database with a tenant's usage.

    tessera bench commands --pods 48 --runs 5

A fresh SQLite database gets a tenant with `--pods` pods' usage over yesterday and today (starts,
resizes every 20 minutes on average, stops: the ledger's transitions, as `tessera bench billing`
makes them) and yesterday's statement closed, as housekeeping closes it. Then each command runs
`--runs` times as its own process, as a person runs it, and its wall time and CPU time (user +
system, of the process) are taken. Two yardsticks run beside them in the same run: `python -c
pass` (the interpreter's own start) and `python -c "import sqlalchemy.orm"` (the least a command
that reads the database imports), so a reader compares ratios, not absolute figures of a noisy
shared machine.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from app.auth import service as auth
from app.billing_api import service as billing
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.migrate import upgrade
from bench.billing import BATCH, DAY, MONEY, _append, _batches, day_of_transitions
from billing import ledger


@dataclass
class Timing:
    command: str
    wall_ms_median: float
    wall_ms_max: float
    cpu_ms_median: float


def _seed(data_dir: Path, pods: int) -> None:
    """The tenant `bench`, a price list, `pods` pods' usage over yesterday and today (shifted from
    the billing benchmark's day), and the days before today closed."""
    url = f"sqlite:///{data_dir / 'tessera.db'}"
    upgrade(url)
    db = Database(url)
    try:
        bootstrap(db)
        tenant = db.write(lambda s: auth.create_tenant(s, name="bench"))
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        yesterday = today - timedelta(days=1)
        body = {
            "metadata": {"name": "bench-prices"},
            "spec": {
                "effectiveFrom": (yesterday - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
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
            lambda s: billing.create_price(
                s, body=body, money=MONEY, at=yesterday - timedelta(days=2)
            )
        )
        now = datetime.now(UTC)
        shift = yesterday - DAY
        transitions = [
            replace(t, at=t.at + shift)
            for t in day_of_transitions(tenant.id, "bench", pods, seed=7)
            if t.at + shift < now
        ]
        for batch in _batches(transitions, BATCH):
            db.write(partial(_append, batch=batch))
        db.write(
            lambda s: ledger.close_due(
                s, at=now, delay=timedelta(0), currency="USD", minor_digits=2
            )
        )
    finally:
        db.dispose()


def _time(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        walls.append((time.perf_counter() - started) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return walls, cpus


def main(
    pods: Annotated[int, typer.Option(min=1, max=10_000, help="Pods of the tenant.")] = 48,
    runs: Annotated[int, typer.Option(min=1, max=50, help="Runs of each command.")] = 5,
    out: Annotated[Path, typer.Option(help="Where the figures go (JSON).")] = Path(
        "bench/results/latest/commands.json"
    ),
) -> None:
    """Wall and CPU time of `tessera --help`, `tenant list`, `usage` and `statement`, beside the
    interpreter's own start."""
    tessera = str(Path(sys.executable).with_name("tessera"))
    with tempfile.TemporaryDirectory(prefix="tessera-bench-commands-") as tmp:
        data_dir = Path(tmp)
        print(f"seeding a tenant with {pods} pods' usage ...", file=sys.stderr)
        _seed(data_dir, pods)
        env = {**os.environ, "TESSERA_DATA_DIR": str(data_dir)}
        env.pop("TESSERA_DATABASE_URL", None)
        commands = {
            "python -c pass (yardstick)": [sys.executable, "-c", "pass"],
            "import sqlalchemy.orm (yardstick)": [sys.executable, "-c", "import sqlalchemy.orm"],
            "tessera --help": [tessera, "--help"],
            "tessera tenant list": [tessera, "tenant", "list"],
            "tessera usage --tenant bench --group-by pod": [
                tessera,
                "usage",
                "--tenant",
                "bench",
                "--group-by",
                "pod",
                "--from",
                (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z"),
            ],
            "tessera statement bench": [tessera, "statement", "bench"],
        }
        results = []
        for label, argv in commands.items():
            print(f"  {label} ...", file=sys.stderr)
            walls, cpus = _time(argv, env, runs)
            results.append(
                Timing(
                    label,
                    round(statistics.median(walls), 1),
                    round(max(walls), 1),
                    round(statistics.median(cpus), 1),
                )
            )
    width = max(len(r.command) for r in results)
    print(f"{'command':<{width}}  wall ms (median, max)  CPU ms (median)")
    for r in results:
        print(
            f"{r.command:<{width}}  {r.wall_ms_median:8.0f} {r.wall_ms_max:8.0f}  {r.cpu_ms_median:10.0f}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"pods": pods, "runs": runs, "results": [asdict(r) for r in results]}, indent=2)
    )
    print(f"wrote {out}", file=sys.stderr)
