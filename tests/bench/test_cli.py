"""`tessera bench openb`: argument parsing, the missing-trace error, and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from bench.openb.runner import PolicyRun, parse_policies, parse_seeds, parse_workloads
from bench.openb.trace import PAPER_WORKLOADS


def test_parse_seeds_workloads_and_policies() -> None:
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("1,3-4") == [1, 3, 4]
    assert parse_workloads("all") == list(PAPER_WORKLOADS) and len(PAPER_WORKLOADS) == 17
    assert parse_workloads("default,gpushare100") == ["default", "gpushare100"]
    runs = parse_policies("all,tessera@64", batch=1)
    assert len(runs) == 8 and runs[-1] == PolicyRun("tessera", 64)
    assert parse_policies("fgd", batch=64) == [PolicyRun("fgd", 64)]
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policies("fifo", batch=1)


def test_missing_trace_says_where_to_get_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "openb", "--trace-dir", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code != 0
    assert "alibaba/clusterdata" in result.output and "cluster-trace-gpu-v2023" in result.output


def write_tiny_trace(folder: Path) -> None:
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    nodes += [
        f"node-{i},64000,262144,{g},{m}" for i, (g, m) in enumerate([(8, "G2"), (2, "T4")] * 3)
    ]
    (folder / "openb_node_list_gpu_node.csv").write_text("\n".join(nodes) + "\n")
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    shapes = [(4000, 8000, 1, 470, ""), (12000, 16000, 1, 1000, ""), (3000, 4000, 1, 810, "T4")]
    shapes += [(8000, 8000, 0, 0, ""), (16000, 32000, 4, 1000, "G2")]
    pods += [f"pod-{i:04d},{c},{m},{n},{g},{s}" for i, (c, m, n, g, s) in enumerate(shapes * 8)]
    (folder / "openb_pod_list_tiny.csv").write_text("\n".join(pods) + "\n")


def test_tiny_end_to_end_run_writes_results_summary_and_plot(tmp_path: Path) -> None:
    write_tiny_trace(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "openb",
            "--workloads",
            "tiny,tiny-2d",
            "--policies",
            "fgd,tessera,tessera@4",
            "--seeds",
            "1-2",
            "--trace-dir",
            str(tmp_path),
            "--out",
            str(out),
            "--jobs",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert len(data["runs"]) == 2 * 3 * 2
    run = data["runs"][0]
    assert {"workload", "policy", "batch", "seed", "unallocated_100", "alloc_130"} <= set(run)
    assert set(data["summary"]["tiny"]) == {"fgd", "tessera", "tessera@4"}
    assert "Tessera (batch 4)" in (out / "summary.md").read_text()
    assert (out / "allocation.png").stat().st_size > 0
    assert str(tmp_path) not in (out / "results.json").read_text()  # no machine paths
