"""What a docker-runtime node registers of its host's GPUs (agent/host.py): from a description
file here (no GPU on these machines), from NVML on a GPU host, none without either; the Node it
makes is one the API takes, with each GPU's UUID, NUMA node, PCIe switch and NVLink domain."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import pytest
import yaml

from agent.host import gpus_from_file, gpus_from_nvml, host_gpus, model_of, node_manifest
from app.inventory.service import builtin_models, node_spec_from_api

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


# --- NVML (no GPU on these machines: a stand-in for nvidia-ml-py's pynvml) ----------------

NVML_UUIDS = [
    "GPU-5a1c0b2e-0000-4000-8000-0000000000a0",
    "GPU-5a1c0b2e-0000-4000-8000-0000000000a1",
]
BUSES = ["00000000:18:00.0", "00000000:AF:00.0"]  # NVML's form: an 8-digit domain, upper case


def fake_nvml(*, init_error: str = "", count_error: str = "") -> types.ModuleType:
    """The part of pynvml the agent calls, for a host of two A100 80 GB GPUs joined by two
    NVLinks, each under its own PCIe root on its own NUMA node (their closest common ancestor
    is the system), as NVML answers on such a host: its busIds as bytes, the links past the
    GPU's last one refused with an NVMLError, one link of each inactive."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_NVLINK_MAX_LINKS = 18  # type: ignore[attr-defined]
    nvml.NVML_TOPOLOGY_MULTIPLE = 20  # type: ignore[attr-defined]
    nvml.calls = []  # type: ignore[attr-defined]
    links = {0: {0: 1, 1: 1, 2: None}, 1: {0: 0, 1: 0, 2: None}}  # link -> peer (None: down)

    def call(name: str) -> None:
        nvml.calls.append(name)  # type: ignore[attr-defined]

    def init() -> None:
        call("init")
        if init_error:
            raise NVMLError(init_error)

    def count() -> int:
        if count_error:
            raise NVMLError(count_error)
        return 2

    def link_state(handle: int, link: int) -> int:
        if link not in links[handle]:
            raise NVMLError("Invalid Argument")
        return int(links[handle][link] is not None)

    def remote(handle: int, link: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=BUSES[links[handle][link]].encode())

    def ancestor(a: int, b: int) -> int:
        return 0 if a == b else 50  # NVML_TOPOLOGY_INTERNAL, NVML_TOPOLOGY_SYSTEM

    for name, function in {
        "nvmlInit": init,
        "nvmlShutdown": lambda: call("shutdown"),
        "nvmlDeviceGetCount": count,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=BUSES[h].encode()),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=81920 << 20),
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": remote,
        "nvmlDeviceGetTopologyCommonAncestor": ancestor,
        "nvmlDeviceGetUUID": lambda h: NVML_UUIDS[h],
        "nvmlDeviceGetName": lambda h: b"NVIDIA A100-SXM4-80GB",
    }.items():
        setattr(nvml, name, function)
    return nvml


def sysfs(path: Path) -> Path:
    """/sys/bus/pci/devices as the host has it: each GPU's NUMA node (by its bus id)."""
    for numa, bus in enumerate(BUSES):
        device = path / bus.lower()[-12:]
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
    return path


def test_nvml_gpus_register_with_model_vram_uuid_nvlink_and_placement(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = gpus_from_nvml(sysfs(tmp_path / "devices"))
    assert nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert [g.uuid for g in gpus] == NVML_UUIDS
    assert [g.pci_bus_id for g in gpus] == [b.lower() for b in BUSES]
    assert [g.nvlink_peers for g in gpus] == [(1,), (0,)]
    assert [g.numa_node for g in gpus] == [0, 1]
    manifest = node_manifest("host-n", gpus)
    assert manifest["metadata"]["labels"]["tessera.io/gpu-model"] == "A100-80GB"
    assert manifest["status"]["capacity"]["nvidia.com/gpu"] == "2"
    spec = node_spec_from_api(manifest)  # what the API registers
    # the model NVML's name and memory pick (80 GB, not the 40 GB A100), hence its VRAM
    assert {g.model for g in spec.gpus} == {"A100-80GB"}
    assert builtin_models()["A100-80GB"][0] == 81920
    assert [g.uuid for g in spec.gpus] == NVML_UUIDS
    assert spec.gpus[0].nvlink_domain == spec.gpus[1].nvlink_domain != ""
    assert [g.numa_node for g in spec.gpus] == [0, 1] and spec.numa_nodes == 2
    assert spec.gpus[0].pcie_switch != spec.gpus[1].pcie_switch


def test_without_nvidia_ml_py_no_gpu_and_a_line_saying_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml: ImportError
    with caplog.at_level(logging.INFO, logger="tessera.agent"):
        assert host_gpus(None) == []
    assert "nvidia-ml-py is not installed" in caplog.text


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"init_error": "Driver Not Loaded"}, "NVML did not start (Driver Not Loaded)"),
        ({"count_error": "GPU is lost"}, "NVML failed while reading the GPUs (GPU is lost)"),
    ],
)
def test_nvml_failing_registers_no_gpu_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: dict[str, str],
    said: str,
) -> None:
    nvml = fake_nvml(**fault)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with caplog.at_level(logging.INFO, logger="tessera.agent"):
        assert host_gpus(None) == []
    assert f"no NVIDIA GPU registered: {said}" in caplog.text
    assert [r.levelname for r in caplog.records if "GPU" in r.getMessage()] == ["WARNING"]
    # NVML is shut down again once it started
    assert nvml.calls == (["init"] if "init_error" in fault else ["init", "shutdown"])  # type: ignore[attr-defined]
    assert "nvidia.com/gpu" not in node_manifest("host-x", [])["status"]["capacity"]
