"""The scheduling loop: database -> snapshot -> solve -> bind.

Each cycle reads the pool and the pending pods in one read transaction, solves them together
(`scheduler.solver.solve`, pure), then binds every placement through the same `bind` the API's
binding endpoint uses. Binding re-checks capacity in the database (CHECK constraints on the free
columns), so a plan made stale by a concurrent change fails its bind and the pod simply waits
for the next cycle: plans are retried, never forced. Pods that do not fit get their
`PodScheduled` condition set to `Unschedulable` with the solver's reason.

When a regular pod or gang does not fit, the loop asks the pure planner
(`scheduler.preempt.plan_preemption`) for the cheapest set of running BestEffort pods whose
release would let it be placed, and carries the plan out in one transaction
(`app.pods.service.preempt`): the victims get the `DisruptionTarget` condition and a notice
period (the agent stops them when it is over: `service.end_preempted`), the preemptor is
nominated to the node being freed. While a nominated preemptor's node still has pods stopping,
it waits rather than evicting a second set, and that node takes no other pod; once they are
gone, the preemptor is solved before the rest of the batch (`solve_reserving`), so the freed
capacity is its own. If it still does not fit, the nomination is dropped and planned again.

Runs as `tessera scheduler`, and inside `tessera dev`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import and_, or_, select, tuple_
from sqlalchemy.orm import Session

from app.constants import LABEL_COSCHEDULING_POD_GROUP, LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE
from app.db.engine import Database, WriteQueue, current_resource_version, written_between
from app.db.models import Change, GPUAllocation, GPUDevice, Node, Pod, PodGroup, Tenant, table
from app.errors import Conflict, TesseraError
from app.inventory.service import GPUShare, Known, Reservation, placeable
from app.kube.meta import now
from app.leases import service as leases
from app.leases.service import Claim
from app.metrics import metrics
from app.podgroups import service as podgroups
from app.pods import service as pods
from app.process import freeze_long_lived
from app.settings import Settings
from app.watch import log as change_log
from app.watch.notify import Notifier
from scheduler.fairshare import (
    SM_PER_GPU,
    Resources,
    Unit,
    contended,
    fair_order,
    pool_capacity,
    pool_free,
    reference_vram,
    solve_in_turn,
)
from scheduler.plan import GpuShare, Placement, Plan, Unschedulable
from scheduler.preempt import (
    NoPreemption,
    PreemptionConfig,
    RunningPod,
    plan_preemption,
    reserved,
    restricted,
)
from scheduler.requests import GangRequest, GpuSlice, PodRequest, Qos, Request, members_of
from scheduler.snapshot import Gpu, Snapshot, TopologyLevel, WorkloadShape
from scheduler.snapshot import Node as SnapshotNode
from scheduler.solver import SolverConfig, solve

log = logging.getLogger("tessera.scheduler")
pods_t = table(Pod)
nodes_t = table(Node)
gpus_t = table(GPUDevice)
groups_t = table(PodGroup)
allocations_t = table(GPUAllocation)
changes_t = table(Change)
tenants_t = table(Tenant)

DEFAULT_SCHEDULER = "tessera"
# The kinds whose changes may give a cycle work: pods (created, deleted, finished), the pool,
# and pod groups (a gang's group made after its members). Leases and events do not.
WAKE_KINDS = ("Pod", "Node", "GPUDevice", *podgroups.CHANGE_KIND.values())
T = TypeVar("T")
TERMINAL_PHASES = pods.TERMINAL_PHASES


@dataclass(frozen=True)
class LoopConfig:
    scheduler_name: str = DEFAULT_SCHEDULER  # only pods with this spec.schedulerName
    batch: int = 512  # pending pods solved together at most
    interval: float = 0.5  # seconds between cycles when nothing is pending
    # Told of commits (`SchedulingLoop.notifier`), a cycle starts as soon as one lands after
    # what the mirror has read, but no sooner than this after the last cycle ended: a stream of
    # commits then makes cycles of many pods, not one cycle per commit.
    min_interval: float = 0.05
    workload_window: int = 2000  # recent pods whose shapes the fragmentation term is measured on
    # The recent workload is read again at most this often, and taken only when it moved by
    # more than `workload_drift` (total variation distance): the placement rank's caches are
    # kept per workload, and one that shifts by a few pods every cycle would empty them.
    workload_every: float = 2.0
    workload_drift: float = 0.05
    # The mirror reads everything again this often (seconds), whatever it missed: a row changed
    # outside Tessera's writes (which all take a new resourceVersion), say by an operator's SQL.
    resync_every: float = 300.0
    backoff: float = 1.0  # seconds before a pod that did not fit is tried again (doubling)
    max_backoff: float = 30.0
    solver: SolverConfig = field(default_factory=SolverConfig)
    # BestEffort pods evicted for regular ones that do not fit; None turns preemption off.
    preemption: PreemptionConfig | None = field(default_factory=PreemptionConfig)
    notice_seconds: int = 30  # a victim's notice: the grace period before it is stopped
    plans_per_cycle: int = 4  # regular requests a cycle tries to plan a preemption for
    # With a claim, only the holder of that lease schedules, and every bind and eviction checks
    # in its own transaction that it still holds it (app/leases/service.py); None: always.
    leader: Claim | None = None
    renew_every: float = 1.0  # seconds between lease renewals (and a standby's attempts)
    # With pods of several tenants waiting, the batch is taken and solved in weighted DRF
    # order (`scheduler.fairshare`); False: by priority then age whatever the tenant (the
    # order before fair share, kept for `tessera bench fairness` to compare against).
    fair_share: bool = True
    # Of a batch larger than what is free in the pool, the pods beyond what fits that a cycle
    # still tries (told why they wait, candidates for preemption, any room the head cannot
    # use): the rest waits untried, so a flood costs a cycle what it may place and this many.
    contended_tail: int = 32
    # A pod pending longer than this (seconds since it was created) fails with reason
    # `PendingTimeout` (`TESSERA_MAX_PENDING_SECONDS`); None: pods wait as long as it takes.
    max_pending_seconds: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LoopConfig:
        """The loop as the deployment's settings configure it (`TESSERA_PREEMPTION*`)."""
        preemption = (
            PreemptionConfig(min_runtime_s=settings.preemption_min_runtime_seconds)
            if settings.preemption
            else None
        )
        return cls(
            **{
                "preemption": preemption,
                "notice_seconds": settings.preemption_notice_seconds,
                "max_pending_seconds": settings.max_pending_seconds,
                **overrides,
            }
        )


@dataclass(frozen=True)
class CycleResult:
    pending: int
    bound: int
    unschedulable: int
    stale: int
    preempted: int = 0  # BestEffort pods told to stop for a regular one
    failed: int = 0  # pods failed for waiting longer than `max_pending_seconds`


def _node_static(row: Mapping[Any, Any]) -> tuple[Any, ...]:
    labels = tuple(sorted((row["labels"] or {}).items()))
    return (
        row["name"],
        row["region"],
        row["zone"],
        row["rack"],
        row["cpu_allocatable_milli"],
        row["memory_allocatable_mib"],
        row["compute_classes"],
        labels,
        bool(row["unschedulable"]) or not row["ready"],
    )


def _gpu_static(row: Mapping[Any, Any]) -> tuple[Any, ...]:
    return (
        row["name"],
        row["node_name"],
        row["index"],
        row["model"],
        row["vram_mib"],
        row["sm_count"],
        placeable(row),
        row["numa_node"],
        row["pcie_switch"],
        row["nvlink_domain"],
        row["rdma_nic"],
    )


def build_snapshot(session: Session, *, workload_window: int = 2000) -> Snapshot:
    """The pool as the solver sees it, read whole: free capacity from the database's free
    columns (the scheduling loop keeps a `Mirror` instead, read by what changed)."""
    node_rows = list(session.execute(select(nodes_t).order_by(nodes_t.c.name)).mappings())
    gpu_rows = list(
        session.execute(select(gpus_t).order_by(gpus_t.c.node_name, gpus_t.c.index)).mappings()
    )
    return _snapshot_of(node_rows, gpu_rows, recent_workload(session, workload_window))


