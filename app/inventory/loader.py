"""`tessera inventory load FILE`: an inventory description (YAML) or an openb node list (CSV).

The YAML describes the pool by topology, with node classes defined once:

    gpuModels:            # optional: models beyond app/inventory/gpu_models.yaml
      B200: {memory: 180Gi, smCount: 148}
    nodeClasses:
      h200x8:
        cpu: 192
        memory: 2048Gi
        gpus: {model: H200, count: 8, nvlinkDomainSize: 8, numaNodes: 2}
      cpu96:
        cpu: 96
        memory: 384Gi
        computeClasses: [general-purpose, performance]
    regions:
      - name: eu-west
        zones:
          - name: eu-west-a
            racks:
              - {count: 4, prefix: gpu, nodes: {h200x8: 8}}   # 4 racks of 8 such nodes
              - {name: cpu1, nodes: {cpu96: 16}}

Node names are `<zone>-<rack>-<class>-<n>`; each GPU is `<node>-gpu<index>`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.orm import Session

from app.db.models import Node
from app.inventory import service
from app.inventory.service import GPUSpec, NodeSpec, default_gpu_layout
from app.kube.quantity import parse_quantity, to_mib, to_milli


class InventoryError(ValueError):
    pass


@dataclass(frozen=True)
class LoadResult:
    nodes_created: int
    nodes_skipped: int
    gpus_created: int


def read_file(path: Path) -> tuple[dict[str, tuple[int, int]], list[NodeSpec]]:
    """Parse an inventory file into GPU models and nodes (nothing is written)."""
    text = path.read_text()
    first_line = text.split("\n", 1)[0]
    if path.suffix == ".csv" or first_line.startswith("sn,"):
        return {}, list(_openb_nodes(path))
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise InventoryError(f"{path}: expected a mapping with nodeClasses and regions")
    return _models(document), list(_yaml_nodes(document, str(path)))


def load(session: Session, path: Path, *, replace: bool = False) -> LoadResult:
    """Register every node of the file; nodes that already exist are left as they are."""
    models, nodes = read_file(path)
    known = {**service.builtin_models(), **models}
    used = {g.model for n in nodes for g in n.gpus}
    missing = sorted(used - known.keys())
    if missing:
        raise InventoryError(
            f"{path}: unknown GPU model(s) {', '.join(missing)}: add them under gpuModels "
            "(e.g. gpuModels: {B200: {memory: 180Gi, smCount: 148}})"
        )
    service.ensure_models(session, {m: known[m] for m in used})
    existing = {name for (name,) in session.query(Node.name)}
    created = skipped = gpus = 0
    for node in nodes:
        if node.name in existing:
            skipped += 1
            continue
        service.create_node(session, node)
        created += 1
        gpus += len(node.gpus)
    return LoadResult(created, skipped, gpus)


def _models(document: dict[str, Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for name, spec in (document.get("gpuModels") or {}).items():
        try:
            out[str(name)] = (to_mib(parse_quantity(spec["memory"])), int(spec["smCount"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InventoryError(f"gpuModels.{name}: give memory (e.g. 80Gi) and smCount") from exc
    return out


def _yaml_nodes(document: dict[str, Any], where: str) -> Iterator[NodeSpec]:
    classes = document.get("nodeClasses") or {}
    if not isinstance(classes, dict) or not classes:
        raise InventoryError(f"{where}: nodeClasses is missing or empty")
    for region in document.get("regions") or []:
        region_name = str(region.get("name", ""))
        for zone in region.get("zones") or []:
            zone_name = str(zone["name"])
            for rack_name, rack_nodes in _racks(zone.get("racks") or [], zone_name):
                for class_name, count in rack_nodes.items():
                    node_class = classes.get(class_name)
                    if node_class is None:
                        raise InventoryError(
                            f"{where}: rack {rack_name} uses unknown node class {class_name!r}"
                        )
                    for i in range(int(count)):
                        name = f"{zone_name}-{rack_name}-{class_name}-{i + 1:02d}"
                        yield _node(name, node_class, region_name, zone_name, rack_name)


def _racks(racks: list[dict[str, Any]], zone: str) -> Iterator[tuple[str, dict[str, int]]]:
    for i, rack in enumerate(racks):
        if "count" in rack:
            prefix = rack.get("prefix", "r")
            for j in range(int(rack["count"])):
                yield f"{prefix}{j + 1}", rack["nodes"]
        else:
            yield str(rack.get("name", f"r{i + 1}")), rack["nodes"]


def _node(name: str, spec: dict[str, Any], region: str, zone: str, rack: str) -> NodeSpec:
    gpus: tuple[GPUSpec, ...] = ()
    numa_nodes = int(spec.get("numaNodes", 1))
    if spec.get("gpus"):
        g = spec["gpus"]
        numa_nodes = int(g.get("numaNodes", spec.get("numaNodes", 2)))
        gpus = default_gpu_layout(
            name,
            int(g["count"]),
            str(g["model"]),
            numa_nodes=numa_nodes,
            nvlink_domain_size=int(g.get("nvlinkDomainSize", g["count"])),
            gpus_per_switch=int(g.get("gpusPerSwitch", 2)),
        )
    cpu = to_milli(parse_quantity(spec["cpu"]))
    memory = to_mib(parse_quantity(spec["memory"]))
    return NodeSpec(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        cpu_allocatable_milli=to_milli(parse_quantity(spec["allocatableCpu"]))
        if "allocatableCpu" in spec
        else None,
        memory_allocatable_mib=to_mib(parse_quantity(spec["allocatableMemory"]))
        if "allocatableMemory" in spec
        else None,
        region=region,
        zone=zone,
        rack=rack,
        compute_classes=tuple(spec.get("computeClasses") or ()),
        numa_nodes=numa_nodes,
        gpus=gpus,
    )


def _openb_nodes(path: Path, nodes_per_rack: int = 16) -> Iterator[NodeSpec]:
    """The openb node list (`sn, cpu_milli, memory_mib, gpu, model`): one zone, racks of 16."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        required = {"sn", "cpu_milli", "memory_mib", "gpu", "model"}
        if not required <= set(reader.fieldnames or ()):
            raise InventoryError(f"{path}: expected the columns {', '.join(sorted(required))}")
        for i, row in enumerate(reader):
            count = int(row["gpu"])
            model = row["model"].strip()
            name = row["sn"].strip()
            yield NodeSpec(
                name=name,
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                region="openb",
                zone="openb-a",
                rack=f"r{i // nodes_per_rack + 1:03d}",
                compute_classes=("gpu",) if count else ("general-purpose", "performance"),
                numa_nodes=2 if count >= 4 else 1,
                gpus=default_gpu_layout(name, count, model) if count and model else (),
            )
