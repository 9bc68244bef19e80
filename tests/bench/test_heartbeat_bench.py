"""`tessera bench heartbeat` at a tiny size against a real server: every renewal is counted,
none fails, and the CPU figures are consistent with each other."""

from __future__ import annotations

from bench.heartbeat import DEFAULT_HEARTBEAT, measure


def test_the_heartbeat_bench_renews_every_nodes_lease() -> None:
    result = measure("sqlite", nodes=3, interval=0.5, seconds=2, postgres_url="")
    assert result.errors == 0
    # 3 nodes, one renewal each per half second for 2 seconds (the last may be cut off)
    assert 9 <= result.heartbeats <= 15, result
    assert result.api_cpu_seconds > 0
    per_beat = result.api_cpu_seconds / result.heartbeats  # both rounded in the report
    assert abs(result.api_cpu_ms_per_heartbeat - per_beat * 1000) <= 0.01 + per_beat * 5
    expected = DEFAULT_HEARTBEAT / (result.api_cpu_ms_per_heartbeat / 1000)
    assert abs(result.nodes_per_api_process_at_10s - expected) <= 0.05 * expected
