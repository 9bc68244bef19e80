"""Label and field selectors, as `kubectl get -l ...` / `--field-selector ...` send them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.errors import BadRequest

_TOKEN = re.compile(r"\s*(!=|==|=|!|,|\(|\)|[^\s!=,()]+)")
_KEY = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# Bounds on one selector: matching runs over every object listed or watched, so its size is
# capped well above what anyone writes by hand (kubectl's own selectors are a few terms).
MAX_SELECTOR_CHARS = 4096
MAX_SELECTOR_TERMS = 64
MAX_SELECTOR_VALUES = 256  # values in all the `in (...)` / `notin (...)` sets of one selector
_FIELD_REQUIREMENT = re.compile(r"([^=!\s]+)\s*(==|=|!=)\s*(.*)", re.DOTALL)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as in Kubernetes
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector()
    _bounded(text, "label")
    tokens = [t for t in _TOKEN.findall(text)]
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise _bad(text, "unexpected character")
    requirements = []
    i = 0

    def key_of(token: str) -> str:
        if not _KEY.fullmatch(token):
            raise _bad(text, f"{token!r} is not a label key")
        return token

    def take() -> str:
        nonlocal i
        if i >= len(tokens):
            raise _bad(text, "unexpected end")
        token = tokens[i]
        i += 1
        return token

    while i < len(tokens):
        token = take()
        if token == "!":
            requirements.append(Requirement(key_of(take()), "!"))
        else:
            key = key_of(token)
            op = tokens[i] if i < len(tokens) else ","
            if op == ",":
                requirements.append(Requirement(key, "exists"))
            elif op in ("=", "==", "!="):
                i += 1
                value = tokens[i] if i < len(tokens) and tokens[i] != "," else ""
                if value:
                    i += 1
                requirements.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
            elif op in ("in", "notin"):
                i += 1
                if take() != "(":
                    raise _bad(text, f"expected '(' after {op}")
                values = []
                while True:
                    token = take()
                    if token == ")":
                        break
                    if token != ",":
                        values.append(token)
                requirements.append(Requirement(key, op, tuple(values)))
                counted = sum(len(r.values) for r in requirements)
                if counted > MAX_SELECTOR_VALUES:
                    raise _bad(
                        text, f"more than {MAX_SELECTOR_VALUES} values in its sets: use a label"
                    )
            else:
                raise _bad(text, f"unexpected {op!r}")
        if len(requirements) > MAX_SELECTOR_TERMS:
            raise _bad(text, f"more than {MAX_SELECTOR_TERMS} requirements")
        if i < len(tokens):
            if tokens[i] != ",":
                raise _bad(text, f"expected ',' before {tokens[i]!r}")
            i += 1
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool


def parse_field_selector(text: str | None, supported: tuple[str, ...]) -> list[FieldRequirement]:
    """`a=b,c!=d` over the fields `supported`; anything else is a 400 naming the field."""
    if not text or not text.strip():
        return []
    _bounded(text, "field")
    out = []
    parts = text.split(",")
    if len(parts) > MAX_SELECTOR_TERMS:
        raise BadRequest(
            f"invalid field selector: {len(parts)} requirements; at most {MAX_SELECTOR_TERMS}"
        )
    for part in parts:
        part = part.strip()
        if not part:
            continue
        match = _FIELD_REQUIREMENT.fullmatch(part)
        if match is None or re.search(r"(?<!\\)[=!]", match.group(3)):
            raise BadRequest(
                f'invalid field selector "{text[:200]}": expected field=value, field==value or '
                "field!=value (a value holds no '=' or '!')"
            )
        field, op, value = match.groups()
        value = value.replace("\\=", "=").replace("\\!", "!").replace("\\,", ",")
        if field not in supported:
            raise BadRequest(
                f'"{field}" is not a known field selector: only "{", ".join(supported)}"'
            )
        out.append(FieldRequirement(field, value, op == "!="))
    return out


def field_filter(requirements: list[FieldRequirement], getter: Callable[[str], str | None]) -> bool:
    for r in requirements:
        actual = getter(r.field) or ""
        if (actual == r.value) == r.negate:
            return False
    return True


def _bad(text: str, why: str) -> BadRequest:
    return BadRequest(
        f'unable to parse requirement: invalid label selector "{text[:200]}": {why} '
        "(use e.g. app=web, tier!=db, env in (a,b), !canary)"
    )


def _bounded(text: str, kind: str) -> None:
    if len(text) > MAX_SELECTOR_CHARS:
        raise BadRequest(
            f"invalid {kind} selector: {len(text)} characters; a selector may have at most "
            f"{MAX_SELECTOR_CHARS}"
        )
