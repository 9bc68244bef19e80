"""Each baseline's choice on small hand-made clusters (the paper's simulator semantics)."""

from __future__ import annotations

import numpy as np

from bench.openb.baselines import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    FGDPolicy,
    PackingPolicy,
    RandomPolicy,
    fgd_score,
    pick_best,
)
from bench.openb.state import ClusterState
from scheduler.scoring import TargetShapes
from tests.bench.conftest import fill, make_cluster, request

FEASIBLE = np.arange(4)


def four_nodes() -> ClusterState:
    return ClusterState(make_cluster([(32000, 100000, 2, "A")] * 4))


def test_best_fit_prefers_the_node_with_least_room_left(rank4: np.ndarray) -> None:
    state = four_nodes()
    fill(state, 1, [0, 1000])  # one GPU left: (2000 - 1000) / 8000 / 2 -> 6 points better
    choice = BestFitPolicy(rank4).choose(state, request(cpu=1000), FEASIBLE)
    assert choice.node == 1 and choice.gpus == (1,)


def test_dot_product_prefers_the_smallest_dot_product(rank4: np.ndarray) -> None:
    state = ClusterState(make_cluster([(128000, 100000, 2, "A")] * 4))
    fill(state, 2, [1000, 1000], cpu_left=70000)  # 100 * (1 - 0.55 * 0.5 / 2) = 86 vs 75
    cpu_only = request(cpu=64000, num_gpu=0, milli=0)
    assert DotProdPolicy(rank4).choose(state, cpu_only, FEASIBLE).node == 2
    fill(state, 3, [0, 0], cpu_left=128000)  # no GPU left: the GPU term vanishes
    assert (
        DotProdPolicy(rank4).choose(state, request(cpu=0, milli=0, num_gpu=0), FEASIBLE).node == 0
    )
    assert DotProdPolicy(rank4).choose(state, request(cpu=100), np.array([0, 1])).node == 0


def test_packing_prefers_shared_gpus_then_used_nodes(rank4: np.ndarray) -> None:
    state = four_nodes()
    fill(state, 1, [600, 1000])  # a shared GPU with room: 100 - 6 = 94
    fill(state, 2, [0, 1000])  # a used node with a free GPU: 49 (idle nodes: 33 - 2 = 31)
    share = PackingPolicy(rank4).choose(state, request(milli=500), FEASIBLE)
    assert share.node == 1 and share.gpus == (0,)
    # a whole GPU: the used node 2 (49) beats the idle nodes 0 and 3 (31)
    assert PackingPolicy(rank4).choose(state, request(), np.array([0, 2, 3])).node == 2


def test_clustering_groups_pods_of_the_same_class(rank4: np.ndarray) -> None:
    state = four_nodes()
    fill(state, 1, [500, 1000])
    state.affinity[1, request(milli=500).affinity] = 1  # node 1 runs shared-GPU pods
    fill(state, 2, [0, 1000])
    state.affinity[2, request().affinity] = 1  # node 2 runs one-GPU pods
    assert ClusteringPolicy(rank4).choose(state, request(), FEASIBLE).node == 2
    assert ClusteringPolicy(rank4).choose(state, request(milli=400), FEASIBLE).node == 1


def test_fgd_fills_the_gpu_that_would_otherwise_stay_a_fragment(rank4: np.ndarray) -> None:
    # Target: half the requests are half GPUs, half are whole GPUs. On node 1, GPU 0 has 500 left:
    # a fragment for whole-GPU requests. Filling it lowers the fragment (score 56); starting a
    # fresh GPU elsewhere raises it (score 43).
    state = four_nodes()
    fill(state, 1, [500, 1000])
    shapes = TargetShapes.build(cpu=[0, 0], vram=[500, 1000], count=[1, 1], weight=[0.5, 0.5])
    choice = FGDPolicy(state, shapes, rank4).choose(state, request(milli=500), FEASIBLE)
    assert choice.node == 1 and choice.gpus == (0,)
    assert fgd_score(np.array([250.0, -250.0, 0.0])).tolist() == [56, 43, 50]


def test_random_picks_uniformly_among_feasible_nodes() -> None:
    state = four_nodes()
    policy = RandomPolicy(np.random.default_rng(0))
    picks = {policy.choose(state, request(), np.array([1, 3])).node for _ in range(40)}
    assert picks == {1, 3}


def test_ties_go_to_the_first_node_of_the_run_order() -> None:
    scores = np.array([7, 9, 9, 9])
    nodes = np.arange(4)
    assert pick_best(scores, nodes, np.array([0, 3, 1, 2])) == 2
    assert pick_best(scores, nodes, np.array([0, 1, 3, 2])) == 1


def test_shared_gpu_choice_and_whole_gpus(rank4: np.ndarray) -> None:
    state = ClusterState(make_cluster([(32000, 100000, 4, "A")]))
    fill(state, 0, [700, 600, 1000, 600])
    share = BestFitPolicy(rank4).choose(state, request(milli=500), np.array([0]))
    assert share.gpus == (1,)  # least room that fits, lowest index on ties
    whole = BestFitPolicy(rank4).choose(state, request(num_gpu=1), np.array([0]))
    assert whole.gpus == (2,)  # the lowest-index fully free GPU
