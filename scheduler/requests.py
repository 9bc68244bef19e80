"""What users ask for: pods, and gangs of pods placed all together or not at all."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from scheduler.snapshot import TopologyLevel


class Qos(StrEnum):
    """Kubernetes QoS class. At equal priority Guaranteed pods are placed before the others."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


@dataclass(frozen=True)
class GpuSlice:
    """A share of ONE GPU: VRAM (``tessera.io/gpu-memory``) and SM % (``tessera.io/gpu-core``)."""

    vram_mib: int
    sm_pct: int

    def __post_init__(self) -> None:
        if self.vram_mib <= 0:
            raise ValueError("a GPU slice needs tessera.io/gpu-memory > 0")
        if not 1 <= self.sm_pct <= 100:
            raise ValueError("tessera.io/gpu-core must be 1..100")


@dataclass(frozen=True)
class PodRequest:
    """One pod: CPU and memory, and either ``gpus`` whole GPUs or one ``gpu_slice``.

    ``gpu_models`` restricts the GPU model (empty: any). ``compute_class`` restricts the nodes to
    those that serve the class (None: any). ``node_selector`` must match node labels exactly.
    Higher ``priority`` wins capacity first.
    """

    key: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_slice: GpuSlice | None = None
    gpu_models: frozenset[str] = frozenset()
    compute_class: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    qos: Qos = Qos.BURSTABLE
    priority: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpus < 0:
            raise ValueError(f"pod {self.key}: negative request")
        if self.gpus and self.gpu_slice is not None:
            raise ValueError(f"pod {self.key}: ask for whole GPUs or one slice, not both")

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_slice is not None


@dataclass(frozen=True)
class GangRequest:
    """Pods that run together: all members are placed, or none.

    ``required_level``: every member inside one domain of that level (for example one rack).
    ``preferred_level``: the same as a wish; breaking it costs extra in the objective. Gangs never
    span regions. The gang's priority is the highest priority among its members.
    """

    key: str
    members: tuple[PodRequest, ...]
    required_level: TopologyLevel | None = None
    preferred_level: TopologyLevel | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        if not self.members:
            raise ValueError(f"gang {self.key} has no members")
        keys = [m.key for m in self.members]
        if len(set(keys)) != len(keys):
            raise ValueError(f"gang {self.key}: member keys must be unique")

    @property
    def priority(self) -> int:
        return max(m.priority for m in self.members)


Request = PodRequest | GangRequest


def members_of(request: Request) -> tuple[PodRequest, ...]:
    """The pods of a request: the members of a gang, or the pod itself."""
    return request.members if isinstance(request, GangRequest) else (request,)
