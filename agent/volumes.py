"""What a pod takes from ConfigMaps and Secrets, as the kubelet gives it: environment variables
(`env[].valueFrom.configMapKeyRef/secretKeyRef`, `envFrom`), files (volumes `configMap`,
`secret`) and registry credentials (`imagePullSecrets` of type kubernetes.io/dockerconfigjson).

The agent reads each through the API with its node token (the API lets a node read only those
of the pods bound to it). A reference that is missing (the object, or its key) and not marked
`optional` keeps the container waiting with reason CreateContainerConfigError, in the
kubelet's words, and the agent tries again."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Awaitable, Callable
from typing import Any

CONFIGMAPS, SECRETS = "configmaps", "secrets"
KIND = {CONFIGMAPS: "ConfigMap", SECRETS: "Secret"}
SINGULAR = {CONFIGMAPS: "configmap", SECRETS: "secret"}
Fetch = Callable[[str, str], Awaitable[dict[str, Any] | None]]  # (resource, name) -> object


class ConfigError(Exception):
    """A container cannot be made as its spec says (CreateContainerConfigError)."""


def values_of(resource: str, obj: dict[str, Any]) -> dict[str, bytes]:
    """The object's values by key, as bytes."""
    out: dict[str, bytes] = {}
    if resource == CONFIGMAPS:
        for key, text in (obj.get("data") or {}).items():
            out[key] = str(text).encode()
        for key, encoded in (obj.get("binaryData") or {}).items():
            out[key] = base64.b64decode(str(encoded))
    else:
        for key, encoded in (obj.get("data") or {}).items():
            out[key] = base64.b64decode(str(encoded))
    return out


async def _values(
    fetch: Fetch, namespace: str, resource: str, name: str, optional: bool
) -> dict[str, bytes] | None:
    obj = await fetch(resource, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{SINGULAR[resource]} "{name}" not found')
    return values_of(resource, obj)


async def environment_refs(
    fetch: Fetch, namespace: str, container: dict[str, Any]
) -> dict[str, str]:
    """The values a container's env and envFrom take from ConfigMaps and Secrets, by
    "configMap/NAME/KEY" and "secret/NAME/KEY" (what `agent.docker.environment` reads)."""
    out: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for kind, resource, key in (
            ("configMapRef", CONFIGMAPS, "configMap"),
            ("secretRef", SECRETS, "secret"),
        ):
            ref = source.get(kind)
            if not ref:
                continue
            name = str(ref.get("name") or "")
            values = await _values(fetch, namespace, resource, name, bool(ref.get("optional")))
            for item, value in (values or {}).items():
                out[f"{key}/{name}/{item}"] = value.decode("utf-8", "replace")
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        for kind, resource, key in (
            ("configMapKeyRef", CONFIGMAPS, "configMap"),
            ("secretKeyRef", SECRETS, "secret"),
        ):
            ref = source.get(kind)
            if not ref:
                continue
            name, wanted = str(ref.get("name") or ""), str(ref.get("key") or "")
            optional = bool(ref.get("optional"))
            values = await _values(fetch, namespace, resource, name, optional)
            if values is None:
                continue
            if wanted not in values:
                if optional:
                    continue
                raise ConfigError(
                    f"couldn't find key {wanted} in {KIND[resource]} {namespace}/{name}"
                )
            out[f"{key}/{name}/{wanted}"] = values[wanted].decode("utf-8", "replace")
    return out


async def files_of(
    fetch: Fetch, namespace: str, volume: dict[str, Any]
) -> dict[str, tuple[bytes, int]] | None:
    """A configMap or secret volume's files (path -> (content, mode)); None for another kind
    of volume (or an optional one whose object is missing: an empty directory)."""
    if volume.get("configMap") is not None:
        source, resource, name = volume["configMap"], CONFIGMAPS, volume["configMap"].get("name")
    elif volume.get("secret") is not None:
        source, resource, name = volume["secret"], SECRETS, volume["secret"].get("secretName")
    else:
        return None
    values = await _values(
        fetch, namespace, resource, str(name or ""), bool(source.get("optional"))
    )
    if values is None:
        return {}
    mode = int(source.get("defaultMode") or 0o644) & 0o777
    items = source.get("items")
    if not items:
        return {key: (value, mode) for key, value in values.items()}
    out: dict[str, tuple[bytes, int]] = {}
    for item in items:
        key = str(item.get("key") or "")
        if key not in values:
            if source.get("optional"):
                continue
            raise ConfigError(f"couldn't find key {key} in {KIND[resource]} {namespace}/{name}")
        path = str(item.get("path") or key)
        if path.startswith("/") or ".." in path.split("/"):
            raise ConfigError(f'volume "{volume.get("name")}": path "{path}" must be relative')
        out[path] = (values[key], int(item.get("mode") or mode) & 0o777)
    return out


def tar_of(files: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        made: set[str] = set()
        for path, (content, mode) in sorted(files.items()):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in made:
                    entry = tarfile.TarInfo(folder)
                    entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(entry)
                    made.add(folder)
            entry = tarfile.TarInfo(path)
            entry.size, entry.mode = len(content), mode
            tar.addfile(entry, io.BytesIO(content))
    return out.getvalue()


def registry_of(image: str) -> str:
    """The registry an image reference names (docker.io when it names none)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _registry_key(key: str) -> str:
    key = key.split("://", 1)[-1].split("/", 1)[0]
    return "docker.io" if key in ("index.docker.io", "registry-1.docker.io") else key


async def pull_auth(fetch: Fetch, pod: dict[str, Any], image: str) -> dict[str, str] | None:
    """Credentials for `image` from the pod's imagePullSecrets (the first that has its
    registry), or None."""
    wanted = registry_of(image)
    for ref in pod["spec"].get("imagePullSecrets") or []:
        obj = await fetch(SECRETS, str(ref.get("name") or ""))
        if obj is None:
            continue
        values = values_of(SECRETS, obj)
        raw = values.get(".dockerconfigjson") or values.get(".dockercfg")
        if raw is None:
            continue
        try:
            config = json.loads(raw)
        except ValueError:
            continue
        auths = config.get("auths", config) if isinstance(config, dict) else {}
        for key, entry in (auths or {}).items():
            if _registry_key(str(key)) != wanted or not isinstance(entry, dict):
                continue
            user, password = entry.get("username"), entry.get("password")
            if not user and entry.get("auth"):
                user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            if user:
                return {"username": str(user), "password": str(password or "")}
    return None
