"""Tessera's placement policy, as run in the openb replay.

Each request is placed on the feasible candidate that is best in this lexicographic order:

1. **Model reservation** (GPU requests). Requests constrained to some GPU models put a load
   ``load[k]`` on each model ``k`` (expected constrained demand, when the arrived request equals the
   cluster's capacity, divided by ``k``'s capacity; from the target shapes). While the idle capacity
   of model ``k`` is below ``reserve_factor * load[k] * capacity[k] * (1 - allocated fraction)``,
   its nodes come last for every GPU request, so flexible requests leave scarce models to the
   requests that can only use them.
2. **Packing loss** (slice requests, :func:`scheduler.scoring.packing_loss`): the GPUs' worth of
   packing efficiency lost by putting the slice into each GPU gap, priced by the LP dual prices of
   the target's slice mix. A slice goes where it completes or continues an optimal pattern (a 0.47
   next to another 0.47, a 0.16 into the 0.19 left by a 0.81, a 0.32 next to a 0.65), not where it
   merely fits.
3. **Host stranding** (:func:`scheduler.scoring.stranded_idle`): the increase of the node's idle
   GPU capacity that lacks its share of CPU (the target's CPU per GPU), so CPU-heavy requests do
   not pile up where they would leave GPUs without CPU.
4. **FGD class**: the paper's FGD score of the placement (``int(100 * sigmoid(-dF / 1000))``
   with the fragment ``F`` of :mod:`scheduler.scoring`). The coarse integer class is kept on
   purpose: ranking by the exact fragment increase measured much worse (it spreads load),
   the integer class lets the node order below consolidate load on few nodes, first-fit style.
5. For CPU-only requests, the node's idle GPU capacity (prefer nodes whose GPUs are already used).
6. **Node order**: a random order of the nodes fixed for the run (first-fit), then the GPU index.

The ``tessera-no-loss``, ``tessera-no-strand`` and ``tessera-no-reserve`` policies switch one
criterion off (ablations). With a batching window, the window's whole-GPU requests are placed
first (largest first), then the others in arrival order, each with the rule above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.openb.baselines import FragmentTracker, fgd_score
from bench.openb.state import ClusterState, IntArray, Placement, Request
from bench.openb.trace import MAX_GPUS_PER_NODE, MILLI
from scheduler.objective import cpu_per_gpu, slice_mix_prices
from scheduler.objective import model_load as objective_model_load
from scheduler.scoring import TargetShapes, packing_loss, stranded_idle

NO_CANDIDATE = np.iinfo(np.int64).max
_LOSS_SPAN = 1 << 16  # > any quantised packing loss: the reservation tier dominates it


@dataclass(frozen=True)
class TesseraConfig:
    reserve_factor: float = 3.0  # safety factor of the model reservation (0 = no reservation)
    packing_loss: bool = True  # rank slices by LP packing loss (ablation switch)
    stranding: bool = True  # rank by CPU stranding (ablation switch)
    loss_step: float = 0.01  # resolution of the packing loss, GPUs
    strand_step: float = 100.0  # resolution of the stranding increase, GPU-milli
    window_order: str = "whole-first"  # or "arrival"


ABLATIONS = {
    "tessera-no-loss": TesseraConfig(packing_loss=False),
    "tessera-no-strand": TesseraConfig(stranding=False),
    "tessera-no-reserve": TesseraConfig(reserve_factor=0.0),
}


def config_for(policy: str) -> TesseraConfig:
    """The configuration of ``tessera`` or one of its ablations."""
    return ABLATIONS.get(policy, TesseraConfig())


def model_load(shapes: TargetShapes, state: ClusterState) -> NDArray[np.float64]:
    """Per GPU model: constrained demand at 100 % arrived, as a fraction of the model's capacity
    (:func:`scheduler.objective.model_load` over the replay cluster's GPUs per model)."""
    n_models = len(state.cluster.models)
    cap = np.array([state.n_gpu[state.model == k].sum() for k in range(n_models)], dtype=float)
    return objective_model_load(shapes, cap)


@dataclass
class _Cache:
    """FGD classes for one request key, valid while the node's version is unchanged."""

    fgd: NDArray[np.int64]  # [N] or [N, 8]
    version: IntArray  # same shape: the node version each entry was computed for


class TesseraPolicy:
    """See the module docstring."""

    name = "tessera"

    def __init__(
        self,
        state: ClusterState,
        shapes: TargetShapes,
        rank: IntArray,
        config: TesseraConfig | None = None,
    ) -> None:
        self.config = config or TesseraConfig()
        self.state = state
        self.rank = rank
        self.tracker = FragmentTracker(shapes, state)
        self.prices = slice_mix_prices(shapes)
        self.cpu_per_idle = cpu_per_gpu(shapes)
        self.load = model_load(shapes, state)
        self.model_of = np.maximum(state.model, 0)
        self.model_cap = np.bincount(
            self.model_of, weights=state.n_gpu * MILLI, minlength=self.load.size
        ).astype(np.float64)
        self.cache: dict[tuple[int, ...], _Cache] = {}
        self.loss_tables: dict[tuple[int, int], NDArray[np.int64]] = {}

    # ------------------------------------------------------------------ criteria
    def _protected(self, nodes: IntArray) -> IntArray:
        """1 for nodes whose model is reserved for the requests constrained to it."""
        st = self.state
        idle = np.bincount(self.model_of, weights=self.tracker.idle, minlength=self.load.size)
        left = max(0.0, 1.0 - st.allocated / st.capacity)
        reserved = idle < self.config.reserve_factor * self.load * self.model_cap * left
        return reserved[self.model_of[nodes]].astype(np.int64)

    def _strand(self, req: Request, nodes: IntArray) -> IntArray:
        """Quantised increase of the node's CPU-stranded idle GPU capacity."""
        st, k = self.state, self.cpu_per_idle
        if not self.config.stranding:
            return np.zeros(nodes.size, dtype=np.int64)
        idle = self.tracker.idle[nodes]
        cpu = st.cpu_left[nodes]
        gpu = (req.vram + req.sm) / 2.0 * req.num_gpu
        delta = stranded_idle(idle - gpu, cpu - req.cpu, k) - stranded_idle(idle, cpu, k)
        return np.rint(delta / self.config.strand_step).astype(np.int64)

    def _cache_for(self, req: Request) -> _Cache:
        key = (req.cpu, req.mem, req.vram, req.sm, req.num_gpu)
        cache = self.cache.get(key)
        if cache is None:
            shape = (self.state.size, MAX_GPUS_PER_NODE) if req.is_share else (self.state.size,)
            cache = _Cache(np.zeros(shape, dtype=np.int64), np.full(shape, -1, dtype=np.int64))
            self.cache[key] = cache
        return cache

    def _fgd_class(self, req: Request, nodes: IntArray) -> NDArray[np.int64]:
        """``100 - FGD score`` of a whole-GPU or CPU-only request on each node (cached)."""
        cache = self._cache_for(req)
        stale = nodes[cache.version[nodes] != self.state.version[nodes]]
        if stale.size:
            tr = self.tracker
            delta = (tr.frag[stale] - tr.after_whole(stale, req)) @ tr.shapes.weight
            cache.fgd[stale] = 100 - fgd_score(delta)
            cache.version[stale] = self.state.version[stale]
        return cache.fgd[nodes]

    def _fgd_class_at(self, req: Request, nodes: IntArray, gpus: IntArray) -> NDArray[np.int64]:
        """``100 - FGD score`` of a slice request on GPU ``gpus[i]`` of ``nodes[i]`` (cached)."""
        cache = self._cache_for(req)
        stale = cache.version[nodes, gpus] != self.state.version[nodes]
        if stale.any():
            n, g = nodes[stale], gpus[stale]
            tr = self.tracker
            delta = (tr.frag[n] - tr.after_share_at(n, g, req)) @ tr.shapes.weight
            cache.fgd[n, g] = 100 - fgd_score(delta)
            cache.version[n, g] = self.state.version[n]
        return cache.fgd[nodes, gpus]

    # ------------------------------------------------------------------ choice
    def _loss_table(self, req: Request) -> NDArray[np.int64]:
        """Quantised packing loss of `req` for every gap of the price grid (cached per size)."""
        key = (req.vram, req.sm)
        table = self.loss_tables.get(key)
        if table is None:
            grid = np.arange(self.prices.grid + 1) * self.prices.step
            loss = packing_loss(self.prices, grid[:, None], grid[None, :], req.vram, req.sm)
            table = np.rint(loss / self.config.loss_step).astype(np.int64)
            if not self.config.packing_loss:
                table[:] = 0
            self.loss_tables[key] = table
        return table

    def _choose_slice(self, req: Request, feasible: IntArray) -> Placement:
        """Filter (node, GPU) pairs: reservation and packing loss, stranding, FGD, node order."""
        st = self.state
        step, width = self.prices.step, self.prices.grid + 1
        gap = (st.vram_left[feasible] // step) * width + st.sm_left[feasible] // step
        first = self._loss_table(req).ravel()[gap]
        protected = self._protected(feasible)
        if protected.any():
            first += protected[:, None] * _LOSS_SPAN
        first[~st.fits_gpu(req, feasible)] = NO_CANDIDATE
        node_i, gpu = np.nonzero(first == first.min())
        nodes = feasible[node_i]
        strand = self._strand(req, nodes)
        keep = strand == strand.min()
        nodes, gpu = nodes[keep], gpu[keep]
        if nodes.size > 1:
            # Identical GPUs of a node are interchangeable: score the lowest index of each kind.
            kind = (nodes * (MILLI + 1) + st.vram_left[nodes, gpu]) * (MILLI + 1)
            _, first = np.unique(kind + st.sm_left[nodes, gpu], return_index=True)
            first.sort()
            nodes, gpu = nodes[first], gpu[first]
        if nodes.size > 1:
            fgd = self._fgd_class_at(req, nodes, gpu)
            keep = fgd == fgd.min()
            nodes, gpu = nodes[keep], gpu[keep]
        best = self.rank[nodes] == self.rank[nodes].min()
        return Placement(int(nodes[best][0]), (int(gpu[best].min()),))

    def _choose_node(self, req: Request, feasible: IntArray) -> int:
        """Filter nodes for whole-GPU and CPU-only requests, criterion by criterion."""
        criteria: list[Callable[[IntArray], NDArray[np.int64]]] = [
            lambda n: self._strand(req, n),
            lambda n: self._fgd_class(req, n),
        ]
        if req.num_gpu:
            criteria.insert(0, self._protected)
        else:
            criteria.append(lambda n: np.rint(self.tracker.idle[n] / 5.0).astype(np.int64))
        criteria.append(lambda n: self.rank[n])
        nodes = feasible
        for criterion in criteria:
            if nodes.size == 1:
                break
            v = criterion(nodes)
            nodes = nodes[v == v.min()]
        return int(nodes[0])

    def choose(self, state: ClusterState, req: Request, feasible: IntArray) -> Placement:
        self.tracker.refresh()
        if req.is_share:
            return self._choose_slice(req, feasible)
        node = self._choose_node(req, feasible)
        return Placement(node, state.lowest_fitting_gpus(node, req))

    def place_batch(self, state: ClusterState, reqs: Sequence[Request]) -> None:
        """Place a window of arrivals: whole-GPU requests first (largest first), then the rest."""
        if self.config.window_order == "whole-first":
            reqs = sorted(reqs, key=lambda r: -r.num_gpu if r.num_gpu and not r.is_share else 0)
        for req in reqs:
            feasible = np.flatnonzero(state.feasible(req))
            if feasible.size:
                state.place(req, self.choose(state, req, feasible))
