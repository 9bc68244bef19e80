"""Request bodies: JSON or YAML objects, and the three PATCH formats kubectl sends."""

from __future__ import annotations

import copy
import math
from typing import Any

import orjson
import yaml

from app.errors import BadRequest, Conflict, TooLarge, UnsupportedMediaType
from app.kube import protobuf

JSON_TYPES = ("application/json",)
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


MAX_BODY_BYTES = 3 * 1024 * 1024  # as Kubernetes limits one object (bytes, and decoded size)
MAX_DEPTH = 100  # nesting of objects and lists in one document
MAX_JSON_PATCH_OPERATIONS = 10_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def decode(body: bytes, content_type: str | None) -> Any:
    """Parse a JSON or YAML document; 400 with the parser's words when it is malformed.

    Every document is bounded the same way whatever its format (`check_document`): its decoded
    size, nesting depth, integers (int64, as Kubernetes) and text (valid Unicode). YAML anchors
    and aliases are refused before anything is built, so a small body cannot expand.
    """
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge(
            f"the request body is {len(body)} bytes; an object may be at most {MAX_BODY_BYTES} bytes"
        )
    kind = media_type(content_type)
    if not body.strip():
        raise BadRequest("the request body is empty: send a JSON or YAML object")
    if kind == protobuf.MEDIA_TYPE:
        return protobuf.decode(body)
    if kind in YAML_TYPES or kind == APPLY_PATCH:
        return check_document(_load_yaml(body))
    if kind in JSON_TYPES or kind in PATCH_TYPES or kind == "text/plain" or kind.endswith("+json"):
        try:
            return check_document(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            # kubectl always sends JSON; people with curl sometimes send YAML as JSON.
            try:
                document = _load_yaml(body)
            except _NotYaml:
                raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
            if isinstance(document, dict):
                return check_document(document)
            raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    raise UnsupportedMediaType(
        f'the body of the request was in an unknown format "{kind}": send application/json '
        f"or application/yaml ({protobuf.MEDIA_TYPE} is read for {protobuf.supported_kinds()})"
    )


_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _load_yaml(body: bytes) -> Any:
    """One YAML document, with no anchors or aliases and at most MAX_DEPTH levels.

    The events are checked first (the parser is iterative, so a deep document cannot exhaust
    the stack), and only a document that passes is built."""
    try:
        depth = 0
        documents = 0
        for event in yaml.parse(body, Loader=_YamlLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise BadRequest(
                    "the request body uses YAML anchors or aliases (&name / *name), which Tessera "
                    "does not accept: write the values out in full"
                )
            if isinstance(event, _OPENING):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep()
            elif isinstance(event, _CLOSING):
                depth -= 1
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise BadRequest(
                        "the request body holds more than one YAML document: send one object"
                    )
        return yaml.load(body, Loader=_YamlLoader)
    except yaml.YAMLError as exc:
        raise _NotYaml(f"the request body is not valid YAML: {exc}") from exc
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. a 5000-digit integer
        raise BadRequest(f"the request body holds a value YAML cannot represent: {exc}") from exc


class _NotYaml(BadRequest):
    """The body does not parse as YAML at all (as opposed to YAML Tessera refuses)."""


def _too_deep() -> BadRequest:
    return BadRequest(
        f"the request body is nested more than {MAX_DEPTH} levels deep: Kubernetes objects "
        "are far shallower; flatten the value"
    )


def check_document(document: Any) -> Any:
    """Refuse a decoded document that is too large, too deep, or holds values Kubernetes
    cannot hold: integers outside int64, non-finite numbers, text that is not valid Unicode
    (a lone surrogate such as "\\ud800"), non-string keys. Returns the document unchanged.

    Iterative (no recursion), and linear in the size of the document."""
    _measure(document, MAX_BODY_BYTES)
    return document


def _measure(document: Any, limit: int) -> int:
    size = 0
    # (value, depth, trail): the trail links to the parent's, so a path is built only on error
    stack: list[tuple[Any, int, _Trail]] = [(document, 1, None)]
    while stack:
        value, depth, trail = stack.pop()
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise _too_deep()
            size += 2
            for key, item in value.items():
                if not isinstance(key, str):
                    raise BadRequest(
                        f"{_path(trail)}: the key {str(key)[:40]!r} is not a string: "
                        "object keys must be strings (quote it)"
                    )
                size += len(key) + 3
                _check_text(key, trail)
                stack.append((item, depth + 1, (trail, key)))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                raise _too_deep()
            size += 2
            for i, item in enumerate(value):
                stack.append((item, depth + 1, (trail, i)))
        elif isinstance(value, str):
            size += len(value) + 3
            _check_text(value, trail)
        elif isinstance(value, bool) or value is None:
            size += 5
        elif isinstance(value, int):
            size += 8
            if not INT64_MIN <= value <= INT64_MAX:
                raise BadRequest(
                    f"{_path(trail)}: the integer is out of range: integers must fit in 64 bits "
                    f"({INT64_MIN} to {INT64_MAX})"
                )
        elif isinstance(value, float):
            size += 8
            if not math.isfinite(value):
                raise BadRequest(f"{_path(trail)}: {value} is not a finite number")
        else:  # YAML timestamps, binary, sets: not JSON, so not a Kubernetes value
            raise BadRequest(
                f"{_path(trail)}: a YAML {type(value).__name__} is not a JSON value: quote it"
            )
        if size > limit:
            raise TooLarge(
                f"the decoded object is larger than {limit} bytes: an object may be at most "
                f"{MAX_BODY_BYTES} bytes"
            )
    return size


_Trail = tuple[Any, str | int] | None


def _path(trail: _Trail) -> str:
    parts: list[str] = []
    while trail is not None:
        trail, key = trail
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = "".join(reversed(parts)).lstrip(".")
    return repr(text[:200]) if text else "the body"


def _check_text(text: str, trail: _Trail) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"{_path(trail)}: the text holds an invalid character (a lone UTF-16 surrogate "
            f"at position {exc.start}): send valid UTF-8"
        ) from exc


def decode_object(body: bytes, content_type: str | None) -> dict[str, Any]:
    document = decode(body, content_type)
    if not isinstance(document, dict):
        raise BadRequest(
            f"the request body must be an object, got {type(document).__name__}: "
            "send one Kubernetes object (apiVersion, kind, metadata, spec)"
        )
    return document


def apply_patch(current: dict[str, Any], patch: Any, patch_type: str) -> dict[str, Any]:
    """The patched object, bounded like a decoded body (a patch can nest or copy)."""
    if patch_type == JSON_PATCH:
        return check_document(json_patch(current, patch))
    if not isinstance(patch, dict):
        raise BadRequest("a merge patch must be a JSON object")
    if patch_type == STRATEGIC_MERGE_PATCH:
        return check_document(strategic_merge(current, patch))
    if patch_type == MERGE_PATCH:
        return check_document(merge_patch(current, patch))
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
    if len(operations) > MAX_JSON_PATCH_OPERATIONS:
        raise BadRequest(
            f"the JSON patch has {len(operations)} operations; at most "
            f"{MAX_JSON_PATCH_OPERATIONS} are accepted"
        )
    result: Any = copy.deepcopy(document)
    copied = 0  # bytes copied so far: repeated copies could otherwise double the object each time
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
            value = _get(result, source)
            if kind == "copy":
                copied += _size(value)
                if copied > MAX_BODY_BYTES:
                    raise TooLarge(
                        f"the JSON patch copies more than {MAX_BODY_BYTES} bytes: an object may "
                        f"be at most {MAX_BODY_BYTES} bytes"
                    )
            value = copy.deepcopy(value)
            if kind == "move":
                _remove(result, source)
            result = _add(result, path, value)
        else:
            raise BadRequest(f"JSON patch operation {number}: unknown op {kind!r}")
    if not isinstance(result, dict):
        raise BadRequest("a JSON patch must leave an object")
    return result


def _size(value: Any) -> int:
    """About how many bytes `value` takes as JSON (TooLarge beyond an object's limit)."""
    return _measure(value, MAX_BODY_BYTES)


def _index(part: str, length: int, *, adding: bool) -> int:
    """A JSON-pointer array index: decimal digits, inside the list (RFC 6901/6902)."""
    if not part.isdigit() or not part.isascii() or (len(part) > 1 and part[0] == "0"):
        raise BadRequest(f"JSON patch index {part[:40]!r} is not a valid array index")
    index = int(part) if len(part) <= 18 else length + 1
    if index > length or (index == length and not adding):
        raise BadRequest(
            f"JSON patch index {part[:40]} is out of range: the list has {length} elements"
        )
    return index


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise BadRequest(f"invalid JSON pointer {str(path)[:40]!r}: must be a string")
    if path == "":
        return []
    if not path.startswith("/"):
        raise BadRequest(f"invalid JSON pointer {path!r}: must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _get(document: Any, path: list[str]) -> Any:
    node = document
    for part in path:
        try:
            node = (
                node[_index(part, len(node), adding=False)]
                if isinstance(node, list)
                else node[part]
            )
        except (KeyError, IndexError, TypeError, BadRequest) as exc:
            raise BadRequest(f"JSON patch path /{'/'.join(path)} does not exist") from exc
    return node


def _remove(document: Any, path: list[str]) -> None:
    if not path:
        raise BadRequest("JSON patch cannot remove the whole document")
    parent = _get(document, path[:-1])
    try:
        if isinstance(parent, list):
            del parent[_index(path[-1], len(parent), adding=False)]
        else:
            del parent[path[-1]]
    except (KeyError, IndexError, TypeError) as exc:
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
            parent.insert(_index(last, len(parent), adding=True), value)
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


def patch_body(*, apply: bool = False) -> dict[str, Any]:
    """The request body of a PATCH in the OpenAPI document: the formats `patch_type_of` takes
    (`apply`: server-side apply's too, where the route takes it)."""
    content: dict[str, Any] = {
        "application/merge-patch+json": {"schema": {"type": "object"}},
        "application/strategic-merge-patch+json": {"schema": {"type": "object"}},
        "application/json-patch+json": {"schema": {"type": "array", "items": {"type": "object"}}},
    }
    if apply:
        content[APPLY_PATCH] = {"schema": {"type": "object"}}
    return {"requestBody": {"required": True, "content": content}}
