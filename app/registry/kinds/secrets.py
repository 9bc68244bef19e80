"""v1 Secret: values a pod needs and nobody should read by accident.

`data` (base64) and `stringData` (text, merged into `data` on write and never stored or shown)
hold at most 1 MiB. At rest the whole data map is sealed (AES-GCM, app/registry/crypto.py): the
database and the change log hold `sealedData`, never a value. Types as Kubernetes checks them:
Opaque (anything), `kubernetes.io/dockerconfigjson` (a `.dockerconfigjson` key holding JSON),
`kubernetes.io/dockercfg`, `kubernetes.io/tls` (`tls.crt` and `tls.key`),
`kubernetes.io/basic-auth`, `kubernetes.io/ssh-auth`; a Secret's type never changes.
"""

from __future__ import annotations

import base64
from typing import Any, ClassVar, Literal

import orjson
from pydantic import Field

from app.errors import Cause
from app.kube.meta import KubeModel, ListMeta, ObjectMeta
from app.kube.tables import Column, age
from app.registry.kinds.data import decoded, immutable_causes, key_causes, size_cause
from app.registry.strategy import Keyring, Obj, Strategy

OPAQUE = "Opaque"
DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"
DOCKER_CFG = "kubernetes.io/dockercfg"
TLS = "kubernetes.io/tls"
BASIC_AUTH = "kubernetes.io/basic-auth"
SSH_AUTH = "kubernetes.io/ssh-auth"
# The keys each type must hold.
REQUIRED_KEYS = {
    DOCKER_CONFIG_JSON: (".dockerconfigjson",),
    DOCKER_CFG: (".dockercfg",),
    TLS: ("tls.crt", "tls.key"),
    SSH_AUTH: ("ssh-privatekey",),
}
JSON_KEYS = {DOCKER_CONFIG_JSON: ".dockerconfigjson", DOCKER_CFG: ".dockercfg"}
SEALED = "sealedData"


class Secret(KubeModel):
    """Values a pod reads as environment variables or files, sealed at rest."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["Secret"] | None = "Secret"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    data: dict[str, str] | None = Field(default=None, description="Values by key, in base64.")
    string_data: dict[str, str] | None = Field(
        default=None, description="Values by key as text; written into data, never shown."
    )
    type: str | None = Field(default=None, max_length=253, description="Opaque by default.")
    immutable: bool | None = Field(
        default=None, description="true: the data can no longer change (nor this flag)."
    )


class SecretList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["SecretList"] = "SecretList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Secret]


def _row(obj: Obj) -> list[Any]:
    return [
        obj["metadata"]["name"],
        obj.get("type") or OPAQUE,
        len(obj.get("data") or {}),
        age(obj["metadata"].get("creationTimestamp")),
    ]


class SecretStrategy(Strategy):
    kind = "Secret"
    resource = "secrets"
    singular = "secret"
    model = Secret
    list_model = SecretList
    field_selectors = ("metadata.name", "metadata.namespace", "type")
    summary = "values sealed at rest (AES-GCM), at most 1 MiB"
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the Secret.", 0),
        ("Type", "string", "The type of the Secret.", 0),
        ("Data", "integer", "Number of keys.", 0),
        ("Age", "string", "Time since creation.", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        return _row(obj)

    def prepare_create(self, obj: Obj) -> None:
        _fold_string_data(obj)
        obj.setdefault("type", OPAQUE)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        _fold_string_data(obj)
        if not obj.get("type"):
            obj["type"] = old.get("type") or OPAQUE

    def validate(self, obj: Obj) -> list[Cause]:
        data: dict[str, str] = obj.get("data") or {}
        causes = key_causes(list(data), "data")
        values = {key: decoded(value, f"data[{key[:64]}]", causes) for key, value in data.items()}
        kind = obj.get("type") or OPAQUE
        for key in REQUIRED_KEYS.get(kind, ()):
            if key not in data:
                causes.append(Cause(f"data[{key}]", f"Required value: a {kind} Secret holds {key}"))
        json_key = JSON_KEYS.get(kind)
        if json_key in values:
            try:
                orjson.loads(values[json_key])
            except orjson.JSONDecodeError:
                causes.append(
                    Cause(f"data[{json_key}]", "Invalid value: <value omitted>: not valid JSON")
                )
        if kind == BASIC_AUTH and not ({"username", "password"} & data.keys()):
            causes.append(
                Cause("data", "Required value: a basic-auth Secret holds username or password")
            )
        total = sum(len(k) + len(v) for k, v in values.items())
        return causes + size_cause(total, "Secret")

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        causes = immutable_causes(obj, old, ("data",))
        if (obj.get("type") or OPAQUE) != (old.get("type") or OPAQUE):
            causes.append(Cause("type", f'Invalid value: "{obj.get("type")}": field is immutable'))
        return causes

    def to_storage(self, obj: Obj, keyring: Keyring | None) -> Obj:
        data = obj.get("data")
        stored = {k: v for k, v in obj.items() if k != "data"}
        if data:
            if keyring is None:
                raise RuntimeError("a Secret's data is written only with a keyring")
            stored[SEALED] = keyring.encrypt(orjson.dumps(data))
        return stored

    def from_storage(self, obj: Obj, keyring: Keyring | None) -> Obj:
        sealed = obj.get(SEALED)
        if sealed is None:
            return obj
        opened = {k: v for k, v in obj.items() if k != SEALED}
        if keyring is None:
            return opened  # no keyring where the values are not needed (a cascade)
        opened["data"] = orjson.loads(keyring.decrypt(sealed))
        return _ordered(opened)


def _fold_string_data(obj: Obj) -> None:
    """stringData's values go into data (they win over data's), as Kubernetes writes them."""
    text = obj.pop("stringData", None)
    if text:
        data = dict(obj.get("data") or {})
        data.update({k: base64.b64encode(v.encode()).decode() for k, v in text.items()})
        obj["data"] = data


def _ordered(obj: Obj) -> Obj:
    """apiVersion, kind, metadata, then the rest (as Kubernetes prints a Secret)."""
    head = ("apiVersion", "kind", "metadata", "data", "type", "immutable")
    return {
        **{k: obj[k] for k in head if k in obj},
        **{k: v for k, v in obj.items() if k not in head},
    }
