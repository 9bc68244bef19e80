"""What this host has, as the Node a docker-runtime agent registers: its CPUs, its memory less a
reserve, and its NVIDIA GPUs with their model, UUID, NUMA node, PCIe switch and NVLink peers.

The GPUs come from NVML (`pip install 'tessera[nvidia]'`: nvidia-ml-py, imported only when
installed) on a host with an NVIDIA driver, and are none otherwise. A file (YAML or JSON; the
setting `agent_gpu_file`, TESSERA_AGENT_GPU_FILE) describes them instead:

    gpus:
      - index: 0
        uuid: GPU-3b2f1c7e-0000-4000-8000-000000000001
        name: NVIDIA H100 80GB HBM3      # NVML's name, or `model: H100` (a Tessera model)
        memoryMiB: 81559                 # picks between models of one name (A100 40/80 GB)
        numaNode: 0
        pciBusId: "0000:18:00.0"
        pcieSwitch: sw0                  # optional: GPUs under one PCIe switch
        nvlinkPeers: [1, 2, 3]           # indexes of the GPUs it has NVLinks to

GPUs joined by NVLink (directly or through others) form one NVLink domain; the Node carries the
layout in its `tessera.io/gpu-topology` annotation, which the API reads at registration.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.constants import GPU, LABEL_GPU_MODEL
from app.inventory.service import builtin_models

log = logging.getLogger("tessera.agent")

MEMORY_RESERVE_MIB = 1024  # of the host's memory, left to it and to Tessera
MAX_GPUS = 64
PCI_DEVICES = Path("/sys/bus/pci/devices")  # sysfs: each PCI device's NUMA node


@dataclass(frozen=True)
class HostGPU:
    index: int
    uuid: str
    model: str  # a Tessera GPU model (gpu_models.yaml) when one matches, else NVML's name
    numa_node: int = 0
    pci_bus_id: str = ""
    pcie_switch: str = ""  # "" : the GPU's own (none shared)
    nvlink_peers: tuple[int, ...] = ()


def model_of(name: str, memory_mib: int | None = None) -> str:
    """The Tessera model of an NVML name ("NVIDIA H100 80GB HBM3" -> H100; "NVIDIA A100-SXM4-
    40GB" -> A100-40GB by its memory): among the known models whose name's base (before a
    size suffix) is a word of it, the one whose VRAM is nearest `memory_mib`. The name itself
    when none is (the API then refuses the node, naming the models it knows)."""
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    candidates = []
    for model, (vram, _) in builtin_models().items():
        base = re.split(r"-|M(?=\d+$)", model.upper())[0]
        if model.upper() in words or base in words:
            candidates.append((model, vram))
    if not candidates:
        return name
    if memory_mib is None:
        return min(candidates, key=lambda c: len(c[0]))[0]
    return min(candidates, key=lambda c: abs(c[1] - memory_mib))[0]


def gpus_from_file(path: Path) -> list[HostGPU]:
    raw = yaml.safe_load(path.read_text()) or {}
    items = raw.get("gpus") if isinstance(raw, dict) else None
    if not isinstance(items, list) or len(items) > MAX_GPUS:
        raise ValueError(f"{path}: expected gpus: a list of at most {MAX_GPUS} GPUs")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not item.get("uuid"):
            raise ValueError(f"{path}: gpus[{i}] needs a uuid")
        memory = item.get("memoryMiB")
        model = item.get("model") or model_of(
            str(item.get("name") or ""), int(memory) if memory is not None else None
        )
        out.append(
            HostGPU(
                index=int(item.get("index", i)),
                uuid=str(item["uuid"]),
                model=str(model),
                numa_node=max(int(item.get("numaNode") or 0), 0),
                pci_bus_id=str(item.get("pciBusId") or ""),
                pcie_switch=str(item.get("pcieSwitch") or ""),
                nvlink_peers=tuple(int(p) for p in item.get("nvlinkPeers") or ()),
            )
        )
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus_from_nvml(pci_devices: Path = PCI_DEVICES) -> list[HostGPU]:
    """The host's GPUs as NVML reports them (their NUMA nodes from `pci_devices`, sysfs); none,
    with a log line saying why, without nvidia-ml-py, without a driver, or when NVML fails while
    they are read (the node then registers without GPUs rather than not at all)."""
    try:
        import pynvml
    except ImportError:
        log.info(
            "no NVIDIA GPU registered: nvidia-ml-py is not installed "
            "(pip install 'tessera[nvidia]' on a GPU host)"
        )
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.warning("no NVIDIA GPU registered: NVML did not start (%s)", exc)
        return []
    try:
        return _read_nvml(pynvml, pci_devices)
    except pynvml.NVMLError as exc:
        log.warning("no NVIDIA GPU registered: NVML failed while reading the GPUs (%s)", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def _read_nvml(pynvml: Any, pci_devices: Path) -> list[HostGPU]:
    count = min(int(pynvml.nvmlDeviceGetCount()), MAX_GPUS)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    buses = [_text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    index_of_bus = {bus[-12:]: i for i, bus in enumerate(buses)}
    out = []
    for i, handle in enumerate(handles):
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
        peers = set()
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except pynvml.NVMLError:
                break  # no more links (or no NVLink at all)
            peer = index_of_bus.get(remote.lower()[-12:])
            if peer is not None and peer != i:
                peers.add(peer)
        # GPUs under one PCIe switch: their closest common ancestor is a switch (PIX, PXB)
        switch = min(
            (
                j
                for j, other in enumerate(handles)
                if j == i or _common_level(pynvml, handle, other) <= pynvml.NVML_TOPOLOGY_MULTIPLE
            ),
            default=i,
        )
        out.append(
            HostGPU(
                index=i,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                model=model_of(_text(pynvml.nvmlDeviceGetName(handle)), memory),
                numa_node=_numa_node(buses[i], pci_devices),
                pci_bus_id=buses[i],
                pcie_switch=f"pcie{switch}",
                nvlink_peers=tuple(sorted(peers)),
            )
        )
    return out


def _common_level(pynvml: Any, a: Any, b: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except pynvml.NVMLError:
        return 1 << 30  # unknown: not one switch


def _numa_node(bus_id: str, pci_devices: Path = PCI_DEVICES) -> int:
    """The NUMA node of a PCI device, from sysfs (-1 there, or unreadable: 0)."""
    path = pci_devices / bus_id.lower()[-12:]
    try:
        return max(int(path.joinpath("numa_node").read_text().strip()), 0)
    except (OSError, ValueError):
        return 0


def host_gpus(gpu_file: Path | None) -> list[HostGPU]:
    """The file's GPUs when a file is given, else NVML's."""
    return gpus_from_file(gpu_file) if gpu_file is not None else gpus_from_nvml()


def nvlink_domains(gpus: list[HostGPU]) -> dict[int, int]:
    """Each GPU's NVLink domain, as the lowest index among the GPUs it reaches by NVLink
    (itself alone: its own index)."""
    parent = {g.index: g.index for g in gpus}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer in parent:
                a, b = sorted((root(gpu.index), root(peer)))
                parent[b] = a
    return {i: root(i) for i in parent}


def node_manifest(
    name: str, gpus: list[HostGPU], *, reserve_mib: int = MEMORY_RESERVE_MIB
) -> dict[str, Any]:
    """The v1 Node this host is: its CPUs, its memory less `reserve_mib`, its GPUs."""
    cpus = os.cpu_count() or 1
    total_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    capacity: dict[str, Any] = {
        "cpu": str(cpus),
        "memory": f"{max(total_mib - reserve_mib, 512)}Mi",
    }
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if gpus:
        domains = nvlink_domains(gpus)
        linked = {d for d in domains.values() if list(domains.values()).count(d) > 1}
        capacity[GPU] = str(len(gpus))
        labels[LABEL_GPU_MODEL] = gpus[0].model
        annotations["tessera.io/numa-nodes"] = str(max(g.numa_node for g in gpus) + 1)
        annotations["tessera.io/gpu-topology"] = json.dumps(
            [
                {
                    "index": g.index,
                    "model": g.model,
                    "uuid": g.uuid,
                    "numaNode": g.numa_node,
                    "pcieSwitch": f"{name}-{g.pcie_switch}"[:63] if g.pcie_switch else "",
                    "nvlinkDomain": f"{name}-nvl{domains[g.index]}"[:127]
                    if domains[g.index] in linked
                    else "",
                }
                for g in sorted(gpus, key=lambda g: g.index)
            ],
            separators=(",", ":"),
        )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {"capacity": capacity},
    }
