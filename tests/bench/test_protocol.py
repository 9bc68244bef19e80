"""The paper's protocol: shuffle, 1.3x tune, typical pods and the discrete metric."""

from __future__ import annotations

import numpy as np
import pytest

from bench.openb.protocol import arrival_order, discrete_allocation, typical_shapes
from bench.openb.trace import Pods
from tests.bench.conftest import make_pods

CAPACITY = 10 * 1000  # a 10-GPU cluster


def workload() -> Pods:
    rows = [(1000, 1000, 1, 1000, "")] * 4 + [(1000, 1000, 1, 500, "")] * 4
    rows += [(1000, 1000, 0, 0, "")] * 2  # 6 GPUs requested in all
    return make_pods(rows)


def test_tune_up_appends_random_draws_until_the_next_would_overshoot_130_percent() -> None:
    pods = workload()
    for seed in range(20):
        order = arrival_order(pods, CAPACITY, np.random.default_rng(seed))
        demand = pods.gpu_demand()[order]
        assert sorted(order[: pods.size].tolist()) == list(range(pods.size))  # all originals first
        assert demand.sum() <= 1.3 * CAPACITY
        assert demand.sum() > 1.3 * CAPACITY - 1000  # stopped by a draw that would overshoot


def test_tune_down_removes_random_pods_until_at_most_130_percent() -> None:
    pods = make_pods([(1000, 1000, 8, 1000, "")] * 3)  # 24 GPUs for a 10-GPU cluster
    order = arrival_order(pods, CAPACITY, np.random.default_rng(1))
    assert pods.gpu_demand()[order].sum() <= 1.3 * CAPACITY
    assert len(order) == 1


def test_arrival_order_is_a_seeded_shuffle() -> None:
    pods = workload()
    a = arrival_order(pods, CAPACITY, np.random.default_rng(42))
    b = arrival_order(pods, CAPACITY, np.random.default_rng(42))
    c = arrival_order(pods, CAPACITY, np.random.default_rng(43))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_typical_shapes_group_by_cpu_gpu_and_spec_and_include_cpu_only_pods() -> None:
    pods = make_pods(
        [(1000, 1, 1, 500, "A")] * 5 + [(1000, 2, 1, 500, "B")] * 3 + [(2000, 1, 0, 0, "")] * 2
    )
    shapes = typical_shapes(pods, coverage=1.0)
    assert shapes.size == 3
    np.testing.assert_allclose(sorted(shapes.weight), [0.2, 0.3, 0.5])
    assert int(shapes.count[np.argmin(shapes.weight)]) == 0


def test_discrete_allocation_averages_the_lines_of_each_arrived_percent() -> None:
    cap = 100_000.0
    arrived = np.array([500.0, 99_600.0, 100_400.0, 130_000.0])
    allocated = np.array([500.0, 95_000.0, 96_000.0, 97_000.0])
    curve = discrete_allocation(arrived, allocated, cap)
    assert curve[100] == pytest.approx(95.5)  # both lines round to 100 %
    assert curve[130] == pytest.approx(97.0)
    assert curve[101] == pytest.approx(95.5)  # no line at 101 %: the lines within +-1
    assert np.isnan(curve[50])
