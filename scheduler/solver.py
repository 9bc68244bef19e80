"""``solve(snapshot, requests, config=...) -> Plan``: one scheduling cycle, start to end.

::

    requests ──> jobs ──> filter ──> greedy ──────────────────────────┐ (hint and fallback)
                          (per shape)   │                             │
                                        └─> prune ─> CP-SAT ─> assemble ─> verify ─> Plan
                                                                      │  invalid, no solution
                                                                      │  or not better
                                                                      └─> greedy plan ─> verify

CP-SAT's plan is kept only when it is strictly better than the greedy plan on (placed demand,
topology cost); the placement rank (``objective.py``) is the greedy stage's own rule, which
CP-SAT only approximates with rank coefficients. When the greedy plan places every job that fits
anywhere on its own and each gang at the least topology cost the pool's shape allows
(``topology.cost_floor``), no plan can beat it and CP-SAT is skipped.

Pure: it reads only its arguments (no database, clock or global state), and with the default
deterministic time budget the same inputs and seed give the same plan. Every plan is verified
against the snapshot before it is returned; if even the greedy plan failed verification (a
bug), every request comes back with status ``ERROR`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from scheduler.assemble import build_plan, materialize
from scheduler.cpsat import CpsatSettings, build_model, solve_model
from scheduler.filter import filter_shape
from scheduler.greedy import Assignments, Context, greedy
from scheduler.jobs import Job, Kind, build_jobs
from scheduler.objective import ranking_for
from scheduler.plan import Plan, RequestStatus, SolveStats, Unschedulable
from scheduler.prune import prune
from scheduler.requests import Request
from scheduler.snapshot import Snapshot
from scheduler.topology import cost_floor, topology_of
from scheduler.verify import verify


@dataclass(frozen=True)
class SolverConfig:
    """Settings of the solver (the service fills it from its settings object).

    ``time_limit_s`` is a wall-clock safety net for CP-SAT (in exact mode, the only limit);
    ``deterministic_time`` is CP-SAT's reproducible work budget and normally ends the search
    first. ``candidate_nodes`` and
    ``candidate_domains`` bound the reduced model: the best few nodes per pod class (or GPUs per
    slice class), the best few racks or zones per gang; ``slack`` is the extra capacity kept
    beyond what a job needs. ``exact`` disables pruning and solves placed demand first, then the
    gangs' topology cost, to optimality (slow; for benchmarks and tests).
    """

    time_limit_s: float = 0.6
    deterministic_time: float = 0.25
    num_workers: int = 1
    seed: int = 0
    candidate_nodes: int = 8
    candidate_domains: int = 3
    slack: float = 0.5
    use_cpsat: bool = True
    exact: bool = False


def solve(
    snapshot: Snapshot, requests: Sequence[Request], *, config: SolverConfig = SolverConfig()
) -> Plan:
    """Place a batch of requests on a snapshot. Raises ``ValueError`` only for a malformed batch
    (duplicate keys); solver failures come back as requests with status ``ERROR``."""
    if not requests:
        return Plan((), (), SolveStats(method="none"))
    cycle = snapshot.cycle
    jobs = build_jobs(requests, reference_vram_mib=int(cycle.gpu_vram.max(initial=1)))
    try:
        ctx = _context(snapshot, jobs, config)
        hint = greedy(ctx, jobs)
    except Exception as error:  # a bug: report it per request instead of crashing the cycle
        return _error_plan(requests, f"greedy stage failed: {error!r}")

    stats = SolveStats(method="greedy")
    if config.use_cpsat and not config.exact and _greedy_is_best(ctx, jobs, hint):
        why = "the greedy plan places all that fits, its gangs as close as the pool allows"
    elif config.use_cpsat or config.exact:
        plan, why = _cpsat_plan(ctx, requests, jobs, hint, config)
        if plan is not None and _quality(plan) < _greedy_quality(ctx, jobs, hint):
            return plan
        if plan is not None:  # as good as the greedy plan: keep what CP-SAT proved about it
            found = plan.stats
            stats = replace(
                stats, cpsat_status=found.cpsat_status, objective=found.objective, bound=found.bound
            )
            why = "CP-SAT's plan is not better than the greedy plan"
    else:
        why = "CP-SAT disabled"
    stats = replace(stats, fallback_reason=why)
    fallback = build_plan(ctx, requests, jobs, hint, stats)
    problems = verify(fallback, snapshot)
    if problems:
        return _error_plan(requests, "no valid plan: " + "; ".join(problems[:3]))
    return fallback


def _quality(plan: Plan) -> tuple[int, int]:
    """Lower is better: placed demand first, then the gangs' topology cost."""
    return (-plan.stats.placed_value, plan.stats.topology_cost)


