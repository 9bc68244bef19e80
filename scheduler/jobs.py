"""Jobs: the solver's internal form of a batch of requests.

Two kinds of job:

* a **gang** is one ``GangRequest``: all members are placed or none (one unit);
* a **pod class** is a set of independent ``PodRequest`` with the same shape, priority and QoS:
  any number of them (units) may be placed, and which pod goes where does not matter.

Grouping identical pods keeps the model small: 300 one-GPU pods become one integer count per
candidate node, not 300 booleans per node. Members of a job with the same :class:`Shape` form a
:class:`Group`. Everything here is deterministic: jobs are ordered by priority, then QoS, then
the size of one unit (whole-GPU requests and gangs largest first; slices and CPU-only pods
count as no size, so they keep their arrival order), then by the position of their first
request in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from scheduler.requests import GangRequest, PodRequest, Qos, Request
from scheduler.snapshot import TopologyLevel

_QOS_ORDER = {Qos.GUARANTEED: 0, Qos.BURSTABLE: 1, Qos.BEST_EFFORT: 2}


class Kind(Enum):
    CPU = "cpu"  # no GPU
    WHOLE = "whole"  # whole GPUs on one node
    SLICE = "slice"  # a share of one GPU


@dataclass(frozen=True)
class Shape:
    """Everything about a pod that decides where it can go and what it takes there."""

    cpu_milli: int
    memory_mib: int
    gpus: int
    vram_mib: int
    sm_pct: int
    gpu_models: frozenset[str]
    compute_class: str | None
    selector: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, pod: PodRequest) -> Shape:
        s = pod.gpu_slice
        return cls(
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            gpus=pod.gpus,
            vram_mib=s.vram_mib if s else 0,
            sm_pct=s.sm_pct if s else 0,
            gpu_models=pod.gpu_models,
            compute_class=pod.compute_class,
            selector=tuple(sorted(pod.node_selector.items())),
        )

    @property
    def kind(self) -> Kind:
        if self.gpus > 0:
            return Kind.WHOLE
        return Kind.SLICE if self.sm_pct > 0 else Kind.CPU

    def describe(self) -> str:
        parts = [f"{self.cpu_milli}m cpu", f"{self.memory_mib}Mi memory"]
        if self.kind is Kind.WHOLE:
            parts.append(f"{self.gpus} nvidia.com/gpu")
        elif self.kind is Kind.SLICE:
            parts.append(
                f"{self.vram_mib}Mi tessera.io/gpu-memory, {self.sm_pct} tessera.io/gpu-core"
            )
        return ", ".join(parts)


@dataclass(frozen=True)
class Group:
    """Members of one job that share a shape, in request order."""

    shape: Shape
    pods: tuple[PodRequest, ...]

    @property
    def count(self) -> int:
        return len(self.pods)


@dataclass(frozen=True, eq=False)
class Job:
    """One gang or one pod class (see the module docstring).

    ``units`` is 1 for a gang and the number of pods for a class. ``value`` is what placing one
    unit is worth in the objective: its demand weighted by its priority rank.
    """

    index: int
    key: str
    requests: tuple[Request, ...]
    groups: tuple[Group, ...]
    is_gang: bool
    required: TopologyLevel | None
    preferred: TopologyLevel | None
    priority: int
    qos: Qos
    value: int
    first_position: int

    @property
    def units(self) -> int:
        return 1 if self.is_gang else len(self.requests)

    @property
    def pod_count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def unit_gpus(self) -> int:
        """GPUs of one unit, for ordering: a gang's whole GPUs (a slice counting as one), a pod
        class's whole GPUs per pod (0 for slices and CPU-only pods)."""
        if self.is_gang:
            return self.gpu_demand
        shape = self.groups[0].shape
        return shape.gpus if shape.kind is Kind.WHOLE else 0

    @property
    def gpu_demand(self) -> int:
        """Whole GPUs the job needs, counting a slice as one (used for ordering only)."""
        return sum(
            g.count * max(g.shape.gpus, 1 if g.shape.kind is Kind.SLICE else 0) for g in self.groups
        )


def demand_units(shape: Shape, reference_vram_mib: int) -> int:
    """Size of one pod in the objective: 1000 per GPU (a slice counts its larger share), plus
    one per CPU core so CPU-only pods count too."""
    if shape.kind is Kind.WHOLE:
        gpu = 1000 * shape.gpus
    elif shape.kind is Kind.SLICE:
        vram_share = -(-1000 * shape.vram_mib // max(reference_vram_mib, 1))
        gpu = min(1000, max(10 * shape.sm_pct, vram_share))
    else:
        gpu = 0
    return gpu + max(1, -(-shape.cpu_milli // 1000))


def build_jobs(requests: Sequence[Request], reference_vram_mib: int) -> list[Job]:
    """Turn a batch into jobs, ordered as the greedy stage will place them."""
    keys = [r.key for r in requests]
    if len(set(keys)) != len(keys):
        raise ValueError("request keys must be unique within a batch")
    ranks = {p: i + 1 for i, p in enumerate(sorted({_priority(r) for r in requests}))}

    jobs: list[Job] = []
    classes: dict[tuple[Shape, int, Qos], list[tuple[int, PodRequest]]] = {}
    for position, request in enumerate(requests):
        if isinstance(request, GangRequest):
            jobs.append(_gang_job(request, position, ranks, reference_vram_mib))
        else:
            classes.setdefault((Shape.of(request), request.priority, request.qos), []).append(
                (position, request)
            )
    for (shape, priority, qos), items in classes.items():
        pods = tuple(p for _, p in items)
        jobs.append(
            Job(
                index=-1,
                key=pods[0].key if len(pods) == 1 else f"{pods[0].key} (+{len(pods) - 1} alike)",
                requests=pods,
                groups=(Group(shape, pods),),
                is_gang=False,
                required=None,
                preferred=None,
                priority=priority,
                qos=qos,
                value=demand_units(shape, reference_vram_mib) * ranks[priority],
                first_position=items[0][0],
            )
        )
    jobs.sort(
        key=lambda j: (
            -j.priority,
            _QOS_ORDER[j.qos],
            -j.unit_gpus,
            -(j.pod_count if j.is_gang else 0),
            j.first_position,
        )
    )
    return [_with_index(j, i) for i, j in enumerate(jobs)]


def _priority(request: Request) -> int:
    return request.priority


def _gang_job(gang: GangRequest, position: int, ranks: dict[int, int], ref_vram: int) -> Job:
    by_shape: dict[Shape, list[PodRequest]] = {}
    for m in gang.members:
        by_shape.setdefault(Shape.of(m), []).append(m)
    groups = tuple(Group(s, tuple(p)) for s, p in by_shape.items())
    groups = tuple(sorted(groups, key=lambda g: -g.count * demand_units(g.shape, ref_vram)))
    qos = min((m.qos for m in gang.members), key=lambda q: _QOS_ORDER[q])
    return Job(
        index=-1,
        key=gang.key,
        requests=(gang,),
        groups=groups,
        is_gang=True,
        required=gang.required_level,
        preferred=gang.preferred_level,
        priority=gang.priority,
        qos=qos,
        value=sum(demand_units(Shape.of(m), ref_vram) for m in gang.members) * ranks[gang.priority],
        first_position=position,
    )


def _with_index(job: Job, index: int) -> Job:
    return replace(job, index=index)
