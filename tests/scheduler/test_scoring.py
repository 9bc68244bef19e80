"""Tests of the fragmentation measure, the LP packing loss and host stranding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.scoring import (
    TargetShapes,
    fragment,
    fragment_by_shape,
    fragment_from_stats,
    fragment_stats,
    packing_loss,
    shape_access,
    slice_prices,
    stranded_idle,
    target_shapes,
)

# A target of three shapes: a whole GPU with 4 cores (p=0.5), half a GPU with 2 cores (p=0.3),
# and a CPU-only request (p=0.2).
SHAPES = TargetShapes.build(
    cpu=[4000, 2000, 8000], vram=[1000, 500, 0], count=[1, 1, 0], weight=[0.5, 0.3, 0.2]
)


def one_node(free: list[int], cpu: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gpus = np.array([free])
    return gpus, np.array([cpu]), np.ones((1, SHAPES.size), dtype=bool)


def test_fragment_matches_the_paper_definition_by_hand() -> None:
    # Free shares [1000, 500, 200, 0], 8 cores free; idle = 1700.
    # whole GPU: GPU0 fits, so the fragment is the rest: 500 + 200 + 0 = 700;
    # half GPU: GPU0 and GPU1 fit, the fragment is 200; CPU-only: all idle, 1700.
    gpus, cpu, access = one_node([1000, 500, 200, 0], 8000)
    per_shape = fragment_by_shape(gpus, gpus, cpu, access, SHAPES)
    assert per_shape.tolist() == [[700.0, 200.0, 1700.0]]
    assert fragment(gpus, gpus, cpu, access, SHAPES)[0] == pytest.approx(
        0.5 * 700 + 0.3 * 200 + 0.2 * 1700
    )


def test_lack_of_cpu_or_access_or_gpus_makes_all_idle_capacity_a_fragment() -> None:
    gpus, _, access = one_node([1000, 500, 200, 0], 8000)
    # 3 cores: the whole-GPU shape (4 cores) cannot run, so all 1700 idle count for it.
    per_shape = fragment_by_shape(gpus, gpus, np.array([3000]), access, SHAPES)
    assert per_shape.tolist() == [[1700.0, 200.0, 1700.0]]
    # No access to the model for the half-GPU shape.
    no_half = np.array([[True, False, True]])
    assert fragment_by_shape(gpus, gpus, np.array([8000]), no_half, SHAPES)[0, 1] == 1700.0
    # Only slivers left: nothing fits the half-GPU shape.
    slivers = np.array([[300, 200, 100, 0]])
    assert fragment_by_shape(slivers, slivers, np.array([8000]), access, SHAPES)[0, 1] == 600.0


def test_two_dimensional_fit_needs_both_dimensions_and_idle_is_their_mean() -> None:
    shapes = TargetShapes.build(cpu=[0], vram=[600], sm=[200], count=[1], weight=[1.0])
    vram = np.array([[700, 500]])
    sm = np.array([[100, 900]])
    access = np.ones((1, 1), dtype=bool)
    # GPU0 has the memory but not the SMs, GPU1 the SMs but not the memory: nothing fits.
    assert fragment(vram, sm, np.array([1000]), access, shapes)[0] == pytest.approx(
        (700 + 100) / 2 + (500 + 900) / 2
    )
    fitting_sm = np.array([[300, 900]])
    assert fragment(vram, fitting_sm, np.array([1000]), access, shapes)[0] == pytest.approx(
        (500 + 900) / 2
    )


def test_shape_access_follows_the_model_mask() -> None:
    shapes = TargetShapes.build(
        cpu=[0, 0], vram=[1000, 1000], count=[1, 1], weight=[0.5, 0.5], model_mask=[0b01, 0b10]
    )
    assert shape_access(np.array([0, 1, -1]), shapes).tolist() == [
        [True, False],
        [False, True],
        [False, False],
    ]


gpu_state = st.lists(st.integers(0, 100).map(lambda x: x * 10), min_size=8, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(st.tuples(gpu_state, gpu_state, st.integers(0, 20000)), min_size=1, max_size=6)
)
def test_stats_path_equals_direct_fragment(nodes: list[tuple[list[int], list[int], int]]) -> None:
    vram = np.array([n[0] for n in nodes])
    sm = np.array([n[1] for n in nodes])
    cpu = np.array([n[2] for n in nodes])
    access = np.ones((len(nodes), SHAPES.size), dtype=bool)
    n_fit, stranded, idle = fragment_stats(vram, sm, SHAPES)
    via_stats = fragment_from_stats(n_fit, stranded, idle, cpu, access, SHAPES)
    direct = fragment(vram, sm, cpu, access, SHAPES)
    np.testing.assert_allclose(via_stats, direct)
    # The fragment never exceeds the node's idle capacity and is never negative.
    assert (direct >= 0).all() and (direct <= idle + 1e-9).all()


def test_target_shapes_keep_the_most_popular_until_coverage_and_renormalise() -> None:
    # 6 x (cpu 1, 0.5 GPU), 3 x (cpu 2, 1 GPU), 1 x (cpu 4, CPU-only): 90 % coverage keeps two.
    cpu = [1] * 6 + [2] * 3 + [4]
    vram = [500] * 6 + [1000] * 3 + [0]
    count = [1] * 9 + [0]
    shapes = target_shapes(cpu=cpu, vram=vram, count=count, coverage=0.9)
    assert shapes.vram.tolist() == [500.0, 1000.0]
    np.testing.assert_allclose(shapes.weight, [6 / 9, 3 / 9])


def test_target_shapes_group_by_label_and_break_ties_by_larger_shape() -> None:
    shapes = target_shapes(
        cpu=[1, 1, 2, 2],
        vram=[500, 500, 500, 500],
        count=[1, 1, 1, 1],
        label=["A", "B", "A", "A"],
        coverage=1.0,
    )
    # (cpu 2, A) twice first; then the two singletons, larger (cpu, ..., label) first.
    assert list(zip(shapes.cpu.tolist(), shapes.weight.tolist(), strict=True)) == [
        (2.0, 0.5),
        (1.0, 0.25),
        (1.0, 0.25),
    ]


def test_slice_prices_of_a_single_half_gpu_slice() -> None:
    prices = slice_prices([500], [500], [1.0])
    assert prices.price.tolist() == pytest.approx([0.5])
    assert prices.value[100, 100] == pytest.approx(1.0)
    assert prices.gpus_per_slice_mix == pytest.approx(0.5)
    # With only half slices in the mix, a gap is worth 0.5 per half slice it can take: a half
    # slice loses nothing in a fresh GPU, next to another half, or in a 0.7 gap.
    losses = packing_loss(prices, np.array([1000, 500, 700]), np.array([1000, 500, 700]), 500, 500)
    np.testing.assert_allclose(losses, [0.0, 0.0, 0.0], atol=1e-9)


def test_slice_prices_reward_completing_a_pattern() -> None:
    # 0.47 slices pair up; 0.32 slices go three to a GPU. A 0.32 next to a lone 0.47 (gap 0.53)
    # leaves 0.21 that nothing fills: it loses value. Next to another 0.32 (gap 0.68) it does not.
    prices = slice_prices([470, 320], [470, 320], [0.5, 0.5])
    gaps = np.array([530, 680, 1000])
    loss = packing_loss(prices, gaps, gaps, 320, 320)
    assert loss[0] > 0.1
    np.testing.assert_allclose(loss[1:], [0.0, 0.0], atol=1e-9)
    assert packing_loss(prices, np.array([530]), np.array([530]), 470, 470)[0] == pytest.approx(0)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(5, 95).map(lambda x: x * 10), min_size=1, max_size=4, unique=True),
    gap=st.integers(0, 100).map(lambda x: x * 10),
)
def test_packing_loss_is_never_negative_where_the_slice_fits(sizes: list[int], gap: int) -> None:
    prices = slice_prices(sizes, sizes, [1.0] * len(sizes))
    for s in sizes:
        if s <= gap:
            assert packing_loss(prices, np.array([gap]), np.array([gap]), s, s)[0] >= -1e-9
    assert prices.value[100, 100] <= 1.0 + 1e-9


def test_two_dimensional_prices_pair_complementary_slices() -> None:
    # A memory-heavy (0.7 VRAM, 0.3 SM) and a compute-heavy (0.3, 0.7) slice fill one GPU together.
    prices = slice_prices([700, 300], [300, 700], [0.5, 0.5])
    assert prices.gpus_per_slice_mix == pytest.approx(0.5)
    assert packing_loss(prices, np.array([300]), np.array([700]), 300, 700)[0] == pytest.approx(0)


def test_stranded_idle_by_hand() -> None:
    # 4 idle GPUs (4000 milli) need 12 cores each (12 milli-CPU per GPU-milli): with 24 cores free,
    # only 2 GPUs can be used, 2000 milli are stranded; with plenty of CPU none is.
    out = stranded_idle(np.array([4000.0, 4000.0, 0.0]), np.array([24000, 96000, 0]), 12.0)
    np.testing.assert_allclose(out, [2000.0, 0.0, 0.0])
