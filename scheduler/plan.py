"""What the solver returns: where each request goes, or why it cannot go anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from scheduler.requests import Request
from scheduler.snapshot import TopologyLevel


class RequestStatus(StrEnum):
    """Outcome of one request.

    ``UNSCHEDULABLE`` means it does not fit now, and the reason says what would make it fit.
    ``ERROR`` means the solver itself failed (a bug or a broken snapshot): retry, not the user's
    fault.
    """

    PLACED = "placed"
    UNSCHEDULABLE = "unschedulable"
    ERROR = "error"


@dataclass(frozen=True)
class GpuShare:
    """The part of one GPU given to a pod: all of it (``whole``) or a slice."""

    gpu_id: str
    index: int
    vram_mib: int
    sm_pct: int
    whole: bool


@dataclass(frozen=True)
class PodPlacement:
    """One pod on one node. ``numa_node`` is the NUMA node its CPUs are pinned to (None: any)."""

    pod_key: str
    node: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuShare, ...] = ()
    numa_node: int | None = None


@dataclass(frozen=True)
class Placement:
    """A placed request: one pod placement per member, in member order.

    ``topology_level`` is the tightest level whose single domain holds every GPU (or node, for
    CPU-only pods) of the request; ``topology_cost`` is the tree cost of ``TopologyCosts``.
    """

    request: Request
    pods: tuple[PodPlacement, ...]
    topology_level: TopologyLevel
    topology_cost: int

    @property
    def key(self) -> str:
        return self.request.key


@dataclass(frozen=True)
class Unschedulable:
    """A request that was not placed, with a reason in words a user can act on.

    ``node_reasons`` counts the nodes rejected for each reason, most frequent first, for
    example ``(("insufficient tessera.io/gpu-memory", 300), ("cordoned", 12))``.
    """

    request: Request
    status: RequestStatus
    reason: str
    node_reasons: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> str:
        return self.request.key


@dataclass(frozen=True)
class SolveStats:
    """How the plan was found, for logs and benchmarks.

    ``method`` is ``cpsat`` (the reduced CP-SAT model), ``greedy`` (the fallback) or ``none``.
    ``cpsat_status`` is CP-SAT's own status name when it ran; ``fallback_reason`` says why the
    greedy plan was used instead.
    """

    method: str
    cpsat_status: str | None = None
    fallback_reason: str | None = None
    variables: int = 0
    candidate_nodes: int = 0
    placed_value: int = 0
    topology_cost: int = 0
    objective: float | None = None
    bound: float | None = None  # CP-SAT's best bound on the objective (exact mode: on topology)


@dataclass(frozen=True)
class Plan:
    """The answer to one batch: every request appears once, placed or unschedulable."""

    placements: tuple[Placement, ...]
    unschedulable: tuple[Unschedulable, ...]
    stats: SolveStats

    def placement(self, key: str) -> Placement | None:
        return next((p for p in self.placements if p.key == key), None)

    def status(self, key: str) -> RequestStatus:
        if self.placement(key) is not None:
            return RequestStatus.PLACED
        for item in self.unschedulable:
            if item.key == key:
                return item.status
        raise KeyError(key)

    @property
    def placed_keys(self) -> frozenset[str]:
        return frozenset(p.key for p in self.placements)
