"""The production solver as a replay policy (``solver``, ``solver@N``).

Each arrival (or window of ``N`` arrivals) becomes a batch of ``scheduler.requests.PodRequest``
solved by :func:`scheduler.solver.solve` on a ``scheduler.snapshot.Snapshot`` of the replay's
cluster state; the plan is applied to the state (which re-checks every placement). So the
replay measures exactly what production runs: the objective of ``scheduler/objective.py``, the
greedy stage, CP-SAT where it can improve on it, and the verification of every plan.

The cluster becomes one static snapshot, built once: a node per trace node, GPUs of 1000 MiB
and 100 SM % (one MiB = one thousandth of the trace's GPU, one SM % = ten), so every trace
share is exact. Each solve derives a snapshot with the current free amounts
(``Snapshot.with_free``, numpy work only), whose FGD-class cache carries over from the previous
solves for every node that did not change. The workload the solver measures against is the
replay's target (the typical pods, with their model constraints). The node order of the solver
is fixed by a seed drawn from the run's policy generator.

The trace is one-dimensional here (the 2-D variant's SM shares are not whole percents), so the
policy sees the 1-D view of the 2-D workloads, as the paper's policies do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.openb.state import ClusterState, Placement, Request
from bench.openb.trace import MAX_GPUS_PER_NODE, MILLI
from scheduler.plan import RequestStatus
from scheduler.requests import GpuSlice, PodRequest
from scheduler.scoring import TargetShapes
from scheduler.snapshot import Gpu, Node, Snapshot, WorkloadShape
from scheduler.solver import SolverConfig, solve

SM_PER_PCT = MILLI // 100


def models_of(mask: int, models: tuple[str, ...]) -> frozenset[str]:
    """The GPU models a trace model mask allows (empty: every model, i.e. no constraint)."""
    every = (1 << len(models)) - 1
    if mask & every == every:
        return frozenset()
    return frozenset(m for i, m in enumerate(models) if mask >> i & 1)


def workload_of(shapes: TargetShapes, models: tuple[str, ...]) -> tuple[WorkloadShape, ...]:
    """The replay's target shapes as the solver's workload."""
    out = []
    for m in range(shapes.size):
        count = int(shapes.count[m])
        milli = int(max(shapes.vram[m], shapes.sm[m]))
        whole = count > 0 and milli >= MILLI
        out.append(
            WorkloadShape(
                weight=float(shapes.weight[m]),
                gpus=count if whole else 0,
                vram_mib=int(shapes.vram[m]) if count and not whole else 0,
                sm_pct=int(shapes.sm[m]) // SM_PER_PCT if count and not whole else 0,
                cpu_milli=int(shapes.cpu[m]),
                memory_mib=round(float(shapes.mem[m])),
                gpu_models=models_of(int(shapes.model_mask[m]), models) if count else frozenset(),
            )
        )
    return tuple(out)


def base_snapshot(state: ClusterState, workload: tuple[WorkloadShape, ...]) -> Snapshot:
    """The cluster as a snapshot with everything free (nodes in replay order)."""
    cluster = state.cluster
    nodes = []
    gpus = []
    for n, name in enumerate(cluster.names):
        nodes.append(
            Node(
                name=name,
                region="openb",
                zone="openb",
                rack=name,
                cpu_milli_allocatable=int(state.cpu_cap[n]),
                cpu_milli_free=int(state.cpu_cap[n]),
                memory_mib_allocatable=int(state.mem_cap[n]),
                memory_mib_free=int(state.mem_cap[n]),
            )
        )
        model = cluster.models[cluster.model[n]] if cluster.model[n] >= 0 else "none"
        for g in range(int(state.n_gpu[n])):
            gpus.append(
                Gpu(
                    id=f"{name}/{g}",
                    node=name,
                    index=g,
                    model=model,
                    vram_mib=MILLI,
                    sm_count=100,
                    free_vram_mib=MILLI,
                    free_sm_pct=100,
                )
            )
    return Snapshot(tuple(nodes), tuple(gpus), workload=workload)


def pod_request(req: Request, models: tuple[str, ...]) -> PodRequest:
    """One arrival as the solver's request (key: its arrival index)."""
    gpu_models = models_of(req.spec_mask, models) if req.num_gpu else frozenset()
    if req.num_gpu == 0:
        return PodRequest(str(req.index), cpu_milli=req.cpu, memory_mib=req.mem)
    if req.is_share:
        return PodRequest(
            str(req.index),
            cpu_milli=req.cpu,
            memory_mib=req.mem,
            gpu_slice=GpuSlice(req.vram, -(-req.sm // SM_PER_PCT)),
            gpu_models=gpu_models,
        )
    return PodRequest(
        str(req.index),
        cpu_milli=req.cpu,
        memory_mib=req.mem,
        gpus=req.num_gpu,
        gpu_models=gpu_models,
    )


class SolverPolicy:
    """See the module docstring."""

    name = "solver"

    def __init__(
        self, state: ClusterState, shapes: TargetShapes, seed: int, config: SolverConfig | None
    ) -> None:
        self.models = state.cluster.models
        self.config = config or SolverConfig(seed=seed)
        self.base = base_snapshot(state, workload_of(shapes, self.models))
        self.present = np.arange(MAX_GPUS_PER_NODE)[None, :] < state.n_gpu[:, None]
        self.node_index = self.base.cycle.node_index

    def snapshot(self, state: ClusterState) -> Snapshot:
        """The state's free amounts on the static snapshot."""
        return self.base.with_free(
            state.cpu_left,
            state.mem_left,
            state.vram_left[self.present],
            state.sm_left[self.present] // SM_PER_PCT,
        )

    def place_batch(self, state: ClusterState, reqs: Sequence[Request]) -> None:
        """Solve the window as one batch and apply the plan to the state."""
        if not reqs:
            return
        by_key = {str(r.index): r for r in reqs}
        plan = solve(
            self.snapshot(state),
            [pod_request(r, self.models) for r in reqs],
            config=self.config,
        )
        errors = [u for u in plan.unschedulable if u.status is RequestStatus.ERROR]
        if errors:
            raise RuntimeError(f"solver error: {errors[0].reason}")
        for placement in plan.placements:
            [pod] = placement.pods
            req = by_key[placement.key]
            gpus = tuple(share.index for share in pod.gpus)
            state.place(req, Placement(self.node_index[pod.node], gpus))
