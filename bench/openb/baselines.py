"""The paper's six placement policies, with the exact semantics of its simulator.

Every policy scores each feasible node with an integer in 0..100 (the Kubernetes scheduling
framework's range; truncation toward zero, as Go's ``int64(x)`` does), the highest score wins and
ties go to the node that comes first in a random order of the nodes drawn once per run. (The
artifact runs a fork of kube-scheduler and renames every node with a seeded random prefix, so
ties are resolved by that per-run node order rather than by a fresh coin flip each time; we
measured that only this reproduces the published numbers: with uniform tie-breaks FGD leaves about
10 % of the GPUs unallocated instead of 4.8 %.) The artifact enables exactly one score plugin per
run, so its weight and its min-max normalisation (BestFit) change no decision.
Then the GPUs inside the chosen node are picked:

- a pod asking for whole GPUs always gets the lowest-index fully free GPUs;
- a pod asking for a share of one GPU gets, under Random, a GPU chosen uniformly among those with
  room; under FGD, the first GPU with the best FGD score; under the other four ("best"), the GPU
  with the least room left that still fits (lowest index on ties).

Scores (``cpu`` in milli-CPU, ``left`` = free GPU-milli of the node, ``req`` = the pod's total
GPU-milli; constants of the artifact: 128 000 milli-CPU and 8 000 GPU-milli as the largest node):

- **Random**: one feasible node drawn uniformly.
- **DotProd** (Tetris, "merge" dimensions, "max" normalisation): ``100 * (1 - (cpu_left/128000 *
  cpu/128000 + left/8000 * req/8000) / 2)``: the node whose free vector has the *smallest* dot
  product with the request wins.
- **Clustering**: ``25 * (8000 - left) // 8000`` plus 75 if the node only runs pods of the request's
  GPU class (shared / 1 / 2 / 4 / 8 GPUs), 50 if it runs that class among others, 25 if it runs no
  GPU pod, 0 if only other classes; CPU-only pods: 0 everywhere.
- **Packing**: a node with all GPUs free scores ``max(33 - free_gpus, free_gpus)``; else a request
  that has to use fully free GPUs scores ``max(50 - gpus_used, 33)``; else (a shared GPU already in
  use) ``max(100 - (room_left*100 // 1000) // 10, 50)``; CPU-only pods: 0 everywhere.
- **BestFit**: ``100 * (1 - ((cpu_left - cpu)/128000 + (left - req)/8000) / 2)``.
- **FGD**: ``100 * sigmoid((F_before - F_after) / 1000)`` where ``F`` is the node's fragment
  (:mod:`scheduler.scoring`) against the workload's typical pods; a shared-GPU pod is tried on every
  GPU with room, a whole-GPU pod on the lowest-index free GPUs, a CPU-only pod changes only the CPU.

Policies only read the `ClusterState`; the replay applies the returned `Placement`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from bench.openb.state import ClusterState, IntArray, Placement, Request
from bench.openb.trace import MILLI
from scheduler.scoring import (
    TargetShapes,
    fragment_by_shape_from_stats,
    fragment_stats,
    shape_access,
    shape_fits,
)

MAX_NODE_SCORE = 100
MAX_SPEC_CPU = 128_000.0
MAX_SPEC_GPU = 8_000.0
RANK_SPAN = 1 << 20


class Policy(Protocol):
    """Chooses where one request goes among the nodes where it fits (`feasible` is non-empty)."""

    name: str

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement: ...


def pick_best(scores: NDArray[np.int64], candidates: IntArray, rank: IntArray) -> int:
    """The candidate with the highest score; ties go to the lowest `rank` (a node permutation)."""
    key = scores * RANK_SPAN - rank[candidates]
    return int(candidates[int(np.argmax(key))])


def node_ranks(n: int, rng: np.random.Generator) -> IntArray:
    """A random order of the nodes, fixed for a run: the tie-break of every policy."""
    if n > RANK_SPAN:
        raise ValueError(f"at most {RANK_SPAN} nodes")
    return rng.permutation(n).astype(np.int64)


def best_fit_gpu(state: ClusterState, node: int, req: Request) -> tuple[int, ...]:
    """The shared GPU with the least room that still fits (lowest index on ties)."""
    fit = state.fits_gpu(req, np.array([node]))[0]
    left = np.where(fit, state.gpu_left()[node], MILLI + 1)
    return (int(np.argmin(left)),)


def gpus_for(state: ClusterState, node: int, req: Request) -> tuple[int, ...]:
    """GPU choice of the "best" GPU-selection method (DotProd, Clustering, Packing, BestFit)."""
    if req.num_gpu == 0:
        return ()
    if req.is_share:
        return best_fit_gpu(state, node, req)
    return state.lowest_fitting_gpus(node, req)


def gpu_total_left(state: ClusterState, nodes: IntArray) -> NDArray[np.int64]:
    return state.gpu_left()[nodes].sum(axis=1)


@dataclass
class RandomPolicy:
    rng: np.random.Generator
    name: str = "random"

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        node = int(feasible[self.rng.integers(feasible.size)])
        if req.num_gpu == 0:
            return Placement(node, ())
        if req.is_share:
            fit = np.flatnonzero(state.fits_gpu(req, np.array([node]))[0])
            return Placement(node, (int(fit[self.rng.integers(fit.size)]),))
        return Placement(node, state.lowest_fitting_gpus(node, req))


@dataclass
class DotProdPolicy:
    rank: IntArray
    name: str = "dotprod"

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        cpu = state.cpu_left[feasible] / MAX_SPEC_CPU
        gpu = gpu_total_left(state, feasible) / MAX_SPEC_GPU
        dot = cpu * (req.cpu / MAX_SPEC_CPU) + gpu * (req.milli * req.num_gpu / MAX_SPEC_GPU)
        scores = np.trunc(MAX_NODE_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
        node = pick_best(scores, feasible, self.rank)
        return Placement(node, gpus_for(state, node, req))


@dataclass
class ClusteringPolicy:
    rank: IntArray
    name: str = "clustering"

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        if req.num_gpu == 0:
            scores = np.zeros(feasible.size, dtype=np.int64)
        else:
            left = gpu_total_left(state, feasible)
            base = (MAX_NODE_SCORE // 4) * (int(MAX_SPEC_GPU) - left) // int(MAX_SPEC_GPU)
            aff = state.affinity[feasible, 1:]
            kinds = np.count_nonzero(aff, axis=1)
            same = state.affinity[feasible, req.affinity] > 0
            bonus = np.where(same, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
            scores = base + bonus
        node = pick_best(scores, feasible, self.rank)
        return Placement(node, gpus_for(state, node, req))


@dataclass
class PackingPolicy:
    rank: IntArray
    name: str = "packing"

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        if req.num_gpu == 0:
            scores = np.zeros(feasible.size, dtype=np.int64)
        else:
            left = state.gpu_left()[feasible]
            n_gpu = state.n_gpu[feasible]
            free = np.count_nonzero(left == MILLI, axis=1)
            idle_node = free == n_gpu
            if req.is_share:
                room = np.where(left >= req.milli, left, MILLI + 1).min(axis=1)
                shared = np.maximum(MAX_NODE_SCORE - (room * 100 // MILLI) // 10, 50)
                used_node = np.where(room == MILLI, max(50 - 1, 33), shared)
            else:
                used_node = np.full(feasible.size, max(50 - req.num_gpu, 33))
            scores = np.where(idle_node, np.maximum(33 - free, free), used_node)
        node = pick_best(scores, feasible, self.rank)
        return Placement(node, gpus_for(state, node, req))


@dataclass
class BestFitPolicy:
    rank: IntArray
    name: str = "bestfit"

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        cpu = (state.cpu_left[feasible] - req.cpu) / MAX_SPEC_CPU * 0.5
        gpu = (gpu_total_left(state, feasible) - req.milli * req.num_gpu) / MAX_SPEC_GPU * 0.5
        scores = np.trunc((1.0 - (cpu + gpu)) * MAX_NODE_SCORE).astype(np.int64)
        node = pick_best(scores, feasible, self.rank)
        return Placement(node, gpus_for(state, node, req))


def fgd_score(delta: NDArray[np.float64]) -> NDArray[np.int64]:
    """FGD's integer score of a fragment decrease (GPU-milli): ``int(100 * sigmoid(d / 1000))``."""
    return np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)