@dataclass
class Changes:
    """What changed in the store since a version (`read_changes`), or everything (`full`)."""

    version: int  # the store's resourceVersion the read is complete up to
    full: bool
    nodes: list[Mapping[Any, Any]]  # rows written since (every row, when full)
    gpus: list[Mapping[Any, Any]]
    pending: list[Mapping[Any, Any]]  # pods written since that wait for a node
    gone: list[str]  # uids of pods written or deleted since that wait no more
    nodes_deleted: list[str]
    gpus_deleted: list[str]
    recent: list[Shape] = field(default_factory=list)  # full reads: the recent pods' shapes
    # pods written since that hold capacity (bound, not ended), `_HELD_COLUMNS` of each (every
    # such pod, when full): what each tenant holds, for fair share
    holding: list[Mapping[Any, Any]] = field(default_factory=list)


def read_changes(session: Session, since: int, *, window: int = 2000) -> Changes:
    """The nodes, GPUs and pending pods written since resourceVersion `since`, and what was
    deleted since (from the change log); everything when `since` < 0 or the change log no longer
    goes back that far.

    The counter is read first: a transaction that committed before it wrote versions at or
    below it and is read here; one that commits later wrote versions above it and is read by the
    next call (versions are handed out in commit order; this one reads up to the counter).
    Deletions are read before the rows, so a row read here is never older than a deletion of it
    read here."""
    version = current_resource_version(session)
    if since < 0 or change_log.compacted_before(session) > since:
        return Changes(
            version,
            True,
            list(session.execute(select(nodes_t)).mappings()),
            list(session.execute(select(gpus_t)).mappings()),
            list(session.execute(select(pods_t).where(_waiting())).mappings()),
            [],
            [],
            [],
            recent_shapes(session, window),
            list(
                session.execute(
                    select(*_HELD_COLUMNS).where(
                        pods_t.c.node_name.is_not(None), pods_t.c.phase.not_in(TERMINAL_PHASES)
                    )
                ).mappings()
            ),
        )
    deleted: dict[str, list[str]] = {"Pod": [], "Node": [], "GPUDevice": []}
    uid = changes_t.c.object[("metadata", "uid")].as_string()
    for kind, name, pod_uid in session.execute(
        select(changes_t.c.kind, changes_t.c.name, uid).where(
            changes_t.c.kind.in_(list(deleted)),
            written_between(changes_t.c.resource_version, since, version),
            changes_t.c.type == "DELETED",
        )
    ):
        deleted[kind].append(pod_uid if kind == "Pod" else name)
    newer = written_between(pods_t.c.resource_version, since, version)
    left = list(session.execute(select(*_HELD_COLUMNS).where(newer, ~_waiting())).mappings())
    return Changes(
        version,
        False,
        list(
            session.execute(
                select(nodes_t).where(written_between(nodes_t.c.resource_version, since, version))
            ).mappings()
        ),
        list(
            session.execute(
                select(gpus_t).where(written_between(gpus_t.c.resource_version, since, version))
            ).mappings()
        ),
        list(session.execute(select(pods_t).where(newer, _waiting())).mappings()),
        deleted["Pod"] + [row["uid"] for row in left],
        deleted["Node"],
        deleted["GPUDevice"],
        holding=[row for row in left if _holds(row)],
    )


def _waiting() -> Any:
    """Pods that wait for a node: not bound, not being deleted, not ended (a pod that waited
    longer than the operator allows fails unbound: `LoopConfig.max_pending_seconds`)."""
    return and_(
        pods_t.c.node_name.is_(None),
        pods_t.c.deletion_timestamp.is_(None),
        pods_t.c.phase.not_in(TERMINAL_PHASES),
    )


# What fair share needs of a pod that holds capacity: its tenant and what it was sold.
_HELD_COLUMNS = (
    pods_t.c.uid,
    pods_t.c.tenant_id,
    pods_t.c.node_name,
    pods_t.c.phase,
    pods_t.c.cpu_milli,
    pods_t.c.memory_mib,
    pods_t.c.gpu_count,
    pods_t.c.gpu_memory_mib,
    pods_t.c.gpu_core_pct,
)


def _holds(row: Mapping[Any, Any]) -> bool:
    return row["node_name"] is not None and row["phase"] not in TERMINAL_PHASES


Held = tuple[int, int, int, int, int]  # CPU, memory, whole GPUs, slice VRAM, slice SM %


def _held(row: Mapping[Any, Any]) -> Held:
    return (
        row["cpu_milli"],
        row["memory_mib"],
        row["gpu_count"],
        row["gpu_memory_mib"],
        row["gpu_core_pct"],
    )


def resources_of(held: Held, vram_per_gpu: int) -> Resources:
    """A pod's amounts (`_held`) in fair share's resources: a whole GPU counts as
    `vram_per_gpu` of VRAM and all of one GPU's SMs (`scheduler.fairshare.pod_demand`)."""
    cpu, memory, gpus, vram, sm = held
    return Resources(cpu, memory, gpus * vram_per_gpu + vram, gpus * SM_PER_GPU + sm)


