"""Request bodies: JSON or YAML objects, and the three PATCH formats kubectl sends."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import yaml

from app.errors import BadRequest, Conflict, TooLarge, UnsupportedMediaType

JSON_TYPES = ("application/json", "application/vnd.kubernetes.protobuf")
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH, APPLY_PATCH)

# Lists Kubernetes merges by a key in strategic merge patches.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "imagePullSecrets": "name",
}


def media_type(content_type: str | None) -> str:
    return (content_type or "application/json").split(";", 1)[0].strip().lower()


MAX_BODY_BYTES = 3 * 1024 * 1024  # as Kubernetes limits one object


def decode(body: bytes, content_type: str | None) -> Any:
    """Parse a JSON or YAML document; 400 with the parser's words when it is malformed."""
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge(
            f"the request body is {len(body)} bytes; an object may be at most {MAX_BODY_BYTES} bytes"
        )
    kind = media_type(content_type)
    if not body.strip():
        raise BadRequest("the request body is empty: send a JSON or YAML object")
    if kind in YAML_TYPES or kind == APPLY_PATCH:
        try:
            return yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise BadRequest(f"the request body is not valid YAML: {exc}") from exc
    if kind in JSON_TYPES or kind in PATCH_TYPES or kind == "text/plain" or kind.endswith("+json"):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            # kubectl always sends JSON; people with curl sometimes send YAML as JSON.
            try:
                document = yaml.safe_load(body)
            except yaml.YAMLError:
                raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
            if isinstance(document, dict):
                return document
            raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    raise UnsupportedMediaType(
        f'the body of the request was in an unknown format "{kind}": send application/json '
        "or application/yaml"
    )


def decode_object(body: bytes, content_type: str | None) -> dict[str, Any]:
    document = decode(body, content_type)
    if not isinstance(document, dict):
        raise BadRequest(
            f"the request body must be an object, got {type(document).__name__}: "
            "send one Kubernetes object (apiVersion, kind, metadata, spec)"
        )
    return document


def apply_patch(current: dict[str, Any], patch: Any, patch_type: str) -> dict[str, Any]:
    if patch_type == JSON_PATCH:
        return json_patch(current, patch)
    if not isinstance(patch, dict):
        raise BadRequest("a merge patch must be a JSON object")
    if patch_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge(current, patch)
    if patch_type == MERGE_PATCH:
        return merge_patch(current, patch)
    raise UnsupportedMediaType(
        f'the patch type "{patch_type}" is not supported: use {MERGE_PATCH}, '
        f"{STRATEGIC_MERGE_PATCH} or {JSON_PATCH}"
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any, key: str = "") -> Any:
    """Kubernetes' strategic merge patch, for the fields Tessera stores.

    Like a merge patch, except that lists of named things (containers, env, ...) merge element by
    element on their key. Directives (`$patch`, `$setElementOrder/...`, `$retainKeys`) are honoured
    for `$patch: delete|replace` and otherwise ignored.
    """
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
        result = dict(target) if isinstance(target, dict) else {}
        for k, value in patch.items():
            if k.startswith("$"):
                continue
            if value is None:
                result.pop(k, None)
            else:
                result[k] = strategic_merge(result.get(k), value, k)
        return result
    if isinstance(patch, list) and key in _MERGE_KEYS and isinstance(target, list):
        merge_key = _MERGE_KEYS[key]
        merged = [copy.deepcopy(item) for item in target]
        index = {item.get(merge_key): i for i, item in enumerate(merged) if isinstance(item, dict)}
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                return copy.deepcopy(patch)
            position = index.get(item[merge_key])
            if item.get("$patch") == "delete":
                if position is not None:
                    merged[position] = None
                continue
            if position is None:
                merged.append(strategic_merge(None, item))
                index[item[merge_key]] = len(merged) - 1
            else:
                merged[position] = strategic_merge(merged[position], item)
        return [item for item in merged if item is not None]
    return copy.deepcopy(patch)


def json_patch(document: dict[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 (add, remove, replace, move, copy, test)."""
    if not isinstance(operations, list):
        raise BadRequest("a JSON patch must be a list of operations")
    result: Any = copy.deepcopy(document)
    for number, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise BadRequest(f"JSON patch operation {number} needs 'op' and 'path'")
        kind, path = op["op"], _pointer(op["path"])
        if kind == "test":
            if _get(result, path) != op.get("value"):
                raise Conflict(f"JSON patch test failed at {op['path']}")
        elif kind == "remove":
            _remove(result, path)
        elif kind in ("add", "replace"):
            if "value" not in op:
                raise BadRequest(f"JSON patch operation {number} ({kind}) needs 'value'")
            if kind == "replace":
                _remove(result, path)
            result = _add(result, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(result, source))
            if kind == "move":
                _remove(result, source)
            result = _add(result, path, value)
        else:
            raise BadRequest(f"JSON patch operation {number}: unknown op {kind!r}")
    if not isinstance(result, dict):
        raise BadRequest("a JSON patch must leave an object")
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise BadRequest(f"invalid JSON pointer {path!r}: must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _get(document: Any, path: list[str]) -> Any:
    node = document
    for part in path:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise BadRequest(f"JSON patch path /{'/'.join(path)} does not exist") from exc
    return node


def _remove(document: Any, path: list[str]) -> None:
    if not path:
        raise BadRequest("JSON patch cannot remove the whole document")
    parent = _get(document, path[:-1])
    try:
        if isinstance(parent, list):
            del parent[int(path[-1])]
        else:
            del parent[path[-1]]
    except (KeyError, IndexError, ValueError) as exc:
        raise BadRequest(f"JSON patch path /{'/'.join(path)} does not exist") from exc


def _add(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(document, path[:-1])
    last = path[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                parent.insert(int(last), value)
            except ValueError as exc:
                raise BadRequest(f"JSON patch index {last!r} is not a number") from exc
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise BadRequest(f"JSON patch path /{'/'.join(path)} does not exist")
    return document


def section(document: dict[str, Any], key: str) -> dict[str, Any]:
    """`document[key]` as an object ({} when absent); 400 when it is something else."""
    value = document.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{key} must be an object, got {type(value).__name__}")
    return value


def patch_type_of(content_type: str | None) -> str:
    """The PATCH format named by Content-Type; 415 naming the accepted ones otherwise."""
    kind = media_type(content_type)
    if kind not in PATCH_TYPES:
        raise UnsupportedMediaType(
            f'the body of the request was in an unknown format "{kind}": send '
            f"{', '.join(PATCH_TYPES)}"
        )
    return kind
