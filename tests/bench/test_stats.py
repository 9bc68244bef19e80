"""The quantile every benchmark reports: nearest rank, as its docstring says."""

from bench.stats import quantile


def test_the_nearest_rank_quantile() -> None:
    waits = [float(v) for v in range(300, 0, -1)]  # unsorted on purpose
    assert quantile(waits, 0.99) == 297.0  # 297 of 300 at or below it
    assert quantile(waits, 0.5) == 150.0
    assert quantile(waits, 1.0) == 300.0
    assert quantile(waits, 0.0) == 1.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 0.5) == 4.0  # 3.5 ranks: the 4th
    assert quantile([], 0.99) == 0.0
