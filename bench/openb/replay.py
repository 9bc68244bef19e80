"""One replay run: a workload, a policy, a seed (and a batching window).

The run follows :mod:`bench.openb.protocol`: the pods arrive in the seeded, 1.3x-inflated order;
each is placed where the policy says among the nodes where it fits, or dropped when it fits nowhere;
nothing ever leaves. After every decision (or, with a batching window of ``b`` pods, after every
``b`` arrivals have been handled together) the arrived and allocated GPU are logged, and the log is
turned into the allocation-vs-arrived curve of the paper.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.openb.baselines import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    FGDPolicy,
    PackingPolicy,
    Policy,
    RandomPolicy,
    node_ranks,
)
from bench.openb.protocol import MAX_PERCENT, arrival_order, discrete_allocation, typical_shapes
from bench.openb.state import ClusterState, Request
from bench.openb.trace import Cluster, Pods
from scheduler.scoring import TargetShapes

POLICY_SEED_SALT = 0x7E55E7A


class BatchPolicy(Protocol):
    """A policy that places a whole window of arrivals at once (in any order it likes)."""

    name: str

    def place_batch(self, state: ClusterState, reqs: Sequence[Request]) -> None: ...


@dataclass(frozen=True)
class RunSpec:
    workload: str
    policy: str
    seed: int
    batch: int = 1

    @property
    def label(self) -> str:
        suffix = f"@{self.batch}" if self.batch > 1 else ""
        return f"{self.workload}/{self.policy}{suffix}/{self.seed}"


@dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    curve: list[float]  # allocation % at arrived 0..130 % (NaN where the log has no data)
    unallocated_100: float
    alloc_130: float
    pods: int
    placed: int
    seconds: float  # wall time of the run
    cpu_seconds: float  # CPU time of the run (independent of other load on the machine)


def requests_for(policy_view: Pods, demand: np.ndarray) -> list[Request]:
    """One `Request` per arriving pod; `demand` is the GPU-milli each pod counts as when placed."""
    return [
        Request(
            index=i,
            cpu=int(policy_view.cpu[i]),
            mem=int(policy_view.mem[i]),
            num_gpu=int(policy_view.num_gpu[i]),
            vram=int(policy_view.vram[i]),
            sm=int(policy_view.sm[i]),
            spec_mask=int(policy_view.spec_mask[i]),
            demand=float(demand[i]),
        )
        for i in range(policy_view.size)
    ]


def make_policy(
    name: str, state: ClusterState, shapes: TargetShapes, rng: np.random.Generator
) -> Policy | BatchPolicy:
    """Instantiate a policy by name (see `POLICIES`)."""
    simple: dict[str, type[DotProdPolicy | ClusteringPolicy | PackingPolicy | BestFitPolicy]] = {
        "dotprod": DotProdPolicy,
        "clustering": ClusteringPolicy,
        "packing": PackingPolicy,
        "bestfit": BestFitPolicy,
    }
    if name == "random":
        return RandomPolicy(rng)
    if name == "solver":
        from bench.openb.solver import SolverPolicy

        return SolverPolicy(state, shapes, int(rng.integers(1 << 31)), None)
    rank = node_ranks(state.size, rng)
    if name in simple:
        policy: Policy = simple[name](rank)
        return policy
    if name in ("fgd", "fgd-2d"):
        return FGDPolicy(state, shapes, rank)
    if name.startswith("tessera"):
        from bench.openb.tessera import ABLATIONS, TesseraPolicy, config_for

        if name != "tessera" and name not in ABLATIONS:
            raise ValueError(f"unknown policy {name!r}")
        return TesseraPolicy(state, shapes, rank, config_for(name))
    raise ValueError(f"unknown policy {name!r}")


def place_one(state: ClusterState, policy: Policy, req: Request) -> bool:
    """Place `req` where `policy` says among the nodes where it fits; False when it fits nowhere."""
    feasible = np.flatnonzero(state.feasible(req))
    if feasible.size == 0:
        return False
    state.place(req, policy.choose(state, req, feasible))
    return True


def place_window(
    state: ClusterState, policy: Policy | BatchPolicy, reqs: Sequence[Request]
) -> None:
    """Handle a window of arrivals: jointly if the policy can, else one by one in arrival order."""
    if hasattr(policy, "place_batch"):
        policy.place_batch(state, reqs)
    else:
        for req in reqs:
            place_one(state, policy, req)


def replay(
    cluster: Cluster,
    workload: Pods,
    spec: RunSpec,
    *,
    policy_view: Pods | None = None,
    shapes: TargetShapes | None = None,
) -> RunResult:
    """Run one replay. `policy_view` is what the policy sees of each pod (default: the pods).

    The allocation metric always counts the true demand of `workload` (the 2-D variant shows
    1-D policies a projection of each slice, see :mod:`bench.openb.variant2d`).
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    view = workload if policy_view is None else policy_view
    state = ClusterState(cluster)
    order = arrival_order(workload, state.capacity, np.random.default_rng(spec.seed))
    arriving = view.take(order)
    demand = workload.gpu_demand()[order]
    reqs = requests_for(arriving, demand)
    target = typical_shapes(view) if shapes is None else shapes
    policy = make_policy(
        spec.policy, state, target, np.random.default_rng([spec.seed, POLICY_SEED_SALT])
    )

    window = max(1, spec.batch)
    arrived_log: list[float] = []
    allocated_log: list[float] = []
    arrived = 0.0
    for start in range(0, len(reqs), window):
        chunk = reqs[start : start + window]
        if window == 1 and not hasattr(policy, "place_batch"):
            place_one(state, policy, chunk[0])
        else:
            place_window(state, policy, chunk)
        arrived += sum(r.demand for r in chunk)
        arrived_log.append(arrived)
        allocated_log.append(state.allocated)

    curve = discrete_allocation(np.array(arrived_log), np.array(allocated_log), state.capacity)
    placed = int(state.affinity.sum())
    return RunResult(
        spec=spec,
        curve=[float(x) for x in curve],
        unallocated_100=round(100.0 - float(curve[100]), 2),
        alloc_130=float(curve[MAX_PERCENT]),
        pods=len(reqs),
        placed=placed,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu_started,
    )
