"""Kubernetes object metadata shared by every kind Tessera serves."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from app.errors import Cause

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class KubeModel(BaseModel):
    """Base of every API schema: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=False
    )


class OwnerReference(KubeModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(KubeModel):
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None


class ListMeta(KubeModel):
    resource_version: str | None = None
    continue_: str | None = Field(default=None, alias="continue")
    remaining_item_count: int | None = None


def timestamp(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> datetime:
    return datetime.now(UTC)


def validate_name(name: str, field: str, *, label: bool = False) -> list[Cause]:
    limit = 63 if label else 253
    pattern = DNS1123_LABEL if label else DNS1123_SUBDOMAIN
    if not name:
        return [
            Cause(field, "Required value: name or generateName is required", "FieldValueRequired")
        ]
    if len(name) > limit or not pattern.match(name):
        kind = "RFC 1123 label" if label else "RFC 1123 subdomain"
        return [
            Cause(
                field,
                f'Invalid value: "{name}": a lowercase {kind} must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                f"alphanumeric character (at most {limit} characters, e.g. 'my-name')",
            )
        ]
    return []


def validate_labels(labels: dict[str, str], field: str) -> list[Cause]:
    causes = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)))
        ):
            causes.append(
                Cause(
                    f"{field}",
                    f'Invalid value: "{key}": a label key is an optional DNS prefix and "/" '
                    "followed by a name of at most 63 alphanumeric characters, '-', '_' or '.'",
                )
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                Cause(
                    f"{field}",
                    f'Invalid value: "{value}": a label value must be at most 63 characters, '
                    "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
    return causes
