"""Load the Alibaba openb trace (cluster-trace-gpu-v2023) into numpy tables.

The trace is two kinds of CSV files:

- ``openb_node_list_gpu_node.csv``: one row per node (``sn, cpu_milli, memory_mib, gpu, model``);
- ``openb_pod_list_<workload>.csv``: one row per pod (``name, cpu_milli, memory_mib, num_gpu,
  gpu_milli[, gpu_spec, ...]``).

The conversions are the ones the paper's simulator applies when it turns the CSV rows into
Kubernetes objects: ``gpu_milli`` is clamped to 1000, a pod with ``num_gpu == 0`` asks for no GPU at
all (whatever its ``gpu_milli`` column says), and ``gpu_spec`` is a ``|``-separated list of allowed
GPU models (empty entries dropped; empty list = any model).

Every GPU request is kept as two per-GPU numbers, ``vram`` and ``sm`` (thousandths of one GPU's
memory and of its streaming multiprocessors). The trace itself is one-dimensional, so both are
``gpu_milli``; the 2-D variant (:mod:`bench.openb.variant2d`) makes them differ.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_{workload}.csv"
MILLI = 1000
MAX_GPUS_PER_NODE = 8

#: The 17 workloads of the paper's evaluation (Figures 9 and 11-14).
PAPER_WORKLOADS: tuple[str, ...] = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)

TRACE_SOURCE = (
    "the public repository alibaba/clusterdata, folder cluster-trace-gpu-v2023 "
    "(https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023)"
)


class TraceNotFound(FileNotFoundError):
    """The trace directory or one of its files is missing."""


@dataclass(frozen=True)
class Cluster:
    """The nodes of the replay, as parallel arrays (one entry per node)."""

    names: tuple[str, ...]
    cpu: NDArray[np.int64]  # milli-CPU
    mem: NDArray[np.int64]  # MiB
    n_gpu: NDArray[np.int64]  # GPUs on the node (0..8)
    model: NDArray[np.int64]  # index into `models`
    models: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return int(self.n_gpu.sum())


@dataclass(frozen=True)
class Pods:
    """A workload's pods, as parallel arrays (one entry per pod).

    ``vram``/``sm`` are per GPU, in thousandths of one GPU (0 for CPU-only pods);
    ``spec_mask`` has bit ``i`` set when the pod may run on ``Cluster.models[i]``.
    ``spec`` is the normalised ``gpu_spec`` text (part of the paper's "typical pod" key).
    """

    names: tuple[str, ...]
    cpu: NDArray[np.int64]
    mem: NDArray[np.int64]
    num_gpu: NDArray[np.int64]
    vram: NDArray[np.int64]
    sm: NDArray[np.int64]
    spec: tuple[str, ...]
    spec_mask: NDArray[np.int64]

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def milli(self) -> NDArray[np.int64]:
        """The 1-D share of one GPU a pod books: its larger dimension."""
        return np.maximum(self.vram, self.sm)

    def gpu_demand(self) -> NDArray[np.float64]:
        """GPU demand of each pod in GPU-milli: mean of the two dimensions times the count."""
        return (self.vram + self.sm) / 2.0 * self.num_gpu

    def take(self, index: NDArray[np.int64]) -> Pods:
        """The pods at `index` (repetitions allowed), in that order."""
        return Pods(
            names=tuple(self.names[i] for i in index),
            cpu=self.cpu[index],
            mem=self.mem[index],
            num_gpu=self.num_gpu[index],
            vram=self.vram[index],
            sm=self.sm[index],
            spec=tuple(self.spec[i] for i in index),
            spec_mask=self.spec_mask[index],
        )


def _read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise TraceNotFound(f"{path} not found; the openb trace comes from {TRACE_SOURCE}")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def check_trace_dir(trace_dir: Path) -> Path:
    """`trace_dir` if it holds the node list, else `TraceNotFound` saying where to get the trace."""
    if not (trace_dir / NODE_FILE).is_file():
        raise TraceNotFound(
            f"no openb trace in {trace_dir} ({NODE_FILE} missing). Download it from {TRACE_SOURCE} "
            "(files openb_node_list_gpu_node.csv and openb_pod_list_*.csv) and pass --trace-dir."
        )
    return trace_dir


def load_cluster(trace_dir: Path) -> Cluster:
    """The GPU nodes of the trace, in file order."""
    rows = _read_rows(trace_dir / NODE_FILE)
    models = tuple(sorted({r["model"] for r in rows if r["model"]}))
    index = {m: i for i, m in enumerate(models)}
    return Cluster(
        names=tuple(r["sn"] for r in rows),
        cpu=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        mem=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        n_gpu=np.array([int(r["gpu"]) for r in rows], dtype=np.int64),
        model=np.array([index.get(r["model"], -1) for r in rows], dtype=np.int64),
        models=models,
    )


def normalise_spec(raw: str) -> str:
    """``"A||B"`` -> ``"A|B"``: the model list as the simulator stores it (order kept)."""
    return "|".join(x for x in raw.split("|") if x)


def spec_mask(spec: str, models: tuple[str, ...]) -> int:
    """Bit mask of the models a ``gpu_spec`` allows (all models when the spec is empty)."""
    if not spec:
        return (1 << len(models)) - 1
    allowed = set(spec.split("|"))
    return sum(1 << i for i, m in enumerate(models) if m in allowed)


def pods_from_rows(rows: list[dict[str, str]], models: tuple[str, ...]) -> Pods:
    """Convert CSV rows (as dicts) into a `Pods` table."""
    num = np.array([int(r["num_gpu"]) for r in rows], dtype=np.int64)
    milli = np.array([min(int(r["gpu_milli"]), MILLI) for r in rows], dtype=np.int64)
    milli = np.where(num > 0, milli, 0)
    specs = tuple(
        normalise_spec(r.get("gpu_spec") or "") if n > 0 else ""
        for r, n in zip(rows, num, strict=True)
    )
    return Pods(
        names=tuple(r["name"] for r in rows),
        cpu=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        mem=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        num_gpu=num,
        vram=milli.copy(),
        sm=milli.copy(),
        spec=specs,
        spec_mask=np.array([spec_mask(s, models) for s in specs], dtype=np.int64),
    )


def load_pods(trace_dir: Path, workload: str, models: tuple[str, ...]) -> Pods:
    """The pods of one workload file (``openb_pod_list_<workload>.csv``), in file order."""
    return pods_from_rows(_read_rows(trace_dir / POD_FILE.format(workload=workload)), models)


def available_workloads(trace_dir: Path) -> list[str]:
    """Workload names present in `trace_dir`."""
    prefix, suffix = POD_FILE.split("{workload}")
    return sorted(p.name[len(prefix) : -len(suffix)] for p in trace_dir.glob(prefix + "*" + suffix))
