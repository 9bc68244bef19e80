"""Solve stage: the reduced CP-SAT model of one batch.

Variables (all named, so ``model.model_proto`` reads like the model)::

    placed[j]            units of job j placed: 0/1 for a gang, 0..pods for a pod class
    n[j/g@t]             pods of group g of job j on target t (a node; a GPU for slices)
    broken[gpu]          a slice lands on a pristine GPU, so it can no longer be given whole
    used_<level>[j:d]    gang j touches domain d of that level (GPU, NVLink, node, rack, ...)

Constraints, one helper each: every group of a placed job is complete (a gang's groups all
together); node CPU, memory and pristine-GPU counts; per-GPU VRAM and SM %; the gang topology
links ``used_child <= used_parent``; a required level allows one domain; a gang never spans
regions.

Objective (minimised), tiers weighted so each outweighs what the tiers below can change (in the
whole batch, or for one job on batches too large for exact integer weights)::

    - W_place * sum(value[j] * placed[j])       placed demand, priority-weighted
    + W_topo  * sum(topology_cost[j])           tree cost of each gang (see topology.py)
    +           sum(rank[j/g@t] * n[j/g@t])     placement rank of the target (objective.py)

The greedy plan is given as a complete hint, and its placed demand as a floor. FEASIBLE is
accepted as well as OPTIMAL: the time limit comes from ``SolverConfig``. In exact mode
(benchmarks, tests) the objective is solved lexicographically instead: first placed demand
alone, then the topology cost with that demand fixed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from scheduler.cycle import IntArray
from scheduler.greedy import Assignments, Context
from scheduler.jobs import Job, Kind
from scheduler.snapshot import TopologyLevel


@dataclass(frozen=True)
class Candidates:
    """Where the pods of one group may go in the reduced model: ``targets`` are node numbers
    (GPU numbers for a slice group), with the per-pod ``scores`` and the most pods each target
    could take (``upper``)."""

    targets: IntArray
    scores: IntArray
    upper: IntArray


@dataclass(frozen=True)
class CpsatResult:
    """CP-SAT's answer: ``counts[(job, group)][target] = pods`` (only non-zero entries)."""

    status: str
    counts: Mapping[tuple[int, int], Mapping[int, int]] = field(default_factory=dict)
    objective: float | None = None
    variables: int = 0
    bound: float | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")


@dataclass(frozen=True)
class CpsatSettings:
    """Search limits: wall-clock safety limit, deterministic budget (reproducible), workers."""

    time_limit_s: float
    deterministic_time: float
    num_workers: int
    seed: int
    exact: bool = False


