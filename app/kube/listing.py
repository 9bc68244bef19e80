"""Lists of objects filtered and paged in memory (kinds that are not on a hot path)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.kube.lists import ContinueToken
from app.kube.selectors import FieldRequirement, LabelSelector, field_filter


def object_field(obj: dict[str, Any], path: str) -> str | None:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, dict):  # e.g. an Event's "source" selects source.component
        node = node.get("component")
    return None if node is None else str(node)


def page_objects(
    objects: Sequence[dict[str, Any]],
    *,
    labels: LabelSelector,
    fields: list[FieldRequirement],
    limit: int | None,
    continue_token: str | None,
    resource_version: int,
    getter: Callable[[dict[str, Any], str], str | None] = object_field,
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Filter by selectors, order by (namespace, name), and cut a page after the token."""

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    after = None
    if continue_token:
        token = ContinueToken.decode(continue_token)
        after = (token.namespace, token.name)
        resource_version = token.resource_version
    selected = [
        obj
        for obj in sorted(objects, key=key)
        if (after is None or key(obj) > after)
        and (labels.empty or labels.matches(obj["metadata"].get("labels") or {}))
        and field_filter(fields, lambda path, obj=obj: getter(obj, path))  # type: ignore[misc]
    ]
    if limit and len(selected) > limit:
        last = key(selected[limit - 1])
        return (
            selected[:limit],
            resource_version,
            ContinueToken(last[0], last[1], resource_version).encode(),
        )
    return selected, resource_version, None


def list_object(
    kind: str,
    api_version: str,
    items: list[dict[str, Any]],
    resource_version: int,
    continue_token: str | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": str(resource_version)}
    if continue_token:
        metadata["continue"] = continue_token
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items}
