"""The ``solver`` replay policy: the production solver placing the replay's arrivals."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.openb.protocol import typical_shapes
from bench.openb.replay import RunSpec, replay
from bench.openb.runner import parse_policies
from bench.openb.solver import models_of, pod_request, workload_of
from bench.openb.state import ClusterState
from tests.bench.conftest import MODELS, make_cluster, make_pods, request
from tests.bench.test_replay import node_st, pod_st, run_and_check, small_world


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(node_st, min_size=1, max_size=4),
    pods=st.lists(pod_st, min_size=1, max_size=30),
    seed=st.integers(0, 3),
)
def test_solver_places_every_arrival_validly_and_drops_only_what_fits_nowhere(
    nodes: list[tuple[int, int, int, str]], pods: list[tuple[int, int, int, int, str]], seed: int
) -> None:
    run_and_check(make_cluster(nodes), make_pods(pods), "solver", seed, window=1)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(node_st, min_size=1, max_size=4),
    pods=st.lists(pod_st, min_size=1, max_size=30),
    seed=st.integers(0, 3),
)
def test_batched_solver_keeps_the_invariants(
    nodes: list[tuple[int, int, int, str]], pods: list[tuple[int, int, int, int, str]], seed: int
) -> None:
    run_and_check(make_cluster(nodes), make_pods(pods), "solver", seed, window=8)


def test_solver_replay_places_the_small_world_and_is_deterministic() -> None:
    cluster, pods = small_world()
    first = replay(cluster, pods, RunSpec("small", "solver", 7))
    again = replay(cluster, pods, RunSpec("small", "solver", 7, 1))
    assert first.placed == again.placed > 0
    np.testing.assert_array_equal(first.curve, again.curve)
    batched = replay(cluster, pods, RunSpec("small", "solver", 7, 4))
    assert batched.placed > 0


def test_requests_and_workload_carry_shares_and_model_constraints() -> None:
    assert models_of(0b11, MODELS) == frozenset()
    assert models_of(0b10, MODELS) == frozenset({"B"})
    pod = pod_request(request(cpu=2000, milli=470, mask=0b01), MODELS)
    assert pod.gpu_slice is not None
    assert (pod.gpu_slice.vram_mib, pod.gpu_slice.sm_pct) == (470, 47)
    assert pod.gpu_models == frozenset({"A"})
    whole = pod_request(request(num_gpu=2), MODELS)
    assert whole.gpus == 2 and whole.gpu_slice is None and whole.gpu_models == frozenset()
    pods = make_pods([(1000, 0, 1, 500, "A"), (1000, 0, 2, 1000, ""), (4000, 0, 0, 0, "")])
    shapes = workload_of(typical_shapes(pods), MODELS)
    by_kind = {(s.gpus, s.vram_mib, s.sm_pct): s for s in shapes}
    assert by_kind[(0, 500, 50)].gpu_models == frozenset({"A"})
    assert by_kind[(2, 0, 0)].gpu_models == frozenset()
    assert by_kind[(0, 0, 0)].cpu_milli == 4000


def test_the_policy_snapshot_mirrors_the_state() -> None:
    from bench.openb.solver import SolverPolicy

    cluster = make_cluster([(64000, 256000, 4, "A"), (32000, 128000, 2, "B")])
    state = ClusterState(cluster)
    pods = make_pods([(1000, 0, 1, 500, ""), (1000, 0, 1, 1000, "")])
    policy = SolverPolicy(state, typical_shapes(pods), 0, None)
    state.vram_left[0, 1] = state.sm_left[0, 1] = 300
    state.cpu_left[1] = 1000
    snap = policy.snapshot(state)
    gpu = next(g for g in snap.gpus if g.id == "node-0/1")
    assert (gpu.free_vram_mib, gpu.free_sm_pct, gpu.pristine) == (300, 30, False)
    assert next(n for n in snap.nodes if n.name == "node-1").cpu_milli_free == 1000
    assert len(snap.gpus) == 6


def test_solver_policies_parse() -> None:
    runs = parse_policies("solver,solver@64", 1)
    assert [(r.name, r.batch) for r in runs] == [("solver", 1), ("solver", 64)]
