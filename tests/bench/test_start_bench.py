"""`tessera bench start` at a tiny size, so that it cannot rot: real processes, a real Docker
engine running the busybox test image, and the virtual runtime beside it.

The engine is needed: without one this test skips, or fails when CI is set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from app.cli import cli
from tests.conftest import POSTGRES_URL
from tests.engine import BUSYBOX, docker


def bench(name: str, out: Path, docker_host: str, *args: str) -> tuple[Any, str]:
    """`tessera bench NAME ARGS` on the busybox image and the test engine, writing to `out`:
    its JSON figures (NAME.json) and what it printed."""
    result = CliRunner().invoke(
        cli,
        [
            *("bench", name, *args, "--image", BUSYBOX),
            *("--docker-host", docker_host, "--out", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / f"{name}.json").read_text()), result.output


def test_a_tiny_start_bench_runs_every_pod_on_both_runtimes_in_both_modes(
    docker_host: str, tmp_path: Path
) -> None:
    args = ("--pods", "4", "--clients", "2", "--postgres-url", POSTGRES_URL)
    out = tmp_path / "out"
    data, output = bench("start", out, docker_host, *args)
    assert data["pods"] == 4 and "load average" in data["uptime"]
    assert "load average" in data["uptime_end"]
    by_mode = {(p["runtime"], p["mode"]): p for p in data["phases"]}
    assert set(by_mode) == {
        (runtime, mode) for runtime in ("docker", "virtual") for mode in ("in-flight", "at-once")
    }
    for phase in by_mode.values():
        assert phase["running"] == 4 and phase["create_errors"] == 0, phase
    # in flight, a client creates its next pod once its last is Running: never more than one
    # per client; at once, the virtual runtime's start delay (0.5 s) sees every pod created
    for runtime in ("docker", "virtual"):
        assert by_mode[runtime, "in-flight"]["most_in_flight"] <= 2
    assert by_mode["virtual", "at-once"]["most_in_flight"] == 4
    assert by_mode["virtual", "in-flight"]["seconds"] >= 2 * 0.5  # two starts one after another
    assert "in-flight" in output and "at-once" in output
    phases = {p["runtime"]: p for p in data["phases"] if p["mode"] == "at-once"}
    for phase in phases.values():
        assert phase["running"] == 4 and phase["create_errors"] == 0, phase
        assert len(phase["latencies_s"]) == 4
        assert 0 < phase["create_to_bind_p50_s"] <= phase["create_to_running_p50_s"]
        assert phase["create_to_running_p50_s"] <= phase["create_to_running_p99_s"]
        assert phase["started_per_second"] > 0 and phase["agent_cpu_ms_per_start"] > 0
    # the virtual runtime waits its start delay (0.5 s) before it says Running
    assert phases["virtual"]["create_to_running_p50_s"] >= 0.5
    # the way to Running in steps, from the engine's events (the docker runtime's alone)
    steps = phases["docker"]["steps_s"]
    assert set(steps) == {"bind_to_engine", "engine_create_to_started", "started_to_running_seen"}
    assert all(p50 <= p99 for p50, p99 in steps.values()), steps
    assert steps["engine_create_to_started"][0] > 0, steps  # one clock: the engine's
    assert phases["virtual"]["steps_s"] == {}
    # the engine's own work is counted on the docker runtime alone
    assert "engine" in phases["docker"]["cpu_seconds"]
    assert "engine" not in phases["virtual"]["cpu_seconds"]
    assert (out / "start.png").stat().st_size > 0
    assert "docker, at-once: 4/4 Running" in output
    # the bench leaves no container behind
    for mode in ("in-flight", "at-once"):
        node = f"label=tessera.io/node=start-docker-{mode}"
        assert not docker(docker_host, "ps", "-aq", "--filter", node).split()


def test_the_engine_bench_starts_and_removes_its_containers(
    docker_host: str, tmp_path: Path
) -> None:
    args = ("--starts", "3", "--at-once", "1,2", "--cpu", "0.25")
    trials, _ = bench("engine", tmp_path / "out", docker_host, *args)
    assert [(t["at_once"], t["starts"], t["cpu"]) for t in trials] == [(1, 3, 0.25), (2, 3, 0.25)]
    for trial in trials:
        assert trial["per_second"] > 0 and 0 < trial["p50_s"] <= trial["p99_s"], trial
        assert trial["machine_cpu_ms_per_start"] > 0, trial
    # nothing of it is left on the engine
    left = docker(docker_host, "ps", "-aq", "--filter", "label=tessera.bench")
    assert not left.strip(), left
    networks = docker(docker_host, "network", "ls", "-q", "--filter", "name=tessera-bench-engine")
    assert not networks.strip(), networks
