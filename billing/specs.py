"""The catalogue of sold compute specs and the rounding rule.

A spec is a (vCPU, memory) pair such as `2-4Gi` (2 vCPU, 4 GiB). The table is data
(`spec_table.yaml` next to this file, or `TESSERA_SPEC_TABLE`); this module only expands it and
rounds a demand UP to the nearest spec: the fewest vCPU that can cover the demand, then the least
memory for that vCPU size.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import yaml

DEFAULT_TABLE = Path(__file__).with_name("spec_table.yaml")


@dataclass(frozen=True, order=True)
class ComputeSpec:
    cpu_milli: int
    memory_mib: int

    @property
    def name(self) -> str:
        return (
            f"{_short(Decimal(self.cpu_milli) / 1000)}-{_short(Decimal(self.memory_mib) / 1024)}Gi"
        )

    @classmethod
    def parse(cls, name: str) -> ComputeSpec:
        """`2-4Gi` -> ComputeSpec(2000, 4096)."""
        try:
            cpu, memory = name.split("-", 1)
            if not memory.endswith("Gi"):
                raise ValueError
            return cls(int(Decimal(cpu) * 1000), int(Decimal(memory[:-2]) * 1024))
        except (ValueError, ArithmeticError) as exc:
            raise ValueError(f"{name!r} is not a spec name like '2-4Gi'") from exc


class SpecTableError(ValueError):
    pass


class SpecCatalog:
    """All sold specs, indexed for rounding in O(log n)."""

    def __init__(self, specs: list[ComputeSpec]) -> None:
        if not specs:
            raise SpecTableError("the spec table sells nothing")
        by_cpu: dict[int, list[int]] = {}
        for spec in specs:
            by_cpu.setdefault(spec.cpu_milli, []).append(spec.memory_mib)
        self._cpus = sorted(by_cpu)
        self._memories = [sorted(set(by_cpu[cpu])) for cpu in self._cpus]
        self.specs = sorted(set(specs))

    @property
    def max_cpu_milli(self) -> int:
        return self._cpus[-1]

    @property
    def max_memory_mib(self) -> int:
        return max(m[-1] for m in self._memories)

    def round_up(self, cpu_milli: int, memory_mib: int) -> ComputeSpec | None:
        """The smallest sold spec covering the demand, or None when nothing can."""
        start = bisect.bisect_left(self._cpus, cpu_milli)
        for i in range(start, len(self._cpus)):
            memories = self._memories[i]
            if memories[-1] >= memory_mib:
                j = bisect.bisect_left(memories, memory_mib)
                return ComputeSpec(self._cpus[i], memories[j])
        return None

    def memory_range(self, cpu_milli: int) -> tuple[int, int] | None:
        """(min, max) memory sold with exactly this vCPU size."""
        i = bisect.bisect_left(self._cpus, cpu_milli)
        if i == len(self._cpus) or self._cpus[i] != cpu_milli:
            return None
        return self._memories[i][0], self._memories[i][-1]

    def __contains__(self, spec: object) -> bool:
        if not isinstance(spec, ComputeSpec):
            return False
        r = self.memory_range(spec.cpu_milli)
        if r is None:
            return False
        i = bisect.bisect_left(self._cpus, spec.cpu_milli)
        memories = self._memories[i]
        j = bisect.bisect_left(memories, spec.memory_mib)
        return j < len(memories) and memories[j] == spec.memory_mib


def load_catalog(path: Path | None = None) -> SpecCatalog:
    return _load(str(path or DEFAULT_TABLE))


@cache
def _load(path: str) -> SpecCatalog:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecTableError(f"cannot read the spec table {path}: {exc}") from exc
    families = (document or {}).get("families")
    if not isinstance(families, list):
        raise SpecTableError(f"{path}: expected a top-level 'families' list")
    specs: list[ComputeSpec] = []
    for family in families:
        specs.extend(_expand_family(family, path))
    return SpecCatalog(specs)


def _expand_family(family: dict[str, Any], path: str) -> list[ComputeSpec]:
    name = family.get("name", "?")
    cpus = _values(family.get("cpu"), f"{path}: family {name}: cpu")
    specs = []
    for cpu in cpus:
        cpu_milli = int(cpu * 1000)
        for memory_gib in _memories(family, cpu, f"{path}: family {name}"):
            specs.append(ComputeSpec(cpu_milli, int(memory_gib * 1024)))
    return specs


def _memories(family: dict[str, Any], cpu: Decimal, where: str) -> list[Decimal]:
    if "memory_gib" in family:
        return _values(family["memory_gib"], f"{where}: memory_gib")
    if "memory_per_cpu" in family:
        return [cpu * r for r in _values(family["memory_per_cpu"], f"{where}: memory_per_cpu")]
    if "memory_per_cpu_range" in family:
        spec = family["memory_per_cpu_range"]
        step = Decimal(str(spec.get("step", 1)))
        low = Decimal(math.ceil(cpu * Decimal(str(spec["min"])) / step)) * step
        high = cpu * Decimal(str(spec["max"]))
        out = []
        value = low
        while value <= high:
            out.append(value)
            value += step
        return out
    raise SpecTableError(f"{where}: give memory_gib, memory_per_cpu or memory_per_cpu_range")


def _values(raw: Any, where: str) -> list[Decimal]:
    if isinstance(raw, list):
        return [Decimal(str(v)) for v in raw]
    if isinstance(raw, dict) and {"from", "to", "step"} <= raw.keys():
        start, stop, step = (Decimal(str(raw[k])) for k in ("from", "to", "step"))
        out = []
        value = start
        while value <= stop:
            out.append(value)
            value += step
        return out
    raise SpecTableError(f"{where}: expected a list or {{from, to, step}}")


def _short(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    return text
