"""The cycle state's arrays against a plain per-object reading of the snapshot."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cycle import CycleState, _dense_ids, _dense_pairs
from scheduler.snapshot import Snapshot, TopologyLevel
from tests.scheduler.factories import PoolSpec, random_pool


def _first_seen(keys: list[object]) -> list[int]:
    ids: dict[object, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-3, 3)), min_size=0, max_size=40))
def test_dense_pairs_number_pairs_in_order_of_first_appearance(pairs: list[tuple[int, int]]):
    major = np.array([a for a, _ in pairs], dtype=np.int64)
    minor = np.array([b for _, b in pairs], dtype=np.int64)
    assert _dense_pairs(major, minor).tolist() == _first_seen(pairs)
    assert _dense_ids([(str(a), str(b)) for a, b in pairs]).tolist() == _first_seen(pairs)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    zones=st.integers(1, 2),
    racks=st.integers(1, 3),
    nodes=st.integers(1, 3),
    gpus=st.sampled_from([2, 4, 8]),
    domains=st.sampled_from([1, 2]),
    shuffle=st.integers(0, 10_000),
)
def test_cycle_state_is_the_snapshot_read_object_by_object(
    seed: int, zones: int, racks: int, nodes: int, gpus: int, domains: int, shuffle: int
):
    pool = random_pool(PoolSpec(zones, racks, nodes, gpus, domains), seed)
    # The GPUs in any order: the cycle numbers them by (node, device index).
    order = np.random.default_rng(shuffle).permutation(len(pool.gpus))
    snapshot = Snapshot(pool.nodes, tuple(pool.gpus[i] for i in order), pool.costs)
    cycle = CycleState.build(snapshot)

    node_index = {n.name: i for i, n in enumerate(snapshot.nodes)}
    ref = sorted(snapshot.gpus, key=lambda g: (node_index[g.node], g.index))
    assert cycle.gpu_info == tuple(ref)
    assert cycle.gpu_ids == tuple(g.id for g in ref)
    assert cycle.gpu_number == {g.id: i for i, g in enumerate(ref)}
    assert cycle.node_names == tuple(n.name for n in snapshot.nodes)
    columns = {
        "gpu_node": [node_index[g.node] for g in ref],
        "gpu_index": [g.index for g in ref],
        "gpu_vram": [g.vram_mib for g in ref],
        "gpu_free_vram": [g.free_vram_mib for g in ref],
        "gpu_free_sm": [g.free_sm_pct for g in ref],
        "gpu_healthy": [g.healthy for g in ref],
        "gpu_pristine": [g.pristine for g in ref],
        "gpu_numa": [g.numa_node for g in ref],
        "gpu_nvlink": _first_seen([(g.node, g.nvlink_domain) for g in ref]),
        "gpu_pcie": _first_seen([(g.node, g.pcie_switch) for g in ref]),
        "node_cpu_free": [n.cpu_milli_free for n in snapshot.nodes],
        "node_mem_free": [n.memory_mib_free for n in snapshot.nodes],
        "node_cpu_alloc": [n.cpu_milli_allocatable for n in snapshot.nodes],
        "node_mem_alloc": [n.memory_mib_allocatable for n in snapshot.nodes],
        "node_cordoned": [n.cordoned for n in snapshot.nodes],
        "node_gpu_count": [sum(g.node == n.name for g in ref) for n in snapshot.nodes],
        "node_whole_free": [
            sum(g.node == n.name and g.pristine for g in ref) for n in snapshot.nodes
        ],
    }
    for name, expected in columns.items():
        array = getattr(cycle, name)
        assert array.tolist() == expected, name
        flag = name in ("gpu_healthy", "gpu_pristine", "node_cordoned")
        assert array.dtype == (np.bool_ if flag else np.int64), name
        assert array.flags.c_contiguous, name
    models = _first_seen([g.model for g in ref])
    model_ids = dict(zip([g.model for g in ref], models, strict=True))
    assert cycle.model_ids == model_ids
    assert list(cycle.model_ids) == list(dict.fromkeys(g.model for g in ref))
    first = {g.node: g for g in reversed(ref)}
    assert cycle.node_model.tolist() == [
        model_ids[first[n.name].model] if n.name in first else -1 for n in snapshot.nodes
    ]
    places = [(n.region, n.zone, n.rack) for n in snapshot.nodes]
    assert cycle.node_domain[TopologyLevel.RACK].tolist() == _first_seen(places)
    assert cycle.node_domain[TopologyLevel.ZONE].tolist() == _first_seen([p[:2] for p in places])
    assert cycle.node_domain[TopologyLevel.REGION].tolist() == _first_seen([p[:1] for p in places])
    for g, number in enumerate(cycle.gpu_node.tolist()):
        start = int(cycle.node_gpu_start[number])
        assert cycle.node_gpus[number, g - start] == g
