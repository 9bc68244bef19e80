"""A burst of workloads: Deployments and Jobs created at once, their pods bound end to end,
beside a burst of as many bare pods in the same run.

    tessera bench burst --workload --database postgresql

Starts the production shape as `tessera bench burst` does, plus the controller manager
(`tessera controllers` on PostgreSQL; `tessera dev` embeds it on SQLite). In one run, on the
same processes and pool:

1. the bare burst: `--deployments x --replicas + --jobs x --completions` pods of one spec
   (0.5 vCPU, 1 GiB), created by `--clients` connections as fast as the server answers;
2. the workload burst: the Deployments and Jobs, created at once by the same clients, whose
   controllers make the same number of pods of the same spec.

Reported for each: pods bound per second end to end (first create sent to last bind), and for
the workloads the controller lag of each object: from its creation to the creation of the last
pod it implies (and to its first), p50 and p99, both from the server's own timestamps. The goal
the workloads issue sets: the workloads' pods bound at 80 % or more of the bare pods' rate, a
controller lag p99 under a second.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.api_create import _free_port, _fresh_postgres
from bench.burst import (
    NAMESPACE,
    _aware,
    _create,
    _tessera,
    cpu_by_role,
    start_stack,
)
from bench.stats import quantile

BARE = f"{NAMESPACE}-bare"
OWNER = "bench.tessera.io/owner"
RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}}


def _template(owner: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": owner, OWNER: owner}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1", **RESOURCES}]},
    }


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _template(name),
        },
    }


def job(name: str, completions: int) -> dict[str, Any]:
    template = _template(name)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"parallelism": completions, "completions": completions, "template": template},
    }


def bare_pod(name: str) -> dict[str, Any]:
    template = _template("bare")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **template["metadata"]},
        "spec": template["spec"],
    }


@dataclass
class Burst:
    pods: int
    bound: int
    seconds: float
    bound_per_second: float
    # CPU seconds of each process (and PostgreSQL's) from the first create to the last bind
    cpu_seconds: dict[str, float]


@dataclass
class WorkloadResult:
    database: str
    deployments: int
    replicas: int
    jobs: int
    completions: int
    clients: int
    bare: Burst
    workloads: Burst
    fraction: float  # the workloads' bound/s over the bare pods'
    lag_last_p50_s: float
    lag_last_p99_s: float
    lag_first_p50_s: float
    lag_first_p99_s: float
    objects: int
    # to the first pod, by kind: a Deployment's goes through its ReplicaSet, a Job's does not
    lag_first_by_kind: dict[str, tuple[float, float]]  # kind: (p50, p99)
    # a Deployment's two hops: to its ReplicaSet, and from that to its first pod
    lag_deployment_hops: dict[str, tuple[float, float]] = field(default_factory=dict)
    # each object: [name, seconds from the burst's first object to its creation, first-pod lag]
    first_pod_lags: list[tuple[str, float, float]] = field(default_factory=list)


def _wait_bound(
    engine: Any,
    namespace: str,
    expected: int,
    began: float,
    settle: float,
    label: str,
    roots: dict[str, int],
    cpu_before: dict[str, float],
) -> dict[str, float]:
    """Until `expected` pods of `namespace` are bound, or none more for `settle` seconds; the
    CPU seconds each role spent until the last bind seen."""
    from sqlalchemy import text

    counted = text("SELECT count(*), count(bound_at) FROM pods WHERE namespace = :ns").bindparams(
        ns=namespace
    )
    last, last_change = -1, time.perf_counter()
    spent: dict[str, float] = {}
    while True:
        time.sleep(1.0)
        with engine.connect() as conn:
            created, bound = conn.execute(counted).one()
        now = time.perf_counter()
        if bound != last:
            last, last_change = bound, now
            after = cpu_by_role(roots)
            spent = {k: v - cpu_before.get(k, 0.0) for k, v in after.items()}
            print(
                f"  {label} {now - began:6.1f} s: {created} created, {bound} bound", file=sys.stderr
            )
        if bound >= expected or now - last_change > settle:
            return spent


def _rows(engine: Any, namespace: str) -> list[Any]:
    """(labels, created_at, bound_at) of every pod of `namespace`."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT labels, created_at, bound_at FROM pods WHERE namespace = :ns"
                ).bindparams(ns=namespace)
            ).all()
        )


def _burst(rows: list[Any], first_create: datetime, cpu: dict[str, float]) -> Burst:
    ends = [_aware(b) for _, _, b in rows if b is not None]
    span = (max(ends) - first_create).total_seconds() if ends else 0.0
    return Burst(
        pods=len(rows),
        bound=len(ends),
        seconds=round(span, 2),
        bound_per_second=round(len(ends) / span, 1) if span else 0.0,
        cpu_seconds={k: round(v, 1) for k, v in cpu.items()},
    )


