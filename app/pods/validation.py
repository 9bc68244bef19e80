"""Turning a request body into a typed Pod, the way the Kubernetes API server decodes.

`fieldValidation` (as kubectl sends it) decides what an unknown field does:
`Strict` refuses the request naming the field, `Warn` (the default) drops it and answers with a
`Warning` header, `Ignore` drops it silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from app.errors import BadRequest, Cause
from app.pods.admission import PoolCatalog
from billing.specs import ComputeSpec, SpecCatalog

FieldValidation = Literal["Strict", "Warn", "Ignore"]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class AdmissionContext:
    specs: SpecCatalog
    pool: PoolCatalog
    default_spec: ComputeSpec


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def pydantic_causes(error: ValidationError) -> list[Cause]:
    causes = []
    for item in error.errors():
        path = field_path(tuple(item["loc"]))
        if item["type"] == "extra_forbidden":
            causes.append(Cause(path, f'unknown field "{path}"', "FieldValueUnknown"))
        elif item["type"] == "missing":
            causes.append(Cause(path, "Required value", "FieldValueRequired"))
        else:
            value = item.get("input")
            shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
            causes.append(Cause(path, f"Invalid value: {shown}: {item['msg']}"))
    return causes


def decode_model(
    model: type[M], document: dict[str, Any], *, kind: str, mode: FieldValidation
) -> tuple[M, list[str]]:
    """Validate `document` as `model`; returns the model and any warnings to send back."""
    try:
        return model.model_validate(document), []
    except ValidationError as exc:
        errors = exc.errors()
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        if len(unknown) == len(errors) and mode != "Strict":
            cleaned = _drop(document, [tuple(e["loc"]) for e in unknown])
            warnings = [f'unknown field "{field_path(tuple(e["loc"]))}"' for e in unknown]
            value, more = decode_model(model, cleaned, kind=kind, mode=mode)
            return value, (warnings if mode == "Warn" else []) + more
        causes = pydantic_causes(exc)
        if unknown and mode == "Strict":
            fields = ", ".join(f'unknown field "{field_path(tuple(e["loc"]))}"' for e in unknown)
            raise BadRequest(
                f'{kind} in version "v1" cannot be handled as a {kind}: strict decoding error: {fields}',
                causes=[c for c in causes if c.reason == "FieldValueUnknown"],
            ) from exc
        summary = "; ".join(f"{c.field}: {c.message}" for c in causes)
        raise BadRequest(
            f'{kind} in version "v1" cannot be handled as a {kind}: {summary}', causes=causes
        ) from exc


def drop_unknown_fields(
    model: type[BaseModel], document: dict[str, Any], *, kind: str, mode: FieldValidation
) -> tuple[dict[str, Any], list[str]]:
    """The unknown-field half of `decode_model`, for kinds whose service checks the values
    itself with its own messages (nodes, GPU devices, tenants): returns the document without
    its unknown fields and the warnings to send back; `Strict` refuses it naming them."""
    try:
        model.model_validate(document)
        return document, []
    except ValidationError as exc:
        unknown = [tuple(e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    if not unknown:
        return document, []
    fields = [f'unknown field "{field_path(loc)}"' for loc in unknown]
    if mode == "Strict":
        raise BadRequest(
            f'{kind} in version "v1" cannot be handled as a {kind}: strict decoding error: '
            + ", ".join(fields),
            causes=[
                Cause(field_path(loc), text, "FieldValueUnknown")
                for loc, text in zip(unknown, fields, strict=True)
            ],
        )
    return _drop(document, unknown), fields if mode == "Warn" else []


def _drop(document: Any, paths: list[tuple[int | str, ...]]) -> Any:
    import copy

    cleaned = copy.deepcopy(document)
    for path in paths:
        node = cleaned
        for part in path[:-1]:
            node = node[part]
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return cleaned