def _greedy_quality(ctx: Context, jobs: Sequence[Job], hint: Assignments) -> tuple[int, int]:
    """``_quality`` of the greedy plan, without building it."""
    value = topology = 0
    for job in jobs:
        pods = hint.get(job.index, [])
        value += job.value * ((1 if pods else 0) if job.is_gang else len(pods))
        if job.is_gang and pods:
            topology += topology_of(ctx.cycle, pods)[1]
    return (-value, topology)


def _context(snapshot: Snapshot, jobs: Sequence[Job], config: SolverConfig) -> Context:
    cycle = snapshot.cycle
    shapes = {g.shape for j in jobs for g in j.groups}
    filters = {s: filter_shape(cycle, s) for s in sorted(shapes, key=repr)}
    ranking = ranking_for(cycle, snapshot.workload, jobs, config.seed)
    return Context(cycle, filters, ranking, config.candidate_domains + 1)


def _greedy_is_best(ctx: Context, jobs: Sequence[Job], hint: Assignments) -> bool:
    """True when no plan can beat the greedy one on (placed demand, topology cost): it places
    every job that fits anywhere on its own, and each of its gangs as close together as the
    pool's shape allows (``topology.cost_floor``)."""
    for job in jobs:
        pods = hint.get(job.index, [])
        complete = bool(pods) if job.is_gang else len(pods) == job.units
        if not complete and all(ctx.filters[g.shape].fits.any() for g in job.groups):
            return False
        if job.is_gang and pods:
            floor = cost_floor(ctx.cycle, _gpu_leaves(job))
            if topology_of(ctx.cycle, pods)[1] > floor:
                return False
    return True


def _gpu_leaves(job: Job) -> int:
    """The fewest distinct GPUs a gang can use: its whole GPUs, plus one if it has slices
    (slices may share a GPU, never a whole one)."""
    whole = sum(g.count * g.shape.gpus for g in job.groups if g.shape.kind is Kind.WHOLE)
    return whole + any(g.shape.kind is Kind.SLICE for g in job.groups)


def _cpsat_plan(
    ctx: Context,
    requests: Sequence[Request],
    jobs: Sequence[Job],
    hint: Assignments,
    config: SolverConfig,
) -> tuple[Plan | None, str]:
    """The CP-SAT plan, or None and the reason to fall back to the greedy plan."""
    try:
        candidates = prune(
            ctx,
            jobs,
            hint,
            candidate_nodes=config.candidate_nodes,
            candidate_domains=config.candidate_domains,
            slack=config.slack,
            exact=config.exact,
        )
        model = build_model(ctx, jobs, candidates, hint, exact=config.exact)
        settings = CpsatSettings(
            time_limit_s=config.time_limit_s,
            deterministic_time=config.deterministic_time if not config.exact else 1e9,
            num_workers=config.num_workers,
            seed=config.seed,
            exact=config.exact,
        )
        result = solve_model(model, settings)
    except Exception as error:
        return None, f"CP-SAT stage failed: {error!r}"
    if not result.ok:
        return None, f"CP-SAT status {result.status}"
    assignments = materialize(ctx, jobs, result.counts)
    if assignments is None:
        return None, "no GPUs inside one NVLink domain for the CP-SAT counts"
    stats = SolveStats(
        method="cpsat",
        cpsat_status=result.status,
        variables=result.variables,
        candidate_nodes=len({int(t) for c in candidates.values() for t in c.targets}),
        objective=result.objective,
        bound=result.bound,
    )
    plan = build_plan(ctx, requests, jobs, assignments, stats)
    problems = verify(plan, ctx.cycle.snapshot)
    if problems:
        return None, "CP-SAT plan failed verification: " + "; ".join(problems[:3])
    return plan, ""


def _error_plan(requests: Sequence[Request], reason: str) -> Plan:
    items = tuple(Unschedulable(r, RequestStatus.ERROR, reason) for r in requests)
    return Plan((), items, SolveStats(method="none", fallback_reason=reason))