class PlacementModel:
    """Builds the model step by step; each ``add_*`` method adds one kind of constraint."""

    def __init__(
        self, ctx: Context, jobs: Sequence[Job], candidates: Mapping[tuple[int, int], Candidates]
    ) -> None:
        self.ctx = ctx
        self.jobs = list(jobs)
        self.candidates = candidates
        self.model = cp_model.CpModel()
        self.placed: dict[int, cp_model.IntVar] = {}
        self.count: dict[tuple[int, int], list[tuple[int, cp_model.IntVar]]] = {}
        self.hint: dict[str, int] = {}
        self.topology: dict[int, cp_model.LinearExpr] = {}
        self.topology_bound: dict[int, int] = {}
        self._vars: dict[str, cp_model.IntVar] = {}
        self.objective: cp_model.LinearExprT = 0

    # -- variables ------------------------------------------------------------------------------
    def _bool(self, name: str) -> cp_model.IntVar:
        if name not in self._vars:
            self._vars[name] = self.model.new_bool_var(name)
        return self._vars[name]

    def add_placement_vars(self) -> None:
        """``placed[j]`` and the count variables of every candidate target."""
        for job in self.jobs:
            j = job.index
            self.placed[j] = self.model.new_int_var(0, job.units, f"placed[{job.key}]")
            for g, group in enumerate(job.groups):
                cand = self.candidates.get((j, g))
                cells: list[tuple[int, cp_model.IntVar]] = []
                if cand is not None:
                    for t, ub in zip(cand.targets.tolist(), cand.upper.tolist(), strict=True):
                        top = min(int(ub), group.count)
                        if top > 0:
                            cells.append(
                                (t, self.model.new_int_var(0, top, f"n[{job.key}/{g}@{t}]"))
                            )
                self.count[(j, g)] = cells

    # -- constraints ----------------------------------------------------------------------------
    def add_demand_links(self) -> None:
        """A placed job is whole: each group places ``count x placed`` pods; a class ``placed``."""
        for job in self.jobs:
            for g, group in enumerate(job.groups):
                cells = self.count[(job.index, g)]
                per_unit = group.count if job.is_gang else 1
                self.model.add(sum(v for _, v in cells) == per_unit * self.placed[job.index])

    def add_node_capacity(self) -> None:
        """CPU, memory and pristine GPUs of every node that appears in the model."""
        cycle = self.ctx.cycle
        cpu: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
        mem: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
        whole: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
        slices: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)  # gpu -> cells
        for job in self.jobs:
            for g, group in enumerate(job.groups):
                shape = group.shape
                for t, var in self.count[(job.index, g)]:
                    node = int(cycle.gpu_node[t]) if shape.kind is Kind.SLICE else t
                    if shape.cpu_milli:
                        cpu[node].append((shape.cpu_milli, var))
                    if shape.memory_mib:
                        mem[node].append((shape.memory_mib, var))
                    if shape.kind is Kind.WHOLE:
                        whole[node].append((shape.gpus, var))
                    elif shape.kind is Kind.SLICE:
                        slices[t].append((group.count, var))
        for node, terms in cpu.items():
            self.model.add(sum(c * v for c, v in terms) <= int(cycle.node_cpu_free[node]))
        for node, terms in mem.items():
            self.model.add(sum(c * v for c, v in terms) <= int(cycle.node_mem_free[node]))
        broken: dict[int, list[cp_model.IntVar]] = defaultdict(list)
        for gpu, cells in slices.items():
            node = int(cycle.gpu_node[gpu])
            if node in whole and cycle.gpu_pristine[gpu]:
                b = self._bool(f"broken[{cycle.gpu_ids[gpu]}]")
                for ub, var in cells:
                    self.model.add(var <= ub * b)
                self._hint_or(b.name, [var.name for _, var in cells])
                broken[node].append(b)
        for node, terms in whole.items():
            used = sum(k * v for k, v in terms) + sum(broken[node])
            self.model.add(used <= int(cycle.node_whole_free[node]))

    def add_gpu_capacity(self) -> None:
        """VRAM and SM % of every GPU that a slice may land on."""
        cycle = self.ctx.cycle
        vram: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
        sm: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
        for job in self.jobs:
            for g, group in enumerate(job.groups):
                if group.shape.kind is Kind.SLICE:
                    for t, var in self.count[(job.index, g)]:
                        vram[t].append((group.shape.vram_mib, var))
                        sm[t].append((group.shape.sm_pct, var))
        for gpu, terms in vram.items():
            self.model.add(sum(c * v for c, v in terms) <= int(cycle.gpu_free_vram[gpu]))
            self.model.add(sum(c * v for c, v in sm[gpu]) <= int(cycle.gpu_free_sm[gpu]))

    def add_topology(self, job: Job) -> None:
        """``used_<level>`` variables of one gang, linked up the tree, and its tree cost.

        Leaves are GPUs (a whole-GPU pod adds ``gpus`` leaves), or the node for CPU-only pods.
        Every domain variable is tied both ways: on if a child is used, and only if one is
        (``child <= parent <= sum(children)``), which keeps the LP relaxation tight. Whole GPUs
        are counted in the node's roomiest NVLink domain: exact when a node has one domain; the
        GPU choice inside a node follows in ``affinity.py``.
        """
        cycle = self.ctx.cycle
        costs = cycle.snapshot.costs
        key = job.key
        placed = self.placed[job.index]
        leaves: list[cp_model.LinearExprT] = []
        used: dict[TopologyLevel, dict[str, cp_model.IntVar]] = {lvl: {} for lvl in TopologyLevel}
        children: dict[str, list[cp_model.IntVar]] = defaultdict(list)

        def link(child: cp_model.IntVar, bound: int, level: TopologyLevel, name: str) -> None:
            """``child`` (a count up to ``bound``, or a 0/1 flag) lies in domain ``name``."""
            parent = used[level].setdefault(name, self._bool(name))
            self.model.add(child <= bound * parent)
            if child.name not in {c.name for c in children[name]}:
                children[name].append(child)
            self._hint_or(name, [child.name])

        leaf_bound = 0
        nvlink_node: dict[str, int] = {}
        for g, group in enumerate(job.groups):
            shape = group.shape
            leaf_bound += group.count * max(shape.gpus, 1)
            for t, var in self.count[(job.index, g)]:
                if shape.kind is Kind.WHOLE:
                    node, domain = t, f"used_nvlink[{key}:{_roomiest_domain(self.ctx, t)}]"
                    leaves.append(shape.gpus * var)
                    link(var, group.count, TopologyLevel.NVLINK, domain)
                else:
                    if shape.kind is Kind.SLICE:
                        node = int(cycle.gpu_node[t])
                        leaf_name = f"used_gpu[{key}:{t}]"
                        domain = f"used_nvlink[{key}:{int(cycle.gpu_nvlink[t])}]"
                    else:  # a CPU-only pod is its own leaf, in its own NVLink-level domain
                        node = t
                        leaf_name = f"used_cpu[{key}:{t}]"
                        domain = f"used_cpuleaf[{key}:{t}]"
                    link(var, group.count, TopologyLevel.GPU, leaf_name)
                    leaf = used[TopologyLevel.GPU][leaf_name]
                    leaves.append(leaf)
                    link(leaf, 1, TopologyLevel.NVLINK, domain)
                nvlink_node[domain] = node
        for domain, node in nvlink_node.items():
            link(
                used[TopologyLevel.NVLINK][domain],
                1,
                TopologyLevel.NODE,
                f"used_node[{key}:{cycle.node_names[node]}]",
            )
        member_nodes = sorted(set(nvlink_node.values()))
        for level in (TopologyLevel.RACK, TopologyLevel.ZONE, TopologyLevel.REGION):
            below = TopologyLevel(level - 1)
            for n in member_nodes:
                child_name = (
                    f"used_node[{key}:{cycle.node_names[n]}]"
                    if below == TopologyLevel.NODE
                    else f"used_{below.name.lower()}[{key}:{cycle.domain_of(below, n)}]"
                )
                link(
                    used[below][child_name],
                    1,
                    level,
                    f"used_{level.name.lower()}[{key}:{cycle.domain_of(level, n)}]",
                )
        for name, kids in children.items():
            parent = self._vars[name]
            self.model.add(parent <= cp_model.LinearExpr.sum(kids))

        self.model.add(sum(used[TopologyLevel.REGION].values()) == placed)  # never across regions
        counts: dict[TopologyLevel, cp_model.LinearExpr] = {
            lvl: cp_model.LinearExpr.sum(list(vs.values())) for lvl, vs in used.items()
        }
        counts[TopologyLevel.GPU] = cp_model.LinearExpr.sum(leaves)
        exprs: list[cp_model.LinearExprT] = []
        coeffs: list[int] = []
        for lvl in list(TopologyLevel)[1:]:  # cost(L) * (U[L-1] - U[L])
            exprs += [counts[TopologyLevel(lvl - 1)], counts[lvl]]
            coeffs += [costs.of(lvl), -costs.of(lvl)]
        if job.preferred is not None and job.preferred > TopologyLevel.GPU:
            exprs += [counts[job.preferred], placed]  # a wish: each extra domain costs extra
            coeffs += [costs.of(TopologyLevel.REGION), -costs.of(TopologyLevel.REGION)]
        self.topology[job.index] = cp_model.LinearExpr.weighted_sum(exprs, coeffs)
        self.topology_bound[job.index] = 2 * costs.of(TopologyLevel.REGION) * leaf_bound
        self._add_required_level(job, {lvl: list(vs.values()) for lvl, vs in used.items()})

    def _add_required_level(
        self, job: Job, used: Mapping[TopologyLevel, list[cp_model.IntVar]]
    ) -> None:
        """A required level: one domain of that level (and so of every level above it)."""
        if job.required is None:
            return
        level = job.required
        if level == TopologyLevel.GPU:
            gpu_leaves = [
                v for name, v in self._vars.items() if name.startswith(f"used_gpu[{job.key}:")
            ]
            self.model.add(sum(gpu_leaves) <= 1)
            level = TopologyLevel.NVLINK
        self.model.add(sum(used[level]) <= 1)
        if level == TopologyLevel.NVLINK:
            self.model.add(sum(used[TopologyLevel.NODE]) <= 1)
            cycle = self.ctx.cycle
            for g, group in enumerate(job.groups):
                if group.shape.kind is Kind.WHOLE:
                    for t, var in self.count[(job.index, g)]:
                        self.model.add(
                            group.shape.gpus * var <= int(cycle.node_domain_whole_free[t])
                        )

    def add_gang_topology(self) -> None:
        """Topology of every gang. A one-pod gang only has its GPUs' links, counted as inside one
        NVLink domain (the GPU choice in ``affinity.py`` keeps them there when it can)."""
        nvlink = self.ctx.cycle.snapshot.costs.of(TopologyLevel.NVLINK)
        for job in self.jobs:
            if job.is_gang and job.pod_count > 1:
                self.add_topology(job)
            elif job.is_gang:
                links = max(job.groups[0].shape.gpus - 1, 0)
                self.topology[job.index] = cp_model.LinearExpr.term(
                    self.placed[job.index], nvlink * links
                )
                self.topology_bound[job.index] = nvlink * links

    def add_hint_floor(self) -> None:
        """Never less placed demand than the greedy plan: the tier weights only make placed
        demand dominate job by job, so without this floor the search could trade a small pod
        for better scores elsewhere. The hint satisfies it, so it costs nothing."""
        floor = sum(job.value * self.hint.get(self.placed[job.index].name, 0) for job in self.jobs)
        value = cp_model.LinearExpr.weighted_sum(
            [self.placed[j.index] for j in self.jobs], [j.value for j in self.jobs]
        )
        self.model.add(value >= floor)

    # -- objective ------------------------------------------------------------------------------
    def score_terms(self) -> tuple[cp_model.LinearExpr, dict[int, int]]:
        """The score tier, and per job the most it can swing (for the tier weights)."""
        variables: list[cp_model.IntVar] = []
        weights: list[int] = []
        swing: dict[int, int] = {}
        for job in self.jobs:
            total = 0
            for g, group in enumerate(job.groups):
                cand = self.candidates.get((job.index, g))
                if cand is None:
                    continue
                by_target = dict(zip(cand.targets.tolist(), cand.scores.tolist(), strict=True))
                for t, var in self.count[(job.index, g)]:
                    variables.append(var)
                    weights.append(int(by_target[t]))
                if len(cand.scores):
                    per_unit = group.count if job.is_gang else 1
                    total += per_unit * int(np.abs(cand.scores).max())
            swing[job.index] = total
        return cp_model.LinearExpr.weighted_sum(variables, weights), swing

    def set_objective(self, *, strict: bool = False) -> None:
        """Minimise ``-W_place * value + W_topo * topology + score`` (see the module docstring).

        The weights are lexicographic over the whole batch (one unit of placed demand outweighs
        any change of topology and scores; one unit of topology any change of scores) whenever
        the objective stays below 2**50, which keeps CP-SAT's arithmetic exact. On batches too
        large for that they are lexicographic job by job: placing a job always beats its own
        topology and scores. ``strict`` forces the first form (exact mode).
        """
        scores, swing = self.score_terms()
        units = {j.index: j.units for j in self.jobs}
        swing_total = sum(swing[i] * units[i] for i in swing)
        value_total = sum(j.value * j.units for j in self.jobs)
        w_topo = 1 + swing_total
        w_place = 1 + w_topo * sum(self.topology_bound.values()) + swing_total
        if not strict and w_place * value_total >= 2**50:
            w_topo = 1 + max(swing.values(), default=0)
            w_place = 1
            for job in self.jobs:
                need = w_topo * self.topology_bound.get(job.index, 0) + swing[job.index] + 1
                w_place = max(w_place, -(-need // max(job.value, 1)))
        value = cp_model.LinearExpr.weighted_sum(
            [self.placed[j.index] for j in self.jobs], [j.value for j in self.jobs]
        )
        topology = cp_model.LinearExpr.sum(list(self.topology.values()))
        self.objective = cp_model.LinearExpr.weighted_sum(
            [value, topology, scores], [-w_place, w_topo, 1]
        )
        self.model.minimize(self.objective)

    # -- hint -----------------------------------------------------------------------------------
    def _hint_or(self, name: str, sources: Sequence[str]) -> None:
        self.hint[name] = max(
            self.hint.get(name, 0), int(any(self.hint.get(s, 0) > 0 for s in sources))
        )

    def set_count_hints(self, assignments: Assignments) -> None:
        """Record the greedy plan as hint values of ``placed`` and ``n`` (before the links)."""
        for job in self.jobs:
            pods = assignments.get(job.index, [])
            placed = (1 if pods else 0) if job.is_gang else len(pods)
            self.hint[self.placed[job.index].name] = placed
            for g, group in enumerate(job.groups):
                keys = {p.key for p in group.pods}
                tally: dict[int, int] = defaultdict(int)
                for a in pods:
                    if a.pod.key in keys:
                        tally[a.gpus[0] if group.shape.kind is Kind.SLICE else a.node] += 1
                for t, var in self.count[(job.index, g)]:
                    self.hint[var.name] = tally.get(t, 0)

    def apply_hints(self) -> None:
        for name, var in (
            list(self._vars.items())
            + [(v.name, v) for cells in self.count.values() for _, v in cells]
            + [(v.name, v) for v in self.placed.values()]
        ):
            self.model.add_hint(var, self.hint.get(name, 0))

    @property
    def variable_count(self) -> int:
        return len(self.model.proto.variables)


def _roomiest_domain(ctx: Context, node: int) -> int:
    cycle = ctx.cycle
    start = int(cycle.node_gpu_start[node])
    gpus = np.arange(start, start + int(cycle.node_gpu_count[node]))
    domains = cycle.gpu_nvlink[gpus]
    free = np.bincount(domains - domains.min(), weights=cycle.gpu_pristine[gpus])
    return int(domains.min() + int(np.argmax(free)))


def build_model(
    ctx: Context,
    jobs: Sequence[Job],
    candidates: Mapping[tuple[int, int], Candidates],
    hint: Assignments,
    *,
    exact: bool = False,
) -> PlacementModel:
    """The whole model: variables, then one helper per kind of constraint, then the objective."""
    pm = PlacementModel(ctx, jobs, candidates)
    pm.add_placement_vars()
    pm.set_count_hints(hint)
    pm.add_demand_links()
    pm.add_node_capacity()
    pm.add_gpu_capacity()
    pm.add_gang_topology()
    pm.add_hint_floor()
    pm.set_objective(strict=exact)
    pm.apply_hints()
    return pm


def solve_model(pm: PlacementModel, settings: CpsatSettings) -> CpsatResult:
    """Run CP-SAT. In exact mode: first maximise placed demand alone, then minimise the gangs'
    topology cost with that demand fixed (the scores are left out: they only break ties, and
    proving them optimal is what makes exact solves slow)."""
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = settings.num_workers
    params.random_seed = settings.seed
    params.max_time_in_seconds = settings.time_limit_s
    params.max_deterministic_time = settings.deterministic_time
    if settings.exact:
        value = sum(job.value * pm.placed[job.index] for job in pm.jobs)
        pm.model.maximize(value)
        first = solver.solve(pm.model)
        if first not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return CpsatResult(solver.status_name(first), variables=pm.variable_count)
        pm.model.add(value >= round(solver.objective_value))
        pm.model.minimize(cp_model.LinearExpr.sum(list(pm.topology.values())))
    status = solver.solve(pm.model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpsatResult(name, variables=pm.variable_count)
    counts: dict[tuple[int, int], dict[int, int]] = {}
    for key, cells in pm.count.items():
        values = {t: int(solver.value(v)) for t, v in cells}
        counts[key] = {t: c for t, c in values.items() if c > 0}
    return CpsatResult(
        name, counts, float(solver.objective_value), pm.variable_count, solver.best_objective_bound
    )