@dataclass
class Mirror:
    """The scheduler's copy of the pool and of the pods waiting for it, kept from one cycle to
    the next and brought up to date with what changed since (`read_changes`, `apply`): a cycle
    reads the rows written since its last one, not the whole pool.

    The cycle's snapshot is derived from the last one built (`Snapshot.with_free`: numpy work,
    and the per-node score caches carry over) while only free amounts changed; when anything
    static changes (a node or GPU added or removed, its topology, labels, classes, cordon,
    readiness or health), or the caches of the built snapshot hold more than `max_memo` entries
    (one per workload mix and request shape, node selector and compute class seen), it is built
    again. The rows are also what the cycle binds against: a bind checks under lock that they
    are still current (`pods.bind_planned`), so it reads no full row again.

    For fair share it also keeps what each tenant's bound pods hold (`usage`), and counts the
    changes that gave capacity back (`freed`: a node or GPU with more free than before, or new,
    or uncordoned): pods that did not fit are tried again at the next such change rather than
    only once their back-off is over, so what is freed goes by fair share to every tenant that
    waits, not to whoever's back-off happened to be over."""

    max_memo: int = 512
    version: int = -1  # the store's resourceVersion the mirror is complete up to (-1: empty)
    nodes: dict[str, Mapping[Any, Any]] = field(default_factory=dict)
    gpus: dict[str, Mapping[Any, Any]] = field(default_factory=dict)
    node_gpus: dict[str, set[str]] = field(default_factory=dict)  # node -> its GPUs' names
    pending: dict[str, Mapping[Any, Any]] = field(default_factory=dict)
    # The shapes of the pods that came to wait most recently, oldest first: the recent workload.
    recent: deque[Shape] = field(default_factory=lambda: deque(maxlen=2000))
    base: Snapshot | None = None
    full_reads: int = 0
    rebuilds: int = 0
    derived: int = 0
    _static_changed: bool = True
    _free_nodes: set[str] = field(default_factory=set)  # free amounts changed since `base`
    _free_gpus: set[str] = field(default_factory=set)
    _free: tuple[Any, ...] = ()  # (node CPU, node memory, GPU VRAM, GPU SM) in cycle order
    held: dict[str, tuple[int | None, Held]] = field(default_factory=dict)  # uid -> tenant, amounts
    _usage: dict[int | None, list[int]] = field(default_factory=dict)  # tenant -> summed `Held`
    freed: int = 0  # changes that gave capacity back, so far
    # `waiting`'s order, kept from one cycle to the next: (sort key, uid) of the pending pods
    # (and of some gone since, dropped when next read); None: sort all again. The pods that
    # came since are merged in, so a cycle under a flood does not sort ten thousand again.
    _order: list[tuple[tuple[Any, ...], str]] | None = None
    _arrived: list[str] = field(default_factory=list)

    def usage(self, vram_per_gpu: int) -> dict[int | None, Resources]:
        """What each tenant's bound pods hold (tenant None: pods of no tenant)."""
        return {
            tenant: resources_of(tuple(amounts), vram_per_gpu)  # type: ignore[arg-type]
            for tenant, amounts in self._usage.items()
        }

    def _hold(self, uid: str, tenant: int | None, amounts: Held | None) -> None:
        old = self.held.pop(uid, None)
        if old is not None:
            total = self._usage[old[0]]
            for i, value in enumerate(old[1]):
                total[i] -= value
            if not any(total):
                del self._usage[old[0]]
        if amounts is not None:
            self.held[uid] = (tenant, amounts)
            total = self._usage.setdefault(tenant, [0] * len(amounts))
            for i, value in enumerate(amounts):
                total[i] += value

    def apply(self, changes: Changes) -> None:
        if changes.full:
            self.held, self._usage = {}, {}
            for row in changes.holding:
                self._hold(row["uid"], row["tenant_id"], _held(row))
            self.freed += 1
            self.nodes = {r["name"]: r for r in changes.nodes}
            self.gpus = {r["name"]: r for r in changes.gpus}
            self.node_gpus = {}
            for row in changes.gpus:
                self.node_gpus.setdefault(row["node_name"], set()).add(row["name"])
            self.pending = {r["uid"]: r for r in changes.pending}
            self._order, self._arrived = None, []
            self.recent.clear()
            self.recent.extend(changes.recent)
            self._static_changed = True
            self.version = changes.version
            self.full_reads += 1
            return
        for uid in changes.gone:
            self.pending.pop(uid, None)
            if uid in self.held:
                self._hold(uid, None, None)
        for row in changes.holding:
            self._hold(row["uid"], row["tenant_id"], _held(row))
        freed = False
        for name in changes.nodes_deleted:
            self._static_changed |= self.nodes.pop(name, None) is not None
        for name in changes.gpus_deleted:
            gone = self.gpus.pop(name, None)
            if gone is not None:
                self.node_gpus.get(gone["node_name"], set()).discard(name)
                self._static_changed = True
        for row in changes.nodes:
            old = self.nodes.get(row["name"])
            self.nodes[row["name"]] = row
            if old is None or _node_static(old) != _node_static(row):
                self._static_changed = freed = True
            elif (
                row["cpu_free_milli"] > old["cpu_free_milli"]
                or row["memory_free_mib"] > old["memory_free_mib"]
            ):
                freed = True
            self._free_nodes.add(row["name"])
        for row in changes.gpus:
            old = self.gpus.get(row["name"])
            self.gpus[row["name"]] = row
            self.node_gpus.setdefault(row["node_name"], set()).add(row["name"])
            if old is None or _gpu_static(old) != _gpu_static(row):
                self._static_changed = freed = True
            elif (
                row["vram_free_mib"] > old["vram_free_mib"]
                or row["core_free_pct"] > old["core_free_pct"]
            ):
                freed = True
            self._free_gpus.add(row["name"])
        self.freed += freed
        arrived = [r for r in changes.pending if r["uid"] not in self.pending]
        arrived.sort(key=lambda r: r["created_at"])
        self.recent.extend(shape_of(r) for r in arrived)
        for row in changes.pending:
            old_row = self.pending.get(row["uid"])
            if old_row is not None and _wait_key(old_row) != _wait_key(row):
                self._order = None  # its place in the order moved: sort again
        self._arrived.extend(r["uid"] for r in arrived)
        self.pending.update((r["uid"], r) for r in changes.pending)
        self.version = changes.version

    def took(self, reservation: Reservation, bound: Sequence[Mapping[Any, Any]]) -> None:
        """What this scheduler's own bind wrote: the nodes and GPUs as the write left them, and
        the pods (their pending rows) it bound. The next `read_changes` may not bring them yet
        (it reads up to the horizon, which a slower writer of the database can hold below this
        write), and the next cycle must not plan that capacity again or try those pods again."""
        self.nodes.update(reservation.nodes)
        self.gpus.update(reservation.gpus)
        self._free_nodes.update(reservation.nodes)
        self._free_gpus.update(reservation.gpus)
        for row in bound:
            self.pending.pop(row["uid"], None)
            self._hold(row["uid"], row["tenant_id"], _held(row))

    def snapshot(self, workload: tuple[WorkloadShape, ...]) -> Snapshot:
        """The pool now, built again or derived from the last one built (see the class)."""
        base = self.base
        if base is None or self._static_changed or base.cycle.cached_entries > self.max_memo:
            node_rows = [self.nodes[name] for name in sorted(self.nodes)]
            gpu_rows = sorted(self.gpus.values(), key=lambda r: (r["node_name"], r["index"]))
            snapshot = _snapshot_of(node_rows, gpu_rows, workload)
            cycle = snapshot.cycle
            self.base, self._static_changed = snapshot, False
            self._free = tuple(
                a.copy()
                for a in (
                    cycle.node_cpu_free,
                    cycle.node_mem_free,
                    cycle.gpu_free_vram,
                    cycle.gpu_free_sm,
                )
            )
            self._free_nodes.clear()
            self._free_gpus.clear()
            self.rebuilds += 1
            return snapshot
        cycle = base.cycle
        cpu, memory, vram, sm = self._free
        for name in self._free_nodes:
            row, i = self.nodes[name], cycle.node_index[name]
            cpu[i], memory[i] = row["cpu_free_milli"], row["memory_free_mib"]
        for name in self._free_gpus:
            row, g = self.gpus[name], cycle.gpu_number[name]
            vram[g], sm[g] = row["vram_free_mib"], row["core_free_pct"]
        self._free_nodes.clear()
        self._free_gpus.clear()
        self.derived += 1
        return base.with_free(cpu, memory, vram, sm, workload=workload)

    def waiting(self, scheduler_name: str) -> list[Mapping[Any, Any]]:
        """The pending pods this scheduler places, highest priority first, oldest first."""
        pending = self.pending
        if self._order is None:
            self._order = sorted((_wait_key(r), uid) for uid, r in pending.items())
        else:
            fresh = {u for u in self._arrived if u in pending}
            kept = [item for item in self._order if item[1] in pending and item[1] not in fresh]
            self._order = (
                list(heapq.merge(kept, sorted((_wait_key(pending[u]), u) for u in fresh)))
                if fresh
                else kept
            )
        self._arrived = []
        rows = (pending[uid] for _, uid in self._order)
        return [r for r in rows if placed_by(r, scheduler_name)]


def _wait_key(row: Mapping[Any, Any]) -> tuple[Any, ...]:
    return (-row["priority"], row["created_at"], row["uid"])


def _snapshot_of(
    node_rows: Sequence[Mapping[Any, Any]],
    gpu_rows: Sequence[Mapping[Any, Any]],
    workload: tuple[WorkloadShape, ...],
) -> Snapshot:
    nodes = []
    for row in node_rows:
        nodes.append(
            SnapshotNode(
                name=row["name"],
                region=row["region"],
                zone=row["zone"],
                rack=row["rack"],
                cpu_milli_allocatable=row["cpu_allocatable_milli"],
                cpu_milli_free=row["cpu_free_milli"],
                memory_mib_allocatable=row["memory_allocatable_mib"],
                memory_mib_free=row["memory_free_mib"],
                compute_classes=frozenset(row["compute_classes"].split(",")),
                labels=row["labels"],
                cordoned=bool(row["unschedulable"]) or not row["ready"],
            )
        )
    gpus = []
    local_ids: dict[tuple[str, str, str], int] = {}
    for row in gpu_rows:
        node = row["node_name"]
        gpus.append(
            Gpu(
                id=row["name"],
                node=node,
                index=row["index"],
                model=row["model"],
                vram_mib=row["vram_mib"],
                sm_count=row["sm_count"],
                free_vram_mib=row["vram_free_mib"],
                free_sm_pct=row["core_free_pct"],
                healthy=placeable(row),  # Healthy and not tainted
                numa_node=row["numa_node"],
                pcie_switch=local_ids.setdefault(
                    (node, "pcie", row["pcie_switch"]), len(local_ids)
                ),
                nvlink_domain=local_ids.setdefault(
                    (node, "nvl", row["nvlink_domain"] or row["name"]), len(local_ids)
                ),
                rdma_nic=row["rdma_nic"] or None,
            )
        )
    return Snapshot(nodes=tuple(nodes), gpus=tuple(gpus), workload=workload)


def recent_workload(session: Session, window: int) -> tuple[WorkloadShape, ...]:
    """The shapes of the most recent pods and how often each was asked for."""
    return workload_of(recent_shapes(session, window))