@dataclass
class FragmentTracker:
    """Per-node fragment summary (:func:`scheduler.scoring.fragment_stats`), refreshed lazily.

    Keeps, for every node, the number of GPUs fitting each target shape, the idle capacity stranded
    on the other GPUs, the total idle capacity and the current per-shape fragment ``F(n, m)``;
    nodes whose `ClusterState.version` moved are recomputed on `refresh`.
    """

    shapes: TargetShapes
    state: ClusterState
    memory: bool = False  # shapes also need host memory (FGD ignores it)
    access: NDArray[np.bool_] = field(init=False)
    n_fit: NDArray[np.int64] = field(init=False)
    stranded: NDArray[np.float64] = field(init=False)
    idle: NDArray[np.float64] = field(init=False)
    frag: NDArray[np.float64] = field(init=False)  # [N, M]
    version: IntArray = field(init=False)

    def __post_init__(self) -> None:
        self.access = shape_access(self.state.model, self.shapes)
        self.version = np.full(self.state.size, -1, dtype=np.int64)
        self.n_fit = np.zeros((self.state.size, self.shapes.size), dtype=np.int64)
        self.stranded = np.zeros((self.state.size, self.shapes.size))
        self.idle = np.zeros(self.state.size)
        self.frag = np.zeros((self.state.size, self.shapes.size))
        self.refresh()

    def refresh(self) -> None:
        stale = np.flatnonzero(self.version != self.state.version)
        if stale.size == 0:
            return
        st = self.state
        n_fit, stranded, idle = fragment_stats(st.vram_left[stale], st.sm_left[stale], self.shapes)
        self.n_fit[stale] = n_fit
        self.stranded[stale] = stranded
        self.idle[stale] = idle
        self.frag[stale] = fragment_by_shape_from_stats(
            n_fit,
            stranded,
            idle,
            st.cpu_left[stale],
            self.access[stale],
            self.shapes,
            self._mem(st.mem_left[stale]),
        )
        self.version[stale] = st.version[stale]

    def after_share(self, nodes: IntArray, req: Request) -> NDArray[np.float64]:
        """``[r, 8, M]``: per-shape fragment if `req` (a GPU share) went on each GPU of `nodes`."""
        st, sh = self.state, self.shapes
        v, s = st.vram_left[nodes], st.sm_left[nodes]
        v2, s2 = v - req.vram, s - req.sm
        fit_old, fit_new = shape_fits(v, s, sh), shape_fits(v2, s2, sh)  # [r, M, G]
        idle_old, idle_new = (v + s) / 2.0, (v2 + s2) / 2.0
        d_fit = (fit_new.astype(np.int64) - fit_old).transpose(0, 2, 1)  # [r, G, M]
        d_stranded = (
            (~fit_new) * idle_new[:, None, :] - (~fit_old) * idle_old[:, None, :]
        ).transpose(0, 2, 1)
        return fragment_by_shape_from_stats(
            self.n_fit[nodes][:, None, :] + d_fit,
            self.stranded[nodes][:, None, :] + d_stranded,
            self.idle[nodes][:, None] - (req.vram + req.sm) / 2.0,
            (st.cpu_left[nodes] - req.cpu)[:, None],
            self.access[nodes][:, None, :],
            sh,
            self._mem((st.mem_left[nodes] - req.mem)[:, None]),
        )

    def after_share_at(self, nodes: IntArray, gpus: IntArray, req: Request) -> NDArray[np.float64]:
        """``[p, M]``: per-shape fragment if `req` (a GPU share) went on GPU ``gpus[i]`` of
        ``nodes[i]`` (only that GPU's contribution changes)."""
        st, sh = self.state, self.shapes
        v, s = st.vram_left[nodes, gpus], st.sm_left[nodes, gpus]
        v2, s2 = v - req.vram, s - req.sm
        fit_old = (v[:, None] >= sh.vram) & (s[:, None] >= sh.sm)  # [p, M]
        fit_new = (v2[:, None] >= sh.vram) & (s2[:, None] >= sh.sm)
        idle_old, idle_new = (v + s) / 2.0, (v2 + s2) / 2.0
        d_stranded = (~fit_new) * idle_new[:, None] - (~fit_old) * idle_old[:, None]
        return fragment_by_shape_from_stats(
            self.n_fit[nodes] + fit_new.astype(np.int64) - fit_old,
            self.stranded[nodes] + d_stranded,
            self.idle[nodes] - (req.vram + req.sm) / 2.0,
            st.cpu_left[nodes] - req.cpu,
            self.access[nodes],
            sh,
            self._mem(st.mem_left[nodes] - req.mem),
        )

    def after_whole(self, nodes: IntArray, req: Request) -> NDArray[np.float64]:
        """``[r, M]``: per-shape fragment if `req` went on the lowest fitting GPUs of `nodes`."""
        st = self.state
        if req.num_gpu == 0 or (req.vram == MILLI and req.sm == MILLI):
            # Only CPU changes, or whole free GPUs are emptied: every shape fitted them and
            # they leave no idle capacity, so the summary changes by simple counts.
            return fragment_by_shape_from_stats(
                self.n_fit[nodes] - req.num_gpu,
                self.stranded[nodes],
                self.idle[nodes] - MILLI * req.num_gpu,
                st.cpu_left[nodes] - req.cpu,
                self.access[nodes],
                self.shapes,
                self._mem(st.mem_left[nodes] - req.mem),
            )
        v, s = st.vram_left[nodes], st.sm_left[nodes]
        fit = (v >= req.vram) & (s >= req.sm)
        take = fit & (np.cumsum(fit, axis=1) <= req.num_gpu)
        v, s = v - take * req.vram, s - take * req.sm
        n_fit, stranded, idle = fragment_stats(v, s, self.shapes)
        return fragment_by_shape_from_stats(
            n_fit,
            stranded,
            idle,
            st.cpu_left[nodes] - req.cpu,
            self.access[nodes],
            self.shapes,
            self._mem(st.mem_left[nodes] - req.mem),
        )

    def _mem(self, mem_free: IntArray) -> IntArray | None:
        return mem_free if self.memory else None


