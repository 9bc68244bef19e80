"""Tessera's placement rule on small hand-made clusters."""

from __future__ import annotations

import numpy as np

from bench.openb.state import ClusterState
from bench.openb.tessera import TesseraPolicy, model_load
from scheduler.scoring import TargetShapes
from tests.bench.conftest import fill, make_cluster, request

RANK = np.arange(8, dtype=np.int64)


def slices(*sizes: int, cpu: int = 1000) -> TargetShapes:
    n = len(sizes)
    return TargetShapes.build(cpu=[cpu] * n, vram=list(sizes), count=[1] * n, weight=[1 / n] * n)


def test_a_slice_completes_the_pattern_it_belongs_to() -> None:
    # Mix of 0.47 and 0.32 slices. GPU gaps: 0.53 (a lone 0.47) on node 0, 0.68 (a lone 0.32) on
    # node 1. A 0.32 slice goes next to the other 0.32, not into the 0.53 gap (which would leave
    # an unusable 0.21); a 0.47 goes into the 0.53 gap.
    state = ClusterState(make_cluster([(64000, 100000, 1, "A"), (64000, 100000, 1, "A")]))
    fill(state, 0, [530])
    fill(state, 1, [680])
    policy = TesseraPolicy(state, slices(470, 320), RANK)
    assert policy.choose(state, request(milli=320), np.array([0, 1])).node == 1
    assert policy.choose(state, request(milli=470), np.array([0, 1])).node == 0


def test_cpu_heavy_requests_avoid_stranding_gpus() -> None:
    # Target: 8 cores per GPU. Node 0 has 4 idle GPUs and 40 cores; a 20-core request there
    # would leave 20 cores for 3 idle GPUs that need 24 (half a GPU stranded); node 1 has 64
    # cores. The node order prefers node 0: stranding must win. An 8-core request strands
    # nothing on node 0.
    state = ClusterState(make_cluster([(40000, 100000, 4, "A"), (64000, 100000, 4, "A")]))
    shapes = TargetShapes.build(cpu=[8000], vram=[1000], count=[1], weight=[1.0])
    policy = TesseraPolicy(state, shapes, RANK)
    assert policy.choose(state, request(cpu=20000), np.array([0, 1])).node == 1
    assert policy.choose(state, request(cpu=8000), np.array([0, 1])).node == 0


def test_flexible_requests_leave_a_scarce_model_to_the_requests_constrained_to_it() -> None:
    # Model B has 2 GPUs and the constrained half of the target can only use B: B is reserved.
    state = ClusterState(make_cluster([(64000, 100000, 2, "B"), (64000, 100000, 8, "A")]))
    shapes = TargetShapes.build(
        cpu=[1000, 1000],
        vram=[1000, 1000],
        count=[1, 1],
        weight=[0.5, 0.5],
        model_mask=[0b10, 0b11],
    )
    load = model_load(shapes, state)
    assert load[1] > 1.0 and load[0] == 0.0  # B is oversubscribed by constrained demand alone
    policy = TesseraPolicy(state, shapes, RANK)  # node order prefers the B node
    assert policy.choose(state, request(), np.array([0, 1])).node == 1
    assert policy.choose(state, request(mask=0b10), np.array([0])).node == 0


def test_a_batch_places_whole_gpus_first() -> None:
    # One free GPU, a window of a 0.81 slice then a whole GPU: the whole GPU gets it.
    state = ClusterState(make_cluster([(64000, 100000, 1, "A")]))
    policy = TesseraPolicy(state, slices(810), RANK)
    small = request(milli=810)
    whole = request()
    policy.place_batch(state, [small, whole])
    assert state.allocated == 1000.0
