"""What the controllers' events tell, as a test reads them from the API: the names a
`SuccessfulCreate` or `SuccessfulDelete` event lists (one event per slow-start step or per
pods deleted together: `Created pod: a`, `Created pods: a, b`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any


def named(events: Iterable[dict[str, Any]], reason: str) -> list[list[str]]:
    """The names each `reason` event lists, one list per time the event was told (the API
    counts a repeat on the event it repeats)."""
    told: list[list[str]] = []
    for event in events:
        if event.get("reason") == reason:
            _, _, listed = event["message"].partition(": ")
            told += [listed.split(", ")] * int(event.get("count") or 1)
    return told


def assert_each_named_once(told: list[list[str]], names: Iterable[str]) -> None:
    """Every one of `names` in exactly one of the events `told`, and no other name."""
    assert Counter(n for one in told for n in one) == Counter(set(names)), told
