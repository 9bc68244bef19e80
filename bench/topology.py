"""Benchmark 2, topology: how close Tessera keeps gangs together, against the optimum.

Each instance is a synthetic H200 pool (8 GPUs per node in one NVLink domain, racks of 16
nodes, zones), partly filled, and a random batch of gangs of 2..64 GPUs, whole-GPU or sliced,
some with a required topology level. Three placements of the batch are compared:

* **tessera**: ``scheduler.solve`` with its default settings (pruned model, time-limited);
* **optimum**: ``scheduler.solve`` in exact mode: no pruning, no time limit, placed demand
  maximised first and then the topology cost minimised (proven optimal unless reported);
* **first-fit**: topology-blind first fit over the nodes in inventory order (a random order:
  inventory order says nothing about topology), gang by gang, all or nothing.

The topology cost of a batch is the sum of the tree costs of its placed gangs (see
``scheduler/topology.py``). Gaps are measured on instances where Tessera placed as much demand as
the optimum (otherwise the costs are not comparable, and the instance is reported as such).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from scheduler.affinity import choose_whole_gpus
from scheduler.cycle import CycleState
from scheduler.jobs import Kind, Shape
from scheduler.ledger import Ledger, PodAssignment
from scheduler.plan import Plan
from scheduler.requests import GangRequest, PodRequest, Request
from scheduler.snapshot import Snapshot, TopologyLevel
from scheduler.solver import SolverConfig, solve
from scheduler.synthetic import PoolShape, h200_pool, random_gang
from scheduler.topology import topology_of

GANG_GPUS = (2, 4, 8, 16, 32, 64)
REQUIRED = (None, None, TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.ZONE)


def make_instance(seed: int, shape: PoolShape, gangs: int) -> tuple[Snapshot, list[Request]]:
    """One pool, filled 30..70 %, and ``gangs`` random gangs (a third of them sliced)."""
    rng = np.random.default_rng(seed)
    snapshot = h200_pool(shape, fill=float(rng.uniform(0.3, 0.7)), seed=seed)
    batch: list[Request] = []
    for i in range(gangs):
        sliced = rng.random() < 0.3
        gpus = int(rng.choice([g for g in GANG_GPUS if not sliced or g <= 16]))
        required = REQUIRED[int(rng.integers(len(REQUIRED)))]
        if required == TopologyLevel.NODE and gpus > shape.gpus_per_node:
            required = TopologyLevel.RACK
        batch.append(
            random_gang(rng, f"g{i}", gpus=gpus, sliced=sliced, required=required, priority=0)
        )
    return snapshot, batch


def first_fit(snapshot: Snapshot, batch: list[Request], seed: int) -> list[list[PodAssignment]]:
    """Topology-blind first fit; returns the pods of each placed gang."""
    cycle = snapshot.cycle
    order = np.random.default_rng(seed).permutation(cycle.n_nodes)
    ledger = Ledger(cycle)
    placed: list[list[PodAssignment]] = []
    for request in batch:
        assert isinstance(request, GangRequest)
        mark = ledger.mark()
        pods: list[PodAssignment] = []
        for pod in request.members:
            a = _first_node(ledger, cycle, order, pod)
            if a is None:
                ledger.rollback(mark)
                pods = []
                break
            ledger.assign(a)
            pods.append(a)
        if pods:
            placed.append(pods)
    return placed


def _first_node(
    ledger: Ledger, cycle: CycleState, order: np.ndarray, pod: PodRequest
) -> PodAssignment | None:
    shape = Shape.of(pod)
    for node in order.tolist():
        if cycle.node_cordoned[node] or not ledger.fits_on_node(shape, node):
            continue
        if shape.kind is Kind.WHOLE:
            gpus = choose_whole_gpus(ledger, node, pod.gpus)
            if gpus is not None:
                return ledger.whole_assignment(pod, node, gpus)
        elif shape.kind is Kind.SLICE:
            start = int(cycle.node_gpu_start[node])
            for g in range(start, start + int(cycle.node_gpu_count[node])):
                if (
                    cycle.gpu_healthy[g]
                    and ledger.vram[g] >= shape.vram_mib
                    and ledger.sm[g] >= shape.sm_pct
                ):
                    return PodAssignment(pod, node, (g,), (shape.vram_mib,), (shape.sm_pct,))
        else:
            return PodAssignment(pod, node)
    return None


def _violations(snapshot: Snapshot, batch: list[Request], placed: list[list[PodAssignment]]) -> int:
    required = {r.key: r.required_level for r in batch if isinstance(r, GangRequest)}
    count = 0
    for pods in placed:
        key = pods[0].pod.key.rsplit("-", 1)[0]
        level, _ = topology_of(snapshot.cycle, pods)
        want = required.get(key)
        if want is not None and level > want:
            count += 1
    return count


def _plan_violations(plan: Plan) -> int:
    return sum(
        1
        for p in plan.placements
        if isinstance(p.request, GangRequest)
        and p.request.required_level is not None
        and p.topology_level > p.request.required_level
    )


def run_instance(seed: int, shape: PoolShape, gangs: int, exact_limit: float) -> dict[str, Any]:
    snapshot, batch = make_instance(seed, shape, gangs)
    started = time.perf_counter()
    ours = solve(snapshot, batch, config=SolverConfig(seed=seed))
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    best = solve(
        snapshot, batch, config=SolverConfig(seed=seed, exact=True, time_limit_s=exact_limit)
    )
    best_s = time.perf_counter() - started
    blind = first_fit(snapshot, batch, seed)
    blind_cost = sum(topology_of(snapshot.cycle, pods)[1] for pods in blind)
    return {
        "seed": seed,
        "gangs": [
            {
                "key": r.key,
                "pods": len(r.members),
                "gpus": sum(max(m.gpus, 1) for m in r.members),
                "sliced": r.members[0].gpu_slice is not None,
                "required": r.required_level.name if r.required_level is not None else None,
            }
            for r in batch
            if isinstance(r, GangRequest)
        ],
        "tessera": {
            "placed": len(ours.placements),
            "placed_value": ours.stats.placed_value,
            "topology_cost": ours.stats.topology_cost,
            "required_violations": _plan_violations(ours),
            "method": ours.stats.method,
            "seconds": round(ours_s, 4),
        },
        "optimum": {
            "placed": len(best.placements),
            "placed_value": best.stats.placed_value,
            "topology_cost": best.stats.topology_cost,
            "status": best.stats.cpsat_status,
            "topology_bound": best.stats.bound,
            "seconds": round(best_s, 3),
        },
        "first_fit": {
            "placed": len(blind),
            "topology_cost": blind_cost,
            "required_violations": _violations(snapshot, batch, blind),
        },
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Gaps on the instances where Tessera placed as much demand as the optimum."""
    same = [r for r in rows if r["tessera"]["placed_value"] == r["optimum"]["placed_value"]]
    ours = sum(r["tessera"]["topology_cost"] for r in same)
    best = sum(r["optimum"]["topology_cost"] for r in same)
    gaps = [
        (r["tessera"]["topology_cost"] - r["optimum"]["topology_cost"])
        / r["optimum"]["topology_cost"]
        for r in same
        if r["optimum"]["topology_cost"] > 0
    ]
    unproven = [r for r in same if r["optimum"]["status"] != "OPTIMAL"]
    times = [r["tessera"]["seconds"] for r in rows]
    return {
        "instances": len(rows),
        "optimum_proven": sum(r["optimum"]["status"] == "OPTIMAL" for r in rows),
        "same_placed_demand": len(same),
        "tessera_placed_less": sum(
            r["tessera"]["placed_value"] < r["optimum"]["placed_value"] for r in rows
        ),
        "exactly_optimal": sum(
            r["tessera"]["topology_cost"] == r["optimum"]["topology_cost"] for r in same
        ),
        "gap_of_totals_pct": round(100 * (ours - best) / best, 3) if best else 0.0,
        "mean_gap_pct": round(100 * statistics.fmean(gaps), 3) if gaps else 0.0,
        "max_gap_pct": round(100 * max(gaps), 3) if gaps else 0.0,
        # Where the exact solve was stopped before proving optimality, the gap to its lower bound
        # on the topology cost of the placed gangs (a conservative figure):
        "unproven_instances": len(unproven),
        "gap_to_bound_of_unproven_pct": _bound_gap(unproven),
        "tessera_required_violations": sum(r["tessera"]["required_violations"] for r in rows),
        "first_fit_required_violations": sum(r["first_fit"]["required_violations"] for r in rows),
        "topology_cost_total": {
            "tessera": sum(r["tessera"]["topology_cost"] for r in rows),
            "optimum": sum(r["optimum"]["topology_cost"] for r in rows),
            "first_fit": sum(r["first_fit"]["topology_cost"] for r in rows),
        },
        "placed_gangs_total": {
            "tessera": sum(r["tessera"]["placed"] for r in rows),
            "optimum": sum(r["optimum"]["placed"] for r in rows),
            "first_fit": sum(r["first_fit"]["placed"] for r in rows),
        },
        "tessera_seconds": {
            "mean": round(statistics.fmean(times), 4) if times else 0.0,
            "max": round(max(times), 4) if times else 0.0,
        },
    }


