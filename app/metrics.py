"""Prometheus metrics (`GET /metrics`, admins only: `kubectl get --raw /metrics`).

Names follow the Kubernetes components' (`apiserver_request_total`,
`scheduler_pod_scheduling_duration_seconds`, ...), so dashboards written for them read Tessera's.

- The API counts every request by verb, group, resource, subresource and code, with a latency
  histogram (long-running requests — watches, followed logs — are counted, not timed).
- The scheduling loop counts attempts by result, times each solve and each pod's creation to
  binding, reports the pending queue, and counts preemptions, their victims and the notice each
  victim was given before it stopped.
- Callback deliveries count their attempts by result and time each attempt.
- The pool's allocation (CPU, memory, GPU VRAM, GPU SM) and the fragment figure the placement
  rank keeps low are read from the database at scrape time, per zone and GPU model.

With several API worker processes (or the scheduler in a process of its own on the same host),
`TESSERA_METRICS_DIR` names a directory the processes share: prometheus-client's multiprocess
mode sums their counters and histograms (the CLI sets `PROMETHEUS_MULTIPROC_DIR` from it before
any process starts). Without it, each process serves its own registry.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, literal_column, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.db.engine import Database
from app.db.models import GPUDevice, Node, table

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own variable

# Buckets as the Kubernetes API server's request latency histogram.
REQUEST_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2, 3, 5, 10, 30, 60)
SCHEDULING_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class Metrics:
    """Every metric Tessera exports. Built on first use (`metrics()`), not at import: in
    multiprocess mode prometheus-client must see `PROMETHEUS_MULTIPROC_DIR` before a metric's
    values exist, and the CLI sets it only once it has read the settings."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "apiserver_request_total",
            "API requests by verb, API group, resource, subresource and HTTP code.",
            ["verb", "group", "resource", "subresource", "code"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "apiserver_request_duration_seconds",
            "API request latency by verb, group, resource and subresource (watches and followed logs "
            "are not timed).",
            ["verb", "group", "resource", "subresource"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.schedule_attempts = Counter(
            "scheduler_schedule_attempts_total",
            "Pods the scheduler tried to place, by result (scheduled, unschedulable, error: a stale "
            "plan retried).",
            ["result"],
            registry=self.registry,
        )
        self.solve_duration = Histogram(
            "scheduler_scheduling_algorithm_duration_seconds",
            "Time the solver took for one batch.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=self.registry,
        )
        self.pod_scheduling = Histogram(
            "scheduler_pod_scheduling_duration_seconds",
            "From a pod's creation to its binding.",
            buckets=SCHEDULING_BUCKETS,
            registry=self.registry,
        )
        self.pending = Gauge(
            "scheduler_pending_pods",
            "Pending pods the last cycle saw: active (tried this cycle) and backoff (waiting to be "
            "tried again).",
            ["queue"],
            multiprocess_mode="livemostrecent",
            registry=self.registry,
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "1 while this scheduler holds the scheduler lease (kube-system/tessera-scheduler).",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.preemption_attempts = Counter(
            "scheduler_preemption_attempts_total",
            "Preemptions carried out (one per preemptor).",
            registry=self.registry,
        )
        self.preemption_victims = Histogram(
            "scheduler_preemption_victims",
            "BestEffort pods told to stop per preemption.",
            buckets=(1, 2, 3, 4, 5, 8, 16, 32),
            registry=self.registry,
        )
        self.preemption_notice = Histogram(
            "tessera_preemption_notice_seconds",
            "The notice a preempted pod was given: from its DisruptionTarget to its stop.",
            buckets=(1, 5, 10, 15, 30, 45, 60, 90, 120, 180, 300),
            registry=self.registry,
        )
        self.callback_attempts = Counter(
            "tessera_callback_attempts_total",
            "Callback delivery attempts by result: delivered, retry (failed, tried again later) "
            "or failed (the last attempt failed).",
            ["result"],
            registry=self.registry,
        )
        self.callback_duration = Histogram(
            "tessera_callback_attempt_duration_seconds",
            "How long one callback delivery attempt took, from resolving the host to the answer.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        # Each request's series, looked up once: prometheus-client's `labels()` checks its
        # arguments and takes a lock on every call.
        self._request_counters: dict[tuple[str, ...], Counter] = {}
        self._request_timers: dict[tuple[str, ...], Histogram] = {}

    def request_counter(self, *labels: str) -> Counter:
        counter = self._request_counters.get(labels)
        if counter is None:
            counter = self._request_counters[labels] = self.requests.labels(*labels)
        return counter

    def request_timer(self, *labels: str) -> Histogram:
        timer = self._request_timers.get(labels)
        if timer is None:
            timer = self._request_timers[labels] = self.request_duration.labels(*labels)
        return timer


_directory: Path | None = None


@lru_cache(maxsize=1)
def metrics() -> Metrics:
    return Metrics()


def use_directory(directory: Path) -> None:
    """Multiprocess mode: this process and those it starts write their metrics to `directory`
    (called by the CLI before anything is counted)."""
    from prometheus_client import values

    global _directory
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROCESS_ENV] = str(directory)  # read by prometheus-client itself
    _directory = directory
    values.ValueClass = values.get_value_class()
    metrics.cache_clear()


def notice_given(conditions: Any, *, at: datetime) -> None:
    """A preempted pod stopped at `at`: count the notice it had, from its DisruptionTarget."""
    for condition in conditions or ():
        if condition.get("type") == "DisruptionTarget" and condition.get("lastTransitionTime"):
            since = datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
            metrics().preemption_notice.observe(max(0.0, (at - since).total_seconds()))
            return


_CODE = re.compile(r"^\d{3}$")


def request_attributes(method: str, template: str, query: bytes) -> tuple[str, str, str, str]:
    """(verb, group, resource, subresource) of a request, from its route's path template
    (`/api/v1/namespaces/{namespace}/pods/{name}/status`), as Kubernetes labels its metrics.
    Paths outside the resource API are labelled by their template, with an empty group."""
    return _attributes(method, template, b"watch=true" in query or b"watch=1" in query)


@lru_cache(maxsize=1024)
def _attributes(method: str, template: str, watching: bool) -> tuple[str, str, str, str]:
    parts = [p for p in template.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return method.lower(), "", template or "/", ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[1].startswith("{"):
        rest = rest[2:]
    resource = rest[0] if rest else ""
    named = len(rest) >= 2
    subresource = rest[2] if len(rest) >= 3 else ""
    verb = {
        "GET": ("get" if named else "watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }.get(method, method.lower())
    if verb == "get" and watching:
        verb = "watch"
    if not rest:  # a group version's discovery document
        verb = method.lower()
    return verb, group, resource, subresource


def _long_running(verb: str, subresource: str, query: bytes) -> bool:
    return verb == "watch" or (subresource == "log" and b"follow=true" in query)


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request by its route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": "500"}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            verb, group, resource, sub = request_attributes(
                scope["method"], template, scope.get("query_string", b"")
            )
            code = status["code"] if _CODE.match(status["code"]) else "500"
            exported = metrics()
            exported.request_counter(verb, group, resource, sub, code).inc()
            if not _long_running(verb, sub, scope.get("query_string", b"")):
                exported.request_timer(verb, group, resource, sub).observe(
                    time.perf_counter() - started
                )


class PoolCollector(Collector):
    """The pool's allocation and fragment per zone and GPU model, read at scrape time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterable[Any]:
        allocated = GaugeMetricFamily(
            "tessera_pool_allocated_ratio",
            "Share of the pool's allocatable capacity held by pods, by resource (cpu, memory, "
            "gpu_memory, gpu_core), zone and GPU model.",
            labels=["resource", "zone", "gpu_model"],
        )
        fragment = GaugeMetricFamily(
            "tessera_pool_fragment_ratio",
            "Idle GPU capacity the recent workload could not use, as a share of all GPU "
            "capacity (the figure placement keeps low), by zone and GPU model.",
            labels=["zone", "gpu_model"],
        )
        for labels, value in self.db.read(_allocation):
            allocated.add_metric(list(labels), value)
        for place, share in self.db.read(_fragments):
            fragment.add_metric(list(place), share)
        yield allocated
        yield fragment


nodes_t, gpus_t = table(Node), table(GPUDevice)


def _allocation(session: Any) -> list[tuple[tuple[str, str, str], float]]:
    out: list[tuple[tuple[str, str, str], float]] = []
    model = (
        select(gpus_t.c.node_name, func.max(gpus_t.c.model).label("model"))
        .group_by(gpus_t.c.node_name)
        .subquery()
    )
    gpu_model = func.coalesce(model.c.model, literal_column("''"))
    rows = session.execute(
        select(
            nodes_t.c.zone,
            gpu_model,
            func.sum(nodes_t.c.cpu_allocatable_milli),
            func.sum(nodes_t.c.cpu_free_milli),
            func.sum(nodes_t.c.memory_allocatable_mib),
            func.sum(nodes_t.c.memory_free_mib),
        )
        .select_from(nodes_t.outerjoin(model, model.c.node_name == nodes_t.c.name))
        .group_by(nodes_t.c.zone, gpu_model)
    ).all()
    for zone, gpu_model, cpu, cpu_free, mem, mem_free in rows:
        if cpu:
            out.append((("cpu", zone or "", gpu_model), 1 - cpu_free / cpu))
        if mem:
            out.append((("memory", zone or "", gpu_model), 1 - mem_free / mem))
    gpu_rows = session.execute(
        select(
            nodes_t.c.zone,
            gpus_t.c.model,
            func.sum(gpus_t.c.vram_mib),
            func.sum(gpus_t.c.vram_free_mib),
            func.count(),
            func.sum(gpus_t.c.core_free_pct),
        )
        .select_from(gpus_t.join(nodes_t, nodes_t.c.name == gpus_t.c.node_name))
        .group_by(nodes_t.c.zone, gpus_t.c.model)
    ).all()
    for zone, gpu_model, vram, vram_free, count, core_free in gpu_rows:
        if vram:
            out.append((("gpu_memory", zone or "", gpu_model), 1 - vram_free / vram))
        if count:
            out.append((("gpu_core", zone or "", gpu_model), 1 - core_free / (100 * count)))
    return out


def _fragments(session: Any) -> list[tuple[tuple[str, str], float]]:
    from scheduler.loop import build_snapshot
    from scheduler.objective import node_fragments

    snapshot = build_snapshot(session)
    if not snapshot.gpus:
        return []
    fragments = node_fragments(snapshot)
    gpus_of: dict[str, list[str]] = {}
    for gpu in snapshot.gpus:
        gpus_of.setdefault(gpu.node, []).append(gpu.model)
    idle: dict[tuple[str, str], float] = {}
    capacity: dict[tuple[str, str], float] = {}
    for node, value in zip(snapshot.nodes, fragments.tolist(), strict=True):
        models = gpus_of.get(node.name)
        if not models:
            continue
        key = (node.zone, models[0])
        idle[key] = idle.get(key, 0.0) + value
        capacity[key] = capacity.get(key, 0.0) + 1000.0 * len(models)
    return [(key, idle[key] / capacity[key]) for key in sorted(idle)]


def registry(db: Database) -> CollectorRegistry:
    """What `/metrics` serves: this process's metrics, or every process's in multiprocess
    mode, and the pool as the database has it now."""
    scraped = CollectorRegistry()
    directory = _directory or os.environ.get(MULTIPROCESS_ENV)  # a worker inherits the variable
    if directory:
        multiprocess.MultiProcessCollector(scraped, path=str(directory))
    else:
        scraped.register(_Delegate(metrics().registry))
    scraped.register(PoolCollector(db))
    return scraped


class _Delegate(Collector):
    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterable[Any]:
        return self.source.collect()


def exposition(db: Database) -> tuple[bytes, str]:
    return generate_latest(registry(db)), CONTENT_TYPE_LATEST
