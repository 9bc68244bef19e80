"""v1 ConfigMap: configuration as text (`data`) or bytes (`binaryData`), at most 1 MiB."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from app.errors import Cause
from app.kube.meta import KubeModel, ListMeta, ObjectMeta
from app.kube.tables import Column, age
from app.registry.kinds.data import decoded, immutable_causes, key_causes, size_cause
from app.registry.strategy import Obj, Strategy


class ConfigMap(KubeModel):
    """Configuration a pod reads as environment variables or files."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["ConfigMap"] | None = "ConfigMap"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    data: dict[str, str] | None = Field(default=None, description="Text values by key.")
    binary_data: dict[str, str] | None = Field(
        default=None, description="Byte values by key, in base64."
    )
    immutable: bool | None = Field(
        default=None, description="true: the data can no longer change (nor this flag)."
    )


class ConfigMapList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["ConfigMapList"] = "ConfigMapList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[ConfigMap]


def _row(obj: Obj) -> list[Any]:
    count = len(obj.get("data") or {}) + len(obj.get("binaryData") or {})
    return [obj["metadata"]["name"], count, age(obj["metadata"].get("creationTimestamp"))]


class ConfigMapStrategy(Strategy):
    kind = "ConfigMap"
    resource = "configmaps"
    singular = "configmap"
    model = ConfigMap
    list_model = ConfigMapList
    short_names = ("cm",)
    summary = "configuration as text or bytes, at most 1 MiB"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the ConfigMap.", 0),
        ("Data", "integer", "Number of keys.", 0),
        ("Age", "string", "Time since creation.", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        return _row(obj)

    def validate(self, obj: Obj) -> list[Cause]:
        data: dict[str, str] = obj.get("data") or {}
        binary: dict[str, str] = obj.get("binaryData") or {}
        causes = key_causes(list(data), "data") + key_causes(list(binary), "binaryData")
        for key in sorted(data.keys() & binary.keys()):
            causes.append(
                Cause(f"data[{key[:64]}]", "Invalid value: duplicate of key present in binaryData")
            )
        total = sum(len(k) + len(v.encode()) for k, v in data.items())
        for key, value in binary.items():
            total += len(key) + len(decoded(value, f"binaryData[{key[:64]}]", causes))
        return causes + size_cause(total, "ConfigMap")

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        return immutable_causes(obj, old, ("data", "binaryData"))