def measure(
    database: str,
    *,
    deployments: int,
    replicas: int,
    jobs: int,
    completions: int,
    clients: int,
    postgres_url: str,
    redis_url: str | None,
    gpus: int = 1024,
    settle_seconds: float = 60.0,
    controllers_profile: Path | None = None,
    logs_dir: Path | None = None,
) -> WorkloadResult:
    """Both bursts on one stack; `controllers_profile`: the controller manager runs under
    cProfile and its statistics are written there (pstats; it slows the manager)."""
    from sqlalchemy import create_engine, text

    count = deployments * replicas + jobs * completions
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        drop: Callable[[], None] | None = None
        if database == "sqlite":
            url = f"sqlite:///{data / 'bench.db'}"
        else:
            url, drop = _fresh_postgres(postgres_url)
        try:
            stack = start_stack(
                database,
                data=data,
                url=url,
                port=_free_port(),
                gpus=gpus,
                redis_url=redis_url,
                logs=logs_dir or data,
                controllers=True,
                # room for both bursts at once: 64-vCPU nodes, racks of 16, two zones
                cpu_nodes_per_zone=16 * -(-2 * count // (16 * 2 * 32)),
                wrap={"controllers": [sys.executable, "-m", "cProfile", "-o", str(profile)]}
                if (profile := controllers_profile) is not None and database != "sqlite"
                else None,
            )
        except BaseException:
            if drop:
                drop()
            raise
        port, token = int(stack.env["TESSERA_PORT"]), stack.token
        ca = data / "tls" / "ca.crt"
        engine = create_engine(url)
        try:
            _tessera(stack.env, "namespace", "create", BARE, "--tenant", NAMESPACE)
            time.sleep(3)  # the controller manager takes its Lease, the scheduler its first cycle

            def alive() -> None:
                for role, process in stack.processes.items():
                    if process.poll() is not None:
                        raise RuntimeError(
                            f"tessera {role} exited ({process.returncode}): see "
                            f"{stack.logs / (role + '.log')} (--logs DIR keeps it)"
                        )

            def run(path_docs: list[tuple[str, list[dict[str, Any]]]], namespace: str) -> Burst:
                alive()
                roots = {role: p.pid for role, p in stack.processes.items()}
                cpu = cpu_by_role(roots)
                began, first = time.perf_counter(), datetime.now(UTC)

                async def create_all() -> None:
                    for path, docs in path_docs:
                        _, errors, _, _ = await _create(port, ca, token, path, docs, clients)
                        if errors:
                            raise RuntimeError(f"a create was refused: {errors[0]}")

                asyncio.run(create_all())
                cpu = _wait_bound(
                    engine, namespace, count, began, settle_seconds, namespace, roots, cpu
                )
                return _burst(_rows(engine, namespace), first, cpu)

            print(f"  {count} bare pods from {clients} clients", file=sys.stderr)
            bare = run(
                [(f"/api/v1/namespaces/{BARE}/pods", [bare_pod(f"p-{i}") for i in range(count)])],
                BARE,
            )
            print(
                f"  {deployments} Deployments x {replicas} and {jobs} Jobs x {completions}",
                file=sys.stderr,
            )
            objects = [
                (
                    f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                    [deployment(f"d-{i}", replicas) for i in range(deployments)],
                ),
                (
                    f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                    [job(f"j-{i}", completions) for i in range(jobs)],
                ),
            ]
            workloads = run(objects, NAMESPACE)
            alive()
            with engine.connect() as conn:
                created = conn.execute(
                    text(
                        "SELECT resource, name, created_at FROM objects WHERE namespace = :ns"
                        " AND resource IN ('deployments', 'jobs', 'replicasets')"
                    ).bindparams(ns=NAMESPACE)
                ).all()
            made = {name: _aware(at) for kind, name, at in created if kind != "replicasets"}
            # a Deployment's ReplicaSet is named <deployment>-<template hash>
            sets = {
                name.rsplit("-", 1)[0]: _aware(at)
                for kind, name, at in created
                if kind == "replicasets"
            }
            rows = _rows(engine, NAMESPACE)
        finally:
            engine.dispose()
            stack.stop()
            if drop:
                drop()
    pods_of: dict[str, list[datetime]] = {}
    for labels, created, _ in rows:
        owner = (json.loads(labels) if isinstance(labels, str) else labels or {}).get(OWNER)
        if owner is not None:
            pods_of.setdefault(owner, []).append(_aware(created))
    last = [(max(pods_of[n]) - at).total_seconds() for n, at in made.items() if n in pods_of]
    first = [(min(pods_of[n]) - at).total_seconds() for n, at in made.items() if n in pods_of]
    by_kind: dict[str, tuple[float, float]] = {}
    for kind, prefix in (("Deployment", "d-"), ("Job", "j-")):
        lags = [
            (min(pods_of[n]) - at).total_seconds()
            for n, at in made.items()
            if n in pods_of and n.startswith(prefix)
        ]
        if lags:
            by_kind[kind] = (round(quantile(lags, 0.5), 2), round(quantile(lags, 0.99), 2))
    hops: dict[str, tuple[float, float]] = {}
    for hop, spans in (
        (
            "to its ReplicaSet",
            [(sets[n] - at).total_seconds() for n, at in made.items() if n in sets],
        ),
        (
            "ReplicaSet to first pod",
            [(min(pods_of[n]) - sets[n]).total_seconds() for n in sets if n in pods_of],
        ),
    ):
        if spans:
            hops[hop] = (round(quantile(spans, 0.5), 2), round(quantile(spans, 0.99), 2))
    start = min(made.values(), default=None)
    by_object = [
        (
            n,
            round((at - start).total_seconds(), 3),
            round((min(pods_of[n]) - at).total_seconds(), 3),
        )
        for n, at in sorted(made.items(), key=lambda item: item[1])
        if n in pods_of and start is not None
    ]
    return WorkloadResult(
        database=database,
        deployments=deployments,
        replicas=replicas,
        jobs=jobs,
        completions=completions,
        clients=clients,
        bare=bare,
        workloads=workloads,
        fraction=round(workloads.bound_per_second / bare.bound_per_second, 2)
        if bare.bound_per_second
        else 0.0,
        lag_last_p50_s=round(quantile(last, 0.5), 2) if last else 0.0,
        lag_last_p99_s=round(quantile(last, 0.99), 2) if last else 0.0,
        lag_first_p50_s=round(quantile(first, 0.5), 2) if first else 0.0,
        lag_first_p99_s=round(quantile(first, 0.99), 2) if first else 0.0,
        objects=len(made),
        lag_first_by_kind=by_kind,
        lag_deployment_hops=hops,
        first_pod_lags=by_object,
    )


def report(result: WorkloadResult) -> str:
    bare, work = result.bare, result.workloads
    return "\n".join(
        [
            f"{result.database}: {result.deployments} Deployments x {result.replicas} replicas "
            f"and {result.jobs} Jobs x {result.completions} pods, {result.clients} clients:",
            f"  bare pods: bound {bare.bound}/{bare.pods} in {bare.seconds} s: "
            f"{bare.bound_per_second} pods/s end to end",
            f"  workloads: bound {work.bound}/{work.pods} in {work.seconds} s: "
            f"{work.bound_per_second} pods/s end to end, {result.fraction} of the bare pods' rate",
            "  CPU seconds, bare / workloads: "
            + ", ".join(
                f"{k} {bare.cpu_seconds.get(k, 0.0)} / {v}" for k, v in work.cpu_seconds.items()
            ),
            f"  controller lag over {result.objects} objects, creation to its last pod: p50 "
            f"{result.lag_last_p50_s} s, p99 {result.lag_last_p99_s} s; to its first: p50 "
            f"{result.lag_first_p50_s} s, p99 {result.lag_first_p99_s} s ("
            + ", ".join(
                f"{kind}s {p50} / {p99} s" for kind, (p50, p99) in result.lag_first_by_kind.items()
            )
            + ")",
            "  a Deployment's hops: "
            + ", ".join(
                f"{hop} {p50} / {p99} s" for hop, (p50, p99) in result.lag_deployment_hops.items()
            ),
        ]
    )


def plot(results: list[WorkloadResult], path: Path, *, names: list[str] | None = None) -> None:
    """Each object's lag to its first pod against when it was created in the burst, by kind,
    one panel per run (`names`: which run is which), with the goal's second marked: where in
    the burst the slow ones are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(results), figsize=(8 * len(results), 4.5), squeeze=False, sharey=True
    )
    for index, (axis, result) in enumerate(zip(axes[0], results, strict=True)):
        for kind, prefix, color in (("Deployment", "d-", "tab:blue"), ("Job", "j-", "tab:orange")):
            points = [
                (at, lag) for name, at, lag in result.first_pod_lags if name.startswith(prefix)
            ]
            if points:
                axis.scatter(*zip(*points, strict=True), s=9, color=color, label=f"{kind}s")
        axis.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="goal: p99 under 1 s")
        axis.set_title(
            f"{names[index] if names else result.database}: first-pod lag p50 "
            f"{result.lag_first_p50_s} s, p99 {result.lag_first_p99_s} s"
        )
        axis.set_xlabel("object created, seconds after the burst's first")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8)
    axes[0][0].set_ylabel("seconds to its first pod")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