Shape = tuple[int, int, int, int, int, str | None]  # GPUs, VRAM, SM %, CPU, memory, GPU model


def recent_shapes(session: Session, window: int) -> list[Shape]:
    """The shapes of the `window` most recently created pods, oldest first."""
    rows = session.execute(
        select(*_SHAPE_COLUMNS).order_by(pods_t.c.created_at.desc()).limit(window)
    ).all()
    return [tuple(row) for row in reversed(rows)]


_SHAPE_COLUMNS = (
    pods_t.c.gpu_count,
    pods_t.c.gpu_memory_mib,
    pods_t.c.gpu_core_pct,
    pods_t.c.cpu_milli,
    pods_t.c.memory_mib,
    pods_t.c.gpu_model,
)


def shape_of(row: Mapping[Any, Any]) -> Shape:
    return tuple(row[c.name] for c in _SHAPE_COLUMNS)


def workload_of(shapes: Iterable[Shape]) -> tuple[WorkloadShape, ...]:
    """The distinct shapes and how often each was asked for."""
    counts = Counter(shapes)
    total = sum(counts.values())
    return tuple(
        WorkloadShape(
            weight=n / total,
            gpus=g,
            vram_mib=v,
            sm_pct=s,
            cpu_milli=c,
            memory_mib=m,
            gpu_models=frozenset({model}) if model else frozenset(),
        )
        for (g, v, s, c, m, model), n in counts.most_common()
    )


def drift(old: Sequence[WorkloadShape], new: Sequence[WorkloadShape]) -> float:
    """Total variation distance between two workloads (0: the same mix, 1: nothing shared)."""

    def weights(workload: Sequence[WorkloadShape]) -> dict[WorkloadShape, float]:
        return {replace(shape, weight=0.0): shape.weight for shape in workload}

    before, after = weights(old), weights(new)
    return sum(abs(before.get(s, 0.0) - after.get(s, 0.0)) for s in before.keys() | after) / 2


# The name scheduler-plugins' manifests give their scheduler (Kubeflow's training operator
# writes it into every gang member): Tessera's scheduler places the members of a
# scheduling.x-k8s.io PodGroup that name it, so those manifests run unchanged.
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"


def placed_by(row: Mapping[Any, Any], scheduler_name: str) -> bool:
    """Whether the loop named `scheduler_name` places the pod: its spec.schedulerName, with
    scheduler-plugins' name read as Tessera's for a member of a coscheduling PodGroup."""
    name = str(row["spec"].get("schedulerName", DEFAULT_SCHEDULER))
    if name == scheduler_name:
        return True
    return (
        scheduler_name == DEFAULT_SCHEDULER
        and name == COSCHEDULING_SCHEDULER
        and LABEL_COSCHEDULING_POD_GROUP in (row["labels"] or {})
    )


@dataclass(frozen=True)
class Batch:
    """What one cycle solves: the requests (pods and gangs), the pod rows by uid, the pods that
    wait without being solved (a group still too small), with the message they wait with, and
    what to add to the reason of a pod that does not fit."""

    requests: list[PodRequest | GangRequest]
    rows: dict[str, Mapping[Any, Any]]
    waiting: list[tuple[str, str]]
    notes: dict[str, str] = field(default_factory=dict)  # pod uid -> added to its reason
    timed: frozenset[str] = frozenset()  # gang keys with a scheduleTimeoutSeconds running
    retried: frozenset[str] = frozenset()  # gang keys of groups that timed out before


LEVELS = {
    "nvlink": TopologyLevel.NVLINK,
    "node": TopologyLevel.NODE,
    "rack": TopologyLevel.RACK,
    "zone": TopologyLevel.ZONE,
}


def build_batch(
    session: Session,
    rows: Sequence[Mapping[Any, Any]],
    *,
    scheduler_name: str,
    nodes: Mapping[str, Mapping[Any, Any]] | None = None,
) -> Batch:
    """Pods on their own become PodRequests; the pending pods of a pod group become one
    GangRequest once the group has `minMember` pods (before that they wait). The groups and all
    their members are read by one query each; `nodes` (node rows by name, if the caller keeps
    them) saves reading the labels of the nodes gangs are anchored to."""
    requests: list[PodRequest | GangRequest] = []
    by_uid: dict[str, Mapping[Any, Any]] = {}
    waiting: list[tuple[str, str]] = []
    notes: dict[str, str] = {}
    timed: set[str] = set()
    retried: set[str] = set()
    keys: set[tuple[str, str]] = set()
    for row in rows:
        if row["pod_group"]:
            keys.add((row["namespace"], row["pod_group"]))
        else:
            requests.append(to_request(row))
            by_uid[row["uid"]] = row
    groups: dict[tuple[str, str], Mapping[Any, Any]] = {}
    members_of_group: dict[tuple[str, str], list[Mapping[Any, Any]]] = {key: [] for key in keys}
    if keys:
        groups = {
            (g["namespace"], g["name"]): g
            for g in session.execute(
                select(groups_t).where(
                    tuple_(groups_t.c.namespace, groups_t.c.name).in_(sorted(keys))
                )
            ).mappings()
        }
        for m in session.execute(
            select(pods_t)
            .where(
                tuple_(pods_t.c.namespace, pods_t.c.pod_group).in_(sorted(keys)),
                pods_t.c.deletion_timestamp.is_(None),
            )
            .order_by(pods_t.c.name)
        ).mappings():
            members_of_group[(m["namespace"], m["pod_group"])].append(m)
    for (namespace, name), members in sorted(members_of_group.items()):
        group = groups.get((namespace, name))
        pending = [m for m in members if m["node_name"] is None and placed_by(m, scheduler_name)]
        if group is None:
            waiting += [
                (
                    m["uid"],
                    f'pod group "{name}" does not exist (any more): create it, or delete the pod',
                )
                for m in pending
            ]
            continue
        if len(members) < group["min_member"]:
            message = f'waiting for the pod group "{name}": {len(members)} of its {group["min_member"]} pods exist'
            waiting += [(m["uid"], message) for m in pending]
            continue
        level = LEVELS.get(group["required_topology"] or "")
        anchor = _anchor(session, members, level, nodes)
        if anchor:
            where = f"{group['required_topology']} of its running members ({_selector(anchor)})"
            clash = [m for m in pending if not _compatible(m, anchor)]
            waiting += [
                (
                    m["uid"],
                    f'its nodeSelector excludes the {where} in pod group "{name}": '
                    "change the selector or delete the pod",
                )
                for m in clash
            ]
            pending = [m for m in pending if m not in clash]
            notes.update(
                {m["uid"]: f'; pod group "{name}" keeps it in the {where}' for m in pending}
            )
        if not pending:
            continue
        requests.append(
            GangRequest(
                key=f"podgroup/{group['uid']}",
                members=tuple(to_request(m, anchor) for m in pending),
                required_level=level,
                preferred_level=LEVELS.get(group["preferred_topology"] or ""),
            )
        )
        by_uid.update({m["uid"]: m for m in pending})
        if group["schedule_timeout_seconds"] is not None:
            timed.add(f"podgroup/{group['uid']}")
        if group["failed_reason"]:  # timed out before: tried again, its mark goes once placed
            retried.add(f"podgroup/{group['uid']}")
    return Batch(requests, by_uid, waiting, notes, frozenset(timed), frozenset(retried))


# The node label that names a required level's domain; NVLink pins to the node.
ANCHOR_LABELS = {
    TopologyLevel.NVLINK: LABEL_HOSTNAME,
    TopologyLevel.NODE: LABEL_HOSTNAME,
    TopologyLevel.RACK: LABEL_RACK,
    TopologyLevel.ZONE: LABEL_ZONE,
}