def _bound_gap(rows: list[dict[str, Any]]) -> float | None:
    ours = sum(r["tessera"]["topology_cost"] for r in rows)
    bound = sum(max(0.0, r["optimum"]["topology_bound"] or 0.0) for r in rows)
    return round(100 * (ours - bound) / bound, 3) if bound > 0 else None


def main(
    instances: Annotated[int, typer.Option(help="Random instances (pool + batch).")] = 40,
    seed: Annotated[int, typer.Option(help="Seed of the first instance.")] = 0,
    zones: Annotated[int, typer.Option(help="Zones per pool.")] = 2,
    racks: Annotated[int, typer.Option(help="Racks per zone.")] = 2,
    nodes_per_rack: Annotated[int, typer.Option(help="Nodes per rack (8 H200 each).")] = 16,
    gangs: Annotated[int, typer.Option(help="Gangs per batch.")] = 4,
    exact_limit: Annotated[
        float, typer.Option(help="Safety limit (s) for one exact solve; 'optimal' is reported.")
    ] = 600.0,
    quick: Annotated[bool, typer.Option(help="A short run (8 instances).")] = False,
    out: Annotated[Path | None, typer.Option(help="Write DIR/topology.json.")] = None,
) -> None:
    """Topology cost of gangs: Tessera vs the exact optimum vs topology-blind first fit."""
    if quick:
        instances = min(instances, 8)
    shape = PoolShape(zones=zones, racks_per_zone=racks, nodes_per_rack=nodes_per_rack)
    rows = []
    for i in range(instances):
        row = run_instance(seed + i, shape, gangs, exact_limit)
        rows.append(row)
        t, o, f = row["tessera"], row["optimum"], row["first_fit"]
        print(
            f"[{i + 1}/{instances}] seed {seed + i}: cost tessera {t['topology_cost']} "
            f"optimum {o['topology_cost']} ({o['status']}) first-fit {f['topology_cost']}; "
            f"placed {t['placed']}/{o['placed']}/{f['placed']} gangs; {t['seconds']:.3f} s",
            file=sys.stderr,
        )
    summary = summarize(rows)
    result = {
        "benchmark": "topology",
        "pool": {
            "zones": zones,
            "racks_per_zone": racks,
            "nodes_per_rack": nodes_per_rack,
            "gpus": shape.gpus,
        },
        "gangs_per_batch": gangs,
        "summary": summary,
        "instances": rows,
    }
    print(json.dumps(summary, indent=2))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "topology.json").write_text(json.dumps(result, indent=2) + "\n")
