"""Kubernetes object metadata shared by every kind Tessera serves."""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic.alias_generators import to_camel

from app.errors import Cause

# Always used with `fullmatch` (`match` with `$` would accept a trailing newline).
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# The suffix of a generated name (`generateName` + 5 random characters), as Kubernetes adds it.
GENERATED_SUFFIX_LENGTH = 5
# Kubernetes' limit on the total size of an object's annotations (keys and values).
MAX_ANNOTATIONS_BYTES = 256 * 1024
# Labels are what selectors, the scheduler and every watch filter read: their count is capped
# (each key and value is already capped by Kubernetes' own rules), so that one tenant's objects
# cannot make every matching pass over them slow for the others.
MAX_LABELS = 256

# A resource quantity as a body may give it ("500m", 2, 0.5). Strict: `nvidia.com/gpu: true` is
# not the quantity 1.
Quantity = StrictStr | StrictInt | StrictFloat


# Integers as Kubernetes types them (int32 / int64): every schema field uses one of these, so a
# number outside the range is a 400 naming the field, never an overflow further on.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]


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
    generation: Int64 | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: Int64 | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None


class ListMeta(KubeModel):
    resource_version: str | None = None
    continue_: str | None = Field(default=None, alias="continue")
    remaining_item_count: Int64 | None = None


def timestamp(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it.

    The text of the last second formatted is kept: an object's timestamps are mostly of the
    same second, and a pod is formatted several times on its way (created, bound, started)."""
    global _formatted
    if value is None:
        return None
    second = math.floor(value.timestamp())
    last = _formatted
    if last[0] == second:
        return last[1]
    t = time.gmtime(second)  # four-digit years always (strftime's %Y writes year 1 as "1")
    text = (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z"
    )
    _formatted = (second, text)
    return text


_formatted: tuple[int | None, str] = (None, "")  # (whole seconds since the epoch, its text)


def micro_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with microseconds: Kubernetes' MicroTime (an event series' times)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(value: str) -> datetime:
    """The inverse of `timestamp` (and any RFC 3339 time with a zone, as clients send)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def now() -> datetime:
    return datetime.now(UTC)


class _RandomBytes:
    """Random bytes from the operating system's cryptographic source, drawn a block at a time:
    a new object's uid and an event's name take a slice, not a system call each (on the create
    path that call, and the hand-over of the interpreter lock around it, cost more than the rest
    of making the uid)."""

    BLOCK = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self._buffer, self._at = b"", 0

    def take(self, count: int) -> bytes:
        with self._lock:
            if self._at + count > len(self._buffer):
                self._buffer, self._at = os.urandom(max(self.BLOCK, count)), 0
            self._at += count
            return self._buffer[self._at - count : self._at]


_RANDOM = _RandomBytes()
os.register_at_fork(after_in_child=_RANDOM.reset)  # a child never hands out its parent's bytes


def new_uid() -> str:
    """A random (version 4) UUID, as `uuid.uuid4()` makes."""
    return str(uuid.UUID(bytes=_RANDOM.take(16), version=4))


def random_hex(count: int) -> str:
    """`count` random bytes as hex, as `secrets.token_hex(count)` makes."""
    return _RANDOM.take(count).hex()


def validate_name(name: str, field: str, *, label: bool = False) -> list[Cause]:
    limit = 63 if label else 253
    pattern = DNS1123_LABEL if label else DNS1123_SUBDOMAIN
    if not name:
        return [
            Cause(field, "Required value: name or generateName is required", "FieldValueRequired")
        ]
    if len(name) > limit or not pattern.fullmatch(name):
        kind = "RFC 1123 label" if label else "RFC 1123 subdomain"
        return [
            Cause(
                field,
                f'Invalid value: "{name[:300]}": a lowercase {kind} must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                f"alphanumeric character (at most {limit} characters, e.g. 'my-name')",
            )
        ]
    return []


def derived_name(base: str, suffix: str, *, limit: int = 253) -> str:
    """`base + suffix` (an event's `<pod>.<hex>`, a GPU's `<node>-gpu3`), shortened to fit
    `limit` characters: a base too long is cut and given a hash of the whole base, so distinct
    bases keep distinct names and every derived name fits its column on every database."""
    if len(base) + len(suffix) <= limit:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    keep = max(0, limit - len(suffix) - len(digest) - 1)
    return f"{base[:keep].rstrip('-.')}-{digest}{suffix}"[-limit:]


def validate_generate_name(prefix: str, field: str, *, label: bool = False) -> list[Cause]:
    """A generateName is a name prefix that leaves room for the generated suffix."""
    limit = (63 if label else 253) - GENERATED_SUFFIX_LENGTH
    if len(prefix) > limit:
        return [
            Cause(
                field,
                f'Invalid value: "{prefix[:64]}...": must be no more than {limit} characters, so '
                f"that the {GENERATED_SUFFIX_LENGTH} generated characters fit in a name",
            )
        ]
    # a generated name ends in an alphanumeric suffix, so a trailing "-" or "." is fine
    return validate_name(prefix + "x", field, label=label)


def is_qualified_name(key: str) -> bool:
    """A label or annotation key: an optional DNS subdomain prefix and "/", then a name."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return False
    return bool(
        name
        and len(name) <= 63
        and _LABEL_NAME.fullmatch(name)
        and (not prefix or (len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix)))
    )


def validate_annotations(annotations: dict[str, str], field: str) -> list[Cause]:
    causes = []
    total = 0
    for key, value in annotations.items():
        total += len(key.encode()) + (len(value.encode()) if isinstance(value, str) else 0)
        if not is_qualified_name(key):
            causes.append(
                Cause(
                    field,
                    f'Invalid value: "{key[:100]}": an annotation key is an optional DNS prefix '
                    "and \"/\" followed by a name of at most 63 alphanumeric characters, '-', "
                    "'_' or '.', starting and ending with an alphanumeric (e.g. "
                    "'example.com/my-note')",
                )
            )
    if total > MAX_ANNOTATIONS_BYTES:
        causes.append(
            Cause(
                field,
                f"Too long: the annotations take {total} bytes; they may take at most "
                f"{MAX_ANNOTATIONS_BYTES} bytes in all",
                "FieldValueTooLong",
            )
        )
    return causes


def validate_labels(labels: dict[str, str], field: str) -> list[Cause]:
    if len(labels) > MAX_LABELS:
        return [
            Cause(
                field,
                f"Too many: {len(labels)} labels; an object may have at most {MAX_LABELS} "
                "(keep what selectors need in labels, the rest in annotations)",
                "FieldValueTooMany",
            )
        ]
    causes = []
    for key, value in labels.items():
        if not is_qualified_name(key):
            causes.append(
                Cause(
                    f"{field}",
                    f'Invalid value: "{key[:100]}": a label key is an optional DNS prefix and "/" '
                    "followed by a name of at most 63 alphanumeric characters, '-', '_' or '.'",
                )
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            causes.append(
                Cause(
                    f"{field}",
                    f'Invalid value: "{str(value)[:100]}": a label value must be at most 63 characters, '
                    "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
    return causes
