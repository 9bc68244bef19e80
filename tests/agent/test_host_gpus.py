"""What a docker-runtime node registers of its host's GPUs (agent/host.py): from a description
file here (no GPU on these machines), from NVML on a GPU host, none without either; the Node it
makes is one the API takes, with each GPU's UUID, NUMA node, PCIe switch and NVLink domain."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from agent.host import gpus_from_file, host_gpus, model_of, node_manifest
from app.inventory.service import node_spec_from_api

UUIDS = [f"GPU-3b2f1c7e-0000-4000-8000-00000000000{i}" for i in range(4)]


def write_gpus(path: Path) -> Path:
    """Four H100s: NVLinked in pairs (0-1, 2-3), two per PCIe switch, one pair per NUMA node."""
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "index": i,
                        "uuid": UUIDS[i],
                        "name": "NVIDIA H100 80GB HBM3",
                        "memoryMiB": 81559,
                        "numaNode": i // 2,
                        "pciBusId": f"0000:{0x18 + i:02x}:00.0",
                        "pcieSwitch": f"sw{i // 2}",
                        "nvlinkPeers": [i ^ 1],
                    }
                    for i in range(4)
                ]
            }
        )
    )
    return path


def test_nvml_names_are_tessera_models() -> None:
    assert model_of("NVIDIA H100 80GB HBM3", 81559) == "H100"
    assert model_of("NVIDIA H200", 143771) == "H200"
    assert model_of("NVIDIA A100-SXM4-40GB", 40960) == "A100-40GB"
    assert model_of("NVIDIA A100-SXM4-80GB", 81920) == "A100-80GB"
    assert model_of("Tesla T4", 15360) == "T4"
    assert model_of("Tesla V100-SXM2-32GB", 32768) == "V100M32"
    assert model_of("NVIDIA GeForce RTX 4090", 24564) == "NVIDIA GeForce RTX 4090"  # unknown


def test_a_described_host_registers_its_gpus_with_their_uuids_and_topology(
    tmp_path: Path,
) -> None:
    gpus = host_gpus(write_gpus(tmp_path / "gpus.yaml"))
    assert [g.uuid for g in gpus] == UUIDS and {g.model for g in gpus} == {"H100"}
    manifest = node_manifest("host-a", gpus)
    assert manifest["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert manifest["metadata"]["labels"]["tessera.io/gpu-model"] == "H100"
    spec = node_spec_from_api(manifest)  # the API takes it as it is
    assert [g.uuid for g in spec.gpus] == UUIDS
    assert [g.numa_node for g in spec.gpus] == [0, 0, 1, 1] and spec.numa_nodes == 2
    domains = [g.nvlink_domain for g in spec.gpus]
    assert domains[0] == domains[1] != domains[2] == domains[3] and all(domains)
    switches = [g.pcie_switch for g in spec.gpus]
    assert switches[0] == switches[1] != switches[2] == switches[3]
    assert spec.cpu_milli > 0 and spec.memory_mib >= 512


def test_a_gpu_without_nvlink_is_in_no_domain(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [{"uuid": UUIDS[0], "model": "T4"}]}))
    spec = node_spec_from_api(node_manifest("host-b", gpus_from_file(path)))
    (gpu,) = spec.gpus
    assert gpu.model == "T4" and gpu.uuid == UUIDS[0] and gpu.nvlink_domain == ""


def test_a_host_without_nvml_registers_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert host_gpus(None) == []
    manifest = node_manifest("host-c", [])
    assert "nvidia.com/gpu" not in manifest["status"]["capacity"]
    assert node_spec_from_api(manifest).gpus == ()


def test_a_bad_description_is_refused_with_where(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - index: 0\n")
    with pytest.raises(ValueError, match=r"gpus\[0\] needs a uuid"):
        gpus_from_file(path)
