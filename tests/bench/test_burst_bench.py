"""`tessera bench burst`: its pod mix and pool, its profile's stages, and a tiny burst through a
real `tessera dev` in which every pod is created, bound and started."""

from __future__ import annotations

from pathlib import Path

from app.inventory.loader import read_file
from bench.burst import measure, pool_yaml, stage_of, workload
from tests.conftest import POSTGRES_URL


def test_the_mix_is_the_documented_one_and_every_gang_is_whole() -> None:
    load = workload(10_000, seed=7)
    assert len(load.pods) == 10_000 == sum(load.mix.values())
    names = [p["metadata"]["name"] for p in load.pods]
    assert len(set(names)) == len(names)
    share = {k: v / 10_000 for k, v in load.mix.items()}
    assert abs(share["cpu"] - 0.50) < 0.03 and abs(share["slice"] - 0.30) < 0.03
    assert abs(share["whole-gpu"] - 0.10) < 0.02
    assert abs(share["gang-member-node"] + share["gang-member-rack"] - 0.10) < 0.02
    groups = {g["metadata"]["name"] for g in load.groups}
    members: dict[str, int] = {}
    for pod in load.pods:
        group = pod["metadata"]["labels"].get("tessera.io/pod-group")
        if group:
            members[group] = members.get(group, 0) + 1
    assert set(members) == groups and set(members.values()) == {4}
    assert workload(10_000, seed=7).pods == load.pods  # seeded


def test_the_pool_has_the_gpus_asked_for_in_racks_of_16_nodes(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(pool_yaml(2048))
    _, nodes = read_file(path)
    gpu_nodes = [n for n in nodes if n.gpus]
    assert sum(len(n.gpus) for n in gpu_nodes) == 2048 and len(gpu_nodes) == 256
    assert len(nodes) - len(gpu_nodes) == 256  # 128 CPU-only nodes per zone
    racks = {(n.zone, n.rack) for n in gpu_nodes}
    assert len(racks) == 16 and {n.zone for n in nodes} == {"z0", "z1"}


def test_profile_samples_go_to_the_stage_they_were_in() -> None:
    bind = "run (threading.py:1);_run (app/db/engine.py:9);bind_planned (app/pods/service.py:3)"
    assert stage_of(bind + ";execute (sqlalchemy/engine/base.py:1)", "scheduler") == "bind"
    solve = "run_once (scheduler/loop.py:5);solve_reserving (scheduler/loop.py:7);x (numpy/a.py:1)"
    assert stage_of(solve, "scheduler") == "solve"
    # the API's samples by what the innermost known frame was doing
    create = "create (app/pods/service.py:1);insert (app/db/engine.py:2);wait (psycopg/c.py:3)"
    assert stage_of(create, "api") == "database (driver, ORM)"
    parse = "create (app/pods/router.py:1);model_validate (pydantic/main.py:2)"
    assert stage_of(parse, "api") == "request parsing and validation"
    assert stage_of("create (app/pods/service.py:1)", "api").startswith("pod logic")
    # py-spy prints some of Tessera's frames with the file name alone
    inside = "_run (app/db/engine.py:1);create (service.py:2);stored_spec (admission.py:3)"
    assert stage_of(inside, "api").startswith("pod logic")
    assert stage_of("_run (app/db/engine.py:1);uuid4 (uuid.py:2)", "api").startswith("database")
    # one process: the loops by function, the rest as the API's
    assert stage_of(solve, "dev") == "solve"
    assert stage_of(parse, "dev") == "request parsing and validation"


def test_a_tiny_burst_binds_and_starts_every_pod() -> None:
    result = measure(
        "sqlite",
        pods=40,
        gpus=256,
        clients=4,
        api_workers=1,
        seed=3,
        postgres_url=POSTGRES_URL,
        redis_url=None,
        profile=False,
        settle_seconds=20,
        trace_writes=True,
    )
    assert result.create_errors == 0, result.first_error
    assert result.created == result.bound == 40, result.unbound
    assert result.running == 40
    assert result.bound_per_second > 0 and result.create_p99_ms >= result.create_p50_ms
    assert 0 < result.create_to_bind_p50_s <= result.create_to_bind_p99_s
    # the floor ran in the same run, with the same pods, and the fractions are of it
    assert result.floor_creates_per_second > 0
    fraction = result.creates_per_second / result.floor_creates_per_second
    assert abs(result.creates_fraction - fraction) <= 0.011
    assert result.client_cpu_seconds > 0 and result.reference_loop_ms > 0
    created = [c for _, c, _ in result.timeline]
    bound = [b for _, _, b in result.timeline]
    assert created == sorted(created) and bound == sorted(bound) and bound[-1] == 40
    assert 0 < result.gpu_sm_allocated_pct < 100
    # every write transaction of the one process was timed: each pod's create and bind logged
    # a change at least (its start too, but on a busy machine the agent's reports of some may
    # still be on their way when the trace is read), and on SQLite one writer holds the lock at
    # a time
    (writes,) = result.writes.values()
    assert set(result.writes) == {"dev"} and writes["transactions"] > 0
    assert writes["changes"] >= 2 * 40
    assert all(writes[k] >= 0 for k in ("wait", "work", "flush", "commit"))
    assert 0 < writes["held_pct"] <= 100


def test_a_tiny_workload_burst_binds_every_pod_its_controllers_make() -> None:
    from bench.workloads import measure as measure_workloads

    result = measure_workloads(
        "sqlite",
        deployments=2,
        replicas=3,
        jobs=2,
        completions=2,
        clients=2,
        postgres_url=POSTGRES_URL,
        redis_url=None,
        gpus=256,
        settle_seconds=30,
    )
    assert result.bare.pods == result.bare.bound == 10
    assert result.workloads.pods == result.workloads.bound == 10  # 2 x 3 replicas + 2 x 2
    assert result.objects == 4  # every Deployment and Job, with its pods' lag
    assert set(result.lag_first_by_kind) == {"Deployment", "Job"}
    # a Deployment's two hops, each at most the whole way to its first pod
    assert set(result.lag_deployment_hops) == {"to its ReplicaSet", "ReplicaSet to first pod"}
    whole = result.lag_first_by_kind["Deployment"][1]
    assert all(0 <= p50 <= p99 <= whole + 0.01 for p50, p99 in result.lag_deployment_hops.values())
    assert 0 <= result.lag_first_p50_s <= result.lag_last_p50_s <= result.lag_last_p99_s
    assert result.fraction == round(
        result.workloads.bound_per_second / result.bare.bound_per_second, 2
    )