@dataclass
class _ScoreCache:
    """Cached node scores for one request key, valid while the node's version is unchanged."""

    score: NDArray[np.int64]
    gpu: NDArray[np.int64]
    version: IntArray


class FGDPolicy:
    """Fragmentation Gradient Descent, exactly as the paper's FGD score plugin."""

    name = "fgd"

    def __init__(self, state: ClusterState, shapes: TargetShapes, rank: IntArray) -> None:
        self.rank = rank
        self.tracker = FragmentTracker(shapes, state)
        self.cache: dict[tuple[int, int, int, int], _ScoreCache] = {}

    def _scores(self, req: Request, nodes: IntArray) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        tr = self.tracker
        if req.is_share:
            after = tr.after_share(nodes, req)  # [r, G, M]
            delta = (tr.frag[nodes][:, None, :] - after) @ tr.shapes.weight
            fits = tr.state.fits_gpu(req, nodes)
            per_gpu = np.where(fits, fgd_score(delta), -1)
            gpu = np.argmax(per_gpu, axis=1)
            return per_gpu[np.arange(nodes.size), gpu], gpu
        after = tr.after_whole(nodes, req)
        delta = (tr.frag[nodes] - after) @ tr.shapes.weight
        return fgd_score(delta), np.full(nodes.size, -1, dtype=np.int64)

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        self.tracker.refresh()
        key = (req.cpu, req.vram, req.sm, req.num_gpu)
        cache = self.cache.get(key)
        if cache is None:
            n = state.size
            cache = _ScoreCache(
                np.zeros(n, dtype=np.int64),
                np.zeros(n, dtype=np.int64),
                np.full(n, -1, dtype=np.int64),
            )
            self.cache[key] = cache
        stale = feasible[cache.version[feasible] != state.version[feasible]]
        if stale.size:
            cache.score[stale], cache.gpu[stale] = self._scores(req, stale)
            cache.version[stale] = state.version[stale]
        node = pick_best(cache.score[feasible], feasible, self.rank)
        if req.is_share:
            return Placement(node, (int(cache.gpu[node]),))
        return Placement(node, state.lowest_fitting_gpus(node, req))


BASELINES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
PAPER_NAMES = {
    "random": "Random",
    "dotprod": "DotProd",
    "clustering": "GpuClustering",
    "packing": "GpuPacking",
    "bestfit": "BestFit",
    "fgd": "FGD",
}