def _anchor(
    session: Session,
    members: Sequence[Mapping[Any, Any]],
    level: TopologyLevel | None,
    nodes: Mapping[str, Mapping[Any, Any]] | None = None,
) -> dict[str, str]:
    """The node selector that keeps a group's later members inside the domain of its members
    bound and not ended (a member recreated, or the group grown past ``minMember``): the
    pending ones are solved as a gang of their own, so without it they could land in another
    domain. Members that ended (failed with their node, or finished) hold no place: a gang
    whose members all ended is placed anew, wherever it fits."""
    bound = sorted(
        m["node_name"]
        for m in members
        if m["node_name"] is not None and m["phase"] not in TERMINAL_PHASES
    )
    if level is None or not bound:
        return {}
    if nodes is not None and bound[0] in nodes:
        labels = nodes[bound[0]]["labels"]
    else:
        query = select(nodes_t.c.labels).where(nodes_t.c.name == bound[0])
        labels = session.execute(query).scalar()
    labels = labels or {}
    key = ANCHOR_LABELS[level]
    if key not in labels:  # a node without that topology label: keep to the node itself
        key = LABEL_HOSTNAME
    return {key: labels.get(key, bound[0])}


def _compatible(row: Mapping[Any, Any], anchor: Mapping[str, str]) -> bool:
    own = row["spec"].get("nodeSelector") or {}
    return all(own.get(key, value) == value for key, value in anchor.items())


def _selector(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def to_request(row: Mapping[Any, Any], anchor: Mapping[str, str] | None = None) -> PodRequest:
    """The solver's request for a pod row; ``anchor`` adds to the pod's node selector."""
    return PodRequest(
        key=row["uid"],
        cpu_milli=row["cpu_milli"],
        memory_mib=row["memory_mib"],
        gpus=row["gpu_count"],
        gpu_slice=GpuSlice(row["gpu_memory_mib"], row["gpu_core_pct"])
        if row["gpu_memory_mib"]
        else None,
        gpu_models=frozenset({row["gpu_model"]}) if row["gpu_model"] else frozenset(),
        compute_class=row["compute_class"],
        node_selector={**(row["spec"].get("nodeSelector") or {}), **(anchor or {})},
        qos=Qos.BEST_EFFORT if row["qos"] == "best-effort" else Qos.GUARANTEED,
        priority=row["priority"],
    )


class SchedulingLoop:
    """The loop's state between cycles: the write queue, and when each pod that did not fit may
    be tried again (doubling from `backoff` to `max_backoff` seconds, as Kubernetes backs off
    unschedulable pods)."""

    def __init__(
        self, db: Database, config: LoopConfig | None = None, *, notifier: Notifier | None = None
    ) -> None:
        """`notifier`: what wakes the loop when something is committed (in this process, or
        through Redis in any); without one it looks every `interval` seconds."""
        self.db = db
        self.config = config or LoopConfig()
        self.notifier = notifier
        self.writer = WriteQueue(db)
        # uid -> (not before, current back-off, `Mirror.freed` when it was last tried)
        self._retry: dict[str, tuple[float, float, int]] = {}
        self._requeue = False  # this cycle: a pod is due again once capacity is given back
        # the pool and the pending pods, between cycles
        self.mirror = Mirror(recent=deque(maxlen=self.config.workload_window))
        self._resynced = float("-inf")  # when (monotonic) the mirror last read everything
        self._workload: tuple[WorkloadShape, ...] | None = None
        self._workload_read = float("-inf")  # when (monotonic) the workload was last read
        self.leading = self.config.leader is None
        # Campaigns (a thread of their own) and the resignation at the end, one at a time: a
        # campaign still running when the loop stops must not take the lease back after it.
        self._lease_lock = threading.Lock()
        self._resigned = False
        self._campaigned = False  # the first attempt is logged whatever its outcome

    def campaign(self) -> bool:
        """Take or renew the lease (a no-op without a claim); whether this loop leads now."""
        with self._lease_lock:
            return self._campaign()

    def resign(self) -> None:
        """Stop leading for good and give the lease up, so that a standby takes it at its next
        attempt (within `renew_every`) rather than once the lease has expired."""
        claim = self.config.leader
        with self._lease_lock:
            self._resigned, was_leading, self.leading = True, self.leading, False
            if claim is None or not was_leading:
                return
            try:
                released = self.db.write(
                    lambda s: leases.release(s, claim=claim, at=leases.database_time(s))
                )
            except Exception:
                log.exception("could not release the scheduler lease (it expires by itself)")
                return
        if released:
            log.info("released the lease %s/%s", claim.namespace, claim.name)
        metrics().leader.set(0)

    def _campaign(self) -> bool:
        claim = self.config.leader
        if claim is None:
            return True
        if self._resigned:
            return False
        try:
            leading = self.db.write(
                lambda s: leases.acquire(s, claim=claim, at=leases.database_time(s))
            )
        except Exception:
            log.exception("could not renew the scheduler lease")
            leading = False
        if leading != self.leading or not self._campaigned:
            log.info(
                "%s the lease %s/%s as %s",
                "holding" if leading else "waiting for" if self.leading is False else "lost",
                claim.namespace,
                claim.name,
                claim.holder,
            )
        self.leading, self._campaigned = leading, True
        metrics().leader.set(1 if leading else 0)
        return leading

    def run_once(self, now: float | None = None) -> CycleResult:
        now = time.monotonic() if now is None else now
        config = self.config

        mirror = self.mirror
        if now - self._resynced >= config.resync_every:
            mirror.version, self._resynced = -1, now  # read everything
        since = partial(read_changes, since=mirror.version, window=config.workload_window)
        mirror.apply(self.db.read(since))
        waiting = mirror.waiting(config.scheduler_name)
        # With several tenants waiting, capacity given back makes every pod due again, so that
        # it goes by fair share (`_due`); with one, back-offs alone decide, as before.
        self._requeue = config.fair_share and len({r["tenant_id"] for r in waiting}) > 1
        # A nominated preemptor is tried every cycle: the capacity freed for it is its own.
        active = [r for r in waiting if r["nominated_node_name"] or self._due(r["uid"], now)]
        snapshot = (
            mirror.snapshot(self._recent_workload(now)) if active else Snapshot(nodes=(), gpus=())
        )
        rows, fair = self._take(active, snapshot)

        def read(session: Session) -> Batch:
            if not rows:
                return Batch([], {}, [])
            return build_batch(
                session, rows, scheduler_name=config.scheduler_name, nodes=mirror.nodes
            )

        batch = self.db.read(read)
        if fair:
            batch = in_order_of(batch, rows)
        exported = metrics()
        exported.pending.labels("active").set(len(active))
        exported.pending.labels("backoff").set(len(waiting) - len(active))
        _mark(self.writer, batch.waiting, mirror.pending)
        for uid, _ in batch.waiting:
            self._back_off(uid, now)
        if not batch.requests:
            failed = self._expire(waiting, set(), dict(batch.waiting))
            return CycleResult(len(batch.waiting), 0, 0, 0, failed=failed)
        started = time.perf_counter()
        plan = solve_reserving(snapshot, batch, config=config.solver, fair=fair)
        exported.solve_duration.observe(time.perf_counter() - started)
        known = Known(batch.rows, mirror.nodes, mirror.gpus, mirror.node_gpus)
        result = apply(
            plan,
            batch.rows,
            self.writer,
            known=known,
            mirror=mirror,
            notes=batch.notes,
            fence=config.leader,
        )
        # a group marked already is only tried again: nothing to note (no write, no lock)
        self._time_out_gangs(plan, batch.timed - batch.retried)
        self._unmark_placed(plan, batch.retried)
        regular = [item.request for item in plan.unschedulable if _regular(item.request)]
        if regular and config.preemption is not None:
            result = replace(result, preempted=self._preempt(regular, batch.rows, now))
        for item in plan.unschedulable:
            for member in members_of(item.request):
                self._back_off(member.key, now)
        for placement in plan.placements:
            for member in members_of(placement.request):
                self._retry.pop(member.key, None)
        if len(self._retry) > 100_000:
            self._retry.clear()
        if config.max_pending_seconds is not None:
            placed = {m.key for p in plan.placements for m in members_of(p.request)}
            reasons = dict(batch.waiting)
            for item in plan.unschedulable:
                for member in members_of(item.request):
                    reasons[member.key] = item.reason + batch.notes.get(member.key, "")
            result = replace(result, failed=self._expire(waiting, placed, reasons))
        return result

    def _due(self, uid: str, now: float) -> bool:
        """Whether a pending pod is tried this cycle: it never failed to fit, or its back-off
        is over, or (with pods of several tenants waiting) capacity was given back since it
        was last tried (`Mirror.freed`)."""
        retry = self._retry.get(uid)
        return retry is None or retry[0] <= now or (self._requeue and self.mirror.freed > retry[2])

    def _take(
        self, active: Sequence[Mapping[Any, Any]], snapshot: Snapshot
    ) -> tuple[list[Mapping[Any, Any]], bool]:
        """The pods this cycle solves (at most `batch`), and whether they are in fair-share
        order: with pods of one tenant waiting, by priority then age; with several, in the
        order weighted DRF gives them (`scheduler.fairshare.fair_order`: what each tenant's
        bound pods hold, the tenants' weights, a gang as one unit of its whole size). Either
        way bounded by what is free (`scheduler.fairshare.contended`): the pods that fit in
        the pool's free capacity and `contended_tail` more, so that a cycle under a flood of
        thousands tries (and tells why they wait) what it may place, not a whole batch."""
        config = self.config
        if not active:
            return [], False
        vram = reference_vram(snapshot)
        fair = config.fair_share and len({r["tenant_id"] for r in active}) > 1
        if fair:
            units, rows_of = units_of(heads(active, config.batch), vram)
            order = fair_order(
                units,
                capacity=pool_capacity(snapshot),
                usage=self.mirror.usage(vram),
                weights=self.db.read(tenant_weights),
                limit=config.batch,
            )
        else:
            order, rows_of = units_of(active[: config.batch], vram)
        nominated = {
            k for k, rows in rows_of.items() if any(r["nominated_node_name"] for r in rows)
        }
        order = contended(order, pool_free(snapshot), config.contended_tail, nominated)
        return [row for unit in order for row in rows_of[unit.key]], fair

    def _expire(
        self,
        waiting: Sequence[Mapping[Any, Any]],
        placed: set[str],
        reasons: Mapping[str, str],
    ) -> int:
        """Pods that have waited longer than `max_pending_seconds` and were not placed now
        fail (`pods.fail_pending`: reason `PendingTimeout`, an event, the PodFinished callback),
        with the reason they did not fit, at most `EXPIRE_CHUNK` a cycle. How many failed."""
        limit = self.config.max_pending_seconds
        if limit is None:
            return 0
        at = datetime.now(UTC)
        expired: list[tuple[str, str]] = []
        for row in waiting:
            created = row["created_at"]
            waited = (
                at - (created if created.tzinfo else created.replace(tzinfo=UTC))
            ).total_seconds()
            if row["uid"] in placed or waited <= limit:
                continue
            why = reasons.get(row["uid"]) or _last_reason(row)
            expired.append(
                (
                    row["uid"],
                    f"the pod waited {waited:.0f}s for a node, longer than the maximum pending "
                    f"time of {limit:g}s" + (f"; it did not fit: {why}" if why else ""),
                )
            )
            if len(expired) >= EXPIRE_CHUNK:
                break
        if not expired:
            return 0
        try:
            failed: list[str] = self.writer.submit(
                partial(_fenced(pods.fail_pending, self.config.leader), expired=expired)
            ).result()
        except TesseraError as exc:  # the lease is lost: the next leader does it
            log.info("pending pods not failed: %s", exc.message)
            return 0
        for uid in failed:
            self._retry.pop(uid, None)
        if failed:
            log.info("%d pod(s) failed: pending longer than %gs", len(failed), limit)
        return len(failed)

    def _recent_workload(self, now: float) -> tuple[WorkloadShape, ...]:
        """The workload the cycle ranks placements against: the shapes of the pods that came
        to wait most recently (the mirror keeps them), taken as `LoopConfig.workload_every`
        says."""
        config = self.config
        if self._workload is not None and now - self._workload_read < config.workload_every:
            return self._workload
        fresh = workload_of(self.mirror.recent)
        self._workload_read = now
        if self._workload is None or drift(self._workload, fresh) > config.workload_drift:
            self._workload = fresh
        return self._workload

    def _preempt(
        self, regular: Sequence[Request], rows: Mapping[str, Mapping[Any, Any]], now: float
    ) -> int:
        """Plan and carry out at most one preemption, for the first regular request (highest
        priority first) that has a plan; returns how many pods were told to stop."""
        config = self.config
        assert config.preemption is not None

        def read(session: Session) -> tuple[Snapshot | None, list[RunningPod], set[str]]:
            stopping = session.scalars(
                select(pods_t.c.node_name).where(
                    or_(
                        pods_t.c.deletion_timestamp.is_not(None),
                        pods_t.c.disruption_deadline.is_not(None),
                    ),
                    pods_t.c.node_name.is_not(None),
                    pods_t.c.phase.not_in(TERMINAL_PHASES),
                )
            )
            running = running_best_effort(session)
            # no victims, no plan: the pool is read only when there is one to plan on
            snapshot = (
                build_snapshot(session, workload_window=config.workload_window) if running else None
            )
            return snapshot, running, {str(n) for n in stopping}

        snapshot, running, stopping = self.db.read(read)
        # A node being freed for a nominated preemptor is its: no other plan may count on it.
        held = {
            str(row["nominated_node_name"])
            for row in rows.values()
            if row.get("nominated_node_name") in stopping
        }
        if held and snapshot is not None:
            snapshot = reserved(snapshot, (), held_nodes=held)
        for request in regular[: config.plans_per_cycle]:
            members = members_of(request)
            nominated = {m.key: rows[m.key].get("nominated_node_name") for m in members}
            if any(nominated.values()):
                if any(node in stopping for node in nominated.values() if node):
                    continue  # its victims are still stopping: wait for them
                for key, node in nominated.items():  # freed, yet it did not fit: plan again
                    if node:
                        self.writer.submit(partial(pods.clear_nomination, uid=key)).result()
            if not running or snapshot is None:
                continue
            outcome = plan_preemption(
                snapshot,
                request,
                running,
                now_s=int(time.time()),
                competing=[r for r in regular if r.priority > request.priority],
                config=config.preemption,
            )
            if isinstance(outcome, NoPreemption):
                continue
            nominations = {p.pod_key: p.node for p in outcome.placement.pods}
            evicted = self.writer.submit(
                partial(
                    _fenced(pods.preempt, config.leader),
                    nominations=nominations,
                    victims=list(outcome.victims),
                    notice_seconds=config.notice_seconds,
                )
            ).result()
            if evicted:
                metrics().preemption_attempts.inc()
                metrics().preemption_victims.observe(len(evicted))
                log.info(
                    "preempting %d BestEffort pod(s) on %s for %s",
                    len(evicted),
                    ", ".join(outcome.nominated_nodes),
                    request.key,
                )
                for key in nominations:  # tried again once the victims have stopped
                    self._retry[key] = (now + config.notice_seconds, config.backoff, 1 << 62)
                return len(evicted)
        return 0

    def _time_out_gangs(self, plan: Plan, timed: frozenset[str]) -> None:
        """A pod group's gang that did not fit: its first try starts the clock of its
        `scheduleTimeoutSeconds` (scheduling.x-k8s.io groups); once that has run out the group
        is marked timed out with the solver's reason and each member is told (an event). It is
        tried again, as scheduler-plugins does after its timeout, and unmarked once placed."""
        for item in plan.unschedulable:
            if not isinstance(item.request, GangRequest) or item.request.key not in timed:
                continue
            uid = item.request.key.removeprefix("podgroup/")
            failed = self.writer.submit(
                partial(podgroups.note_unplaced, uid=uid, reason=item.reason)
            ).result()
            if failed is None:
                continue
            log.info("pod group %s failed: %s", uid, failed)
            _settle(
                [
                    self.writer.submit(
                        partial(pods.mark_unschedulable, uid=member.key, message=failed)
                    )
                    for member in members_of(item.request)
                ]
            )

    def _unmark_placed(self, plan: Plan, retried: frozenset[str]) -> None:
        """The groups that had timed out and whose gang was placed now lose their mark."""
        _settle(
            [
                self.writer.submit(
                    partial(podgroups.note_placed, uid=key.removeprefix("podgroup/"))
                )
                for key in {placement.request.key for placement in plan.placements} & retried
            ]
        )

    def _back_off(self, uid: str, now: float) -> None:
        _, previous, _ = self._retry.get(uid, (0.0, 0.0, 0))
        delay = min(self.config.max_backoff, previous * 2 if previous else self.config.backoff)
        self._retry[uid] = (now + delay, delay, self.mirror.freed)

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.to_thread(self.campaign)
            await asyncio.sleep(self.config.renew_every)

    async def _pause(self) -> None:
        """Until the next cycle: `interval` seconds, or, with a notifier, until a commit newer
        than what the mirror has read (a pod created or deleted, a node changed; this loop's own
        binds too, read by one more cycle), `min_interval` at the least."""
        if self.notifier is None:
            await asyncio.sleep(self.config.interval)
            return
        floor = min(self.config.min_interval, self.config.interval)
        await asyncio.sleep(floor)
        await self.notifier.wait(self.mirror.version, self.config.interval - floor, WAKE_KINDS)

    async def run_forever(self) -> None:
        renewing = (
            asyncio.create_task(self._keep_lease()) if self.config.leader is not None else None
        )
        try:
            while True:
                if not self.leading:  # a standby: the leader schedules
                    await asyncio.sleep(min(self.config.interval, self.config.renew_every))
                    continue
                try:
                    reads = self.mirror.full_reads
                    result = await asyncio.to_thread(self.run_once)
                    if self.mirror.full_reads != reads:
                        freeze_long_lived()  # the pool just read lives on: not the collector's
                    if result.pending:
                        log.info(
                            "cycle: %d pending, %d bound, %d unschedulable, %d stale",
                            result.pending,
                            result.bound,
                            result.unschedulable,
                            result.stale,
                        )
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("scheduling cycle failed; retrying")
                    await asyncio.sleep(self.config.interval)  # not sooner, whatever is committed
                    continue
                if result.bound == 0 or result.pending < self.config.batch:
                    await self._pause()
        finally:
            if renewing is not None:
                renewing.cancel()
            await asyncio.to_thread(self.writer.close)
            await asyncio.to_thread(self.resign)


def solve_reserving(
    snapshot: Snapshot, batch: Batch, *, config: SolverConfig, fair: bool = False
) -> Plan:
    """Solve a batch so that what preemption freed goes to the preemptor it was freed for: each
    nominated request is solved first, on its nominated nodes only (elsewhere, the evictions
    made for it would be wasted), and the rest of the batch on what they leave, with the nodes
    of preemptors still waiting for their victims to stop held back. A nominated request that
    does not fit waits for the next cycle (the loop plans it again once its node has nothing
    left stopping). Without nominations, one solve.

    `fair`: the batch is in fair-share order, and the rest of it is solved in that order
    (`scheduler.fairshare.solve_in_turn`): what is free goes first to the requests at its head;
    one that did not fit after them says so (`CONTENDED`)."""
    nominated: dict[str, str] = {
        uid: str(row["nominated_node_name"])
        for uid, row in batch.rows.items()
        if row.get("nominated_node_name")
    }
    first = [r for r in batch.requests if any(m.key in nominated for m in members_of(r))]
    if not first:
        return _solve_rest(snapshot, batch.requests, config=config, fair=fair)
    placements: list[Placement] = []
    unschedulable: list[Unschedulable] = []
    held: set[str] = set()
    left = snapshot
    for request in first:
        nodes = frozenset(nominated[m.key] for m in members_of(request) if m.key in nominated)
        head = solve(restricted(left, nodes), [request], config=config)
        placements += head.placements
        unschedulable += head.unschedulable
        if head.placements:
            left = reserved(left, head.placements)
        else:
            held |= nodes
    rest = [r for r in batch.requests if r not in first]
    tail = _solve_rest(reserved(left, (), held_nodes=held), rest, config=config, fair=fair)
    return Plan(
        placements=tuple(placements) + tail.placements,
        unschedulable=tuple(unschedulable) + tail.unschedulable,
        stats=tail.stats,
    )


# Added to the reason of a request solved after the head of a contended batch and not placed.
CONTENDED = (
    "; the pool is contended: what was free went first to tenants further below their fair share"
)


def _solve_rest(
    snapshot: Snapshot, requests: Sequence[Request], *, config: SolverConfig, fair: bool
) -> Plan:
    if not fair:
        return solve(snapshot, requests, config=config)
    plan, tail = solve_in_turn(snapshot, requests, config=config)
    if not tail:
        return plan
    second = {r.key for r in tail}
    return replace(
        plan,
        unschedulable=tuple(
            replace(item, reason=item.reason + CONTENDED) if item.request.key in second else item
            for item in plan.unschedulable
        ),
    )


def heads(rows: Sequence[Mapping[Any, Any]], limit: int) -> list[Mapping[Any, Any]]:
    """The first `limit` of each tenant's pending pods in `rows` (in priority then age order,
    as `Mirror.waiting` gives them), with every pending member of a gang one of them is in: no
    cycle takes more than `limit` pods of one tenant, so a flood of ten thousand costs the
    fair-share order no more than its first `limit`."""
    taken: Counter[int | None] = Counter()
    gangs: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        tenant, gang = row["tenant_id"], row["pod_group"]
        key = (row["namespace"], gang) if gang else None
        if taken[tenant] < limit or key in gangs:
            out.append(row)
            taken[tenant] += 1
            if key is not None:
                gangs.add(key)
    return out


def units_of(
    rows: Sequence[Mapping[Any, Any]], vram_per_gpu: int
) -> tuple[list[Unit], dict[str, list[Mapping[Any, Any]]]]:
    """The pending pods as fair share's units, and the rows of each: a pod alone, or the
    pending members of one pod group together (a gang counts as its whole size)."""
    units: list[Unit] = []
    rows_of: dict[str, list[Mapping[Any, Any]]] = {}
    for row in rows:
        key = f"podgroup/{row['namespace']}/{row['pod_group']}" if row["pod_group"] else row["uid"]
        rows_of.setdefault(key, []).append(row)
    for key, members in rows_of.items():
        if len(members) == 1:
            row = members[0]
            units.append(
                Unit(
                    key,
                    row["tenant_id"],
                    row["priority"],
                    row["created_at"],
                    resources_of(_held(row), vram_per_gpu),
                )
            )
            continue
        summed = [sum(amounts) for amounts in zip(*(_held(row) for row in members), strict=True)]
        demand = resources_of(tuple(summed), vram_per_gpu)
        units.append(
            Unit(
                key=key,
                tenant=members[0]["tenant_id"],
                priority=max(row["priority"] for row in members),
                created=min(row["created_at"] for row in members),
                demand=demand,
                pods=len(members),
            )
        )
    return units, rows_of


def in_order_of(batch: Batch, rows: Sequence[Mapping[Any, Any]]) -> Batch:
    """The batch with its requests in the order of `rows` (a gang where its first member is)."""
    position = {row["uid"]: i for i, row in enumerate(rows)}
    last = len(position)
    requests = sorted(
        batch.requests, key=lambda r: min(position.get(m.key, last) for m in members_of(r))
    )
    return replace(batch, requests=requests)


def tenant_weights(session: Session) -> dict[int | None, float]:
    """The tenants' fair-share weights that are not the default 1."""
    return {
        tenant: float(weight)
        for tenant, weight in session.execute(
            select(tenants_t.c.id, tenants_t.c.weight).where(tenants_t.c.weight != 1)
        )
    }


EXPIRE_CHUNK = 512  # pods failed for their pending time, at most, per cycle


def _last_reason(row: Mapping[Any, Any]) -> str | None:
    """Why the pod did not fit when it was last tried: the message of its
    PodScheduled=False/Unschedulable condition (None: it was never told)."""
    for condition in row.get("conditions") or ():
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return condition.get("message")
    return None


def _regular(request: Request) -> bool:
    """Not BestEffort: a pod or gang that may preempt."""
    return all(m.qos is not Qos.BEST_EFFORT for m in members_of(request))


def running_best_effort(session: Session) -> list[RunningPod]:
    """The BestEffort pods that hold capacity and are not stopping yet: possible victims."""
    rows = session.execute(
        select(
            pods_t.c.uid,
            pods_t.c.namespace,
            pods_t.c.node_name,
            pods_t.c.cpu_milli,
            pods_t.c.memory_mib,
            pods_t.c.gpu_count,
            pods_t.c.priority,
            pods_t.c.pod_group,
            pods_t.c.start_time,
            pods_t.c.bound_at,
        ).where(
            pods_t.c.qos == "best-effort",
            pods_t.c.node_name.is_not(None),
            pods_t.c.phase.not_in(TERMINAL_PHASES),
            pods_t.c.deletion_timestamp.is_(None),
            pods_t.c.disruption_deadline.is_(None),
        )
    ).all()
    if not rows:
        return []
    shares: dict[str, list[GpuShare]] = defaultdict(list)
    by_uid = {r.uid: r for r in rows}
    for a in session.execute(
        select(
            allocations_t.c.pod_uid,
            allocations_t.c.gpu_name,
            allocations_t.c.vram_mib,
            allocations_t.c.core_pct,
            gpus_t.c.index.label("gpu_index"),
        )
        .join(gpus_t, gpus_t.c.name == allocations_t.c.gpu_name)
        .where(allocations_t.c.pod_uid.in_(list(by_uid)))
    ):
        whole = by_uid[a.pod_uid].gpu_count > 0
        shares[a.pod_uid].append(GpuShare(a.gpu_name, a.gpu_index, a.vram_mib, a.core_pct, whole))
    return [
        RunningPod(
            key=r.uid,
            node=r.node_name,
            cpu_milli=r.cpu_milli,
            memory_mib=r.memory_mib,
            gpus=tuple(shares[r.uid]),
            priority=r.priority,
            started_s=int((r.start_time or r.bound_at).timestamp()),
            gang=f"{r.namespace}/{r.pod_group}" if r.pod_group else None,
            qos=Qos.BEST_EFFORT,
        )
        for r in rows
    ]


BIND_CHUNK = 128  # pods bound per transaction: a create waits for the counter lock no longer


def apply(
    plan: Plan,
    rows: Mapping[str, Mapping[Any, Any]],
    writer: WriteQueue,
    *,
    known: Known,
    mirror: Mirror,
    notes: Mapping[str, str] | None = None,
    fence: Claim | None = None,
) -> CycleResult:
    """Bind what was placed and tell the rest why. The placements are bound in writes of about
    `BIND_CHUNK` pods (a gang's members all or none, a stale placement skipped alone), each
    worked out before it from the `known` rows (`pods.plan_binds`; the write only checks they
    are current, `pods.bind_planned`), and the `mirror` takes the nodes and GPUs each write
    left, for the next. With a `fence`, each write first checks that this scheduler still
    holds its lease."""
    groups = [
        [
            (
                rows[pod.pod_key]["uid"],
                pod.node,
                [GPUShare(g.gpu_id, g.vram_mib, g.sm_pct) for g in pod.gpus],
            )
            for pod in placement.pods
        ]
        for placement in plan.placements
    ]
    unplaced = [
        (member.key, item.reason + (notes or {}).get(member.key, ""))
        for item in plan.unschedulable
        for member in members_of(item.request)
    ]
    # A pod that lost out to fair share and was told why it waits before is not told again
    # each cycle (its reason's node counts move with every pod that ends: a write per pod).
    told = [
        (uid, message)
        for uid, message in unplaced
        if CONTENDED not in message or uid not in rows or _last_reason(rows[uid]) is None
    ]
    marked = writer.submit(partial(_mark_all, marks=told, rows=rows))
    outcomes: list[TesseraError | None] = []
    for chunk in _chunks(groups, BIND_CHUNK):
        outcomes += _bind_chunk(chunk, writer, fence=fence, known=known, mirror=mirror)
    bound = stale = 0
    exported = metrics()
    at = datetime.now(UTC)
    for outcome, placement in zip(outcomes, plan.placements, strict=True):
        if outcome is not None:  # the plan went stale (capacity taken, pod deleted): next cycle
            stale += len(placement.pods)
            log.info("bind skipped: %s", outcome.message)
            continue
        bound += len(placement.pods)
        for pod in placement.pods:
            created = rows[pod.pod_key].get("created_at")
            if isinstance(created, datetime):
                waited = at - (created if created.tzinfo else created.replace(tzinfo=UTC))
                exported.pod_scheduling.observe(max(0.0, waited.total_seconds()))
    _settle([marked])
    exported.schedule_attempts.labels("scheduled").inc(bound)
    exported.schedule_attempts.labels("unschedulable").inc(len(unplaced))
    exported.schedule_attempts.labels("error").inc(stale)
    return CycleResult(len(rows), bound, len(unplaced), stale)


def _mark(
    writer: WriteQueue, marks: Sequence[tuple[str, str]], rows: Mapping[str, Mapping[Any, Any]]
) -> None:
    """Tell the pods of `marks` (uid, message) why they wait; see `_mark_all`."""
    if marks:
        _settle([writer.submit(partial(_mark_all, marks=marks, rows=rows))])


def _mark_all(
    session: Session,
    *,
    marks: Sequence[tuple[str, str]],
    rows: Mapping[str, Mapping[Any, Any]],
) -> int:
    """The Unschedulable condition and a FailedScheduling event for pods that did not fit, in
    one write, worked out from the rows the cycle read: a pod that says so already (tried again
    after its back-off, for the same reason) costs nothing, and one that changed since it was
    read is left to the next cycle (`pods.apply_updates`)."""
    at = now()
    updates = [
        update
        for uid, message in marks
        if uid in rows
        and (update := pods.prepare_unschedulable(rows[uid], message, at=at)) is not None
    ]
    return len(pods.apply_updates(session, updates))


Groups = list[list[tuple[str, str, list[GPUShare]]]]


def _chunks(groups: Groups, size: int) -> Iterator[Groups]:
    """Consecutive runs of whole groups of about `size` pods (a gang is never split)."""
    chunk: Groups = []
    pods_in = 0
    for group in groups:
        if chunk and pods_in + len(group) > size:
            yield chunk
            chunk, pods_in = [], 0
        chunk.append(group)
        pods_in += len(group)
    if chunk:
        yield chunk


def _bind_chunk(
    groups: Groups,
    writer: WriteQueue,
    *,
    fence: Claim | None,
    known: Known,
    mirror: Mirror,
) -> list[TesseraError | None]:
    """One write of bindings; the outcome of each group (an error for all of them when the
    write itself failed: the lease lost, or the database refused it)."""
    try:
        # Worked out here from the rows read before; the write only checks they are current.
        node_names = sorted({node for group in groups for _, node, _ in group})
        planned = pods.plan_binds(groups, known.pods, *known.targets(node_names), at=now())
        write = partial(
            _fenced(pods.bind_planned, fence), groups=groups, binds=planned, known=known
        )
        written: pods.Binds = writer.submit(write).result()
    except TesseraError as exc:  # the lease is lost (or the write failed): next cycle
        log.info("binds skipped: %s", exc.message)
        return [exc] * len(groups)
    bound = [
        known.pods[uid]
        for group, outcome in zip(groups, written.outcomes, strict=True)
        if outcome is None
        for uid, _, _ in group
        if uid in known.pods
    ]
    mirror.took(written.reservation, bound)
    return written.outcomes


def _settle(marks: Sequence[Future[Any]]) -> None:
    """Wait for the Unschedulable marks; a pod deleted meanwhile is no error."""
    for mark in marks:
        try:
            mark.result()
        except TesseraError as exc:
            log.info("could not record unschedulable: %s", exc.message)


def _fenced(write: Callable[..., T], claim: Claim | None) -> Callable[..., T]:
    """`write`, refused (a stale plan, for the caller) unless this scheduler holds `claim`."""
    if claim is None:
        return write

    def fenced(session: Session, **kwargs: Any) -> T:
        # judged by the database's clock, as the lease is taken and renewed: a scheduler whose
        # host clock runs slow cannot write past its lease's end
        if not leases.held(session, claim=claim, at=leases.database_time(session)):
            raise Conflict(
                f"this scheduler ({claim.holder}) no longer holds the lease "
                f"{claim.namespace}/{claim.name}: another one schedules"
            )
        return write(session, **kwargs)

    return fenced
