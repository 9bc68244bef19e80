"""`timestamp`: RFC 3339 in UTC to the second, as Kubernetes writes it, whatever the zone or the
fraction of the time given, and whatever second was formatted just before."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

from app.kube.meta import parse_timestamp, timestamp


def reference(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_every_time_is_written_in_utc_to_the_second() -> None:
    rng = random.Random(7)
    start = datetime(1971, 1, 1, tzinfo=UTC)
    zones = [UTC, timezone(timedelta(hours=9)), timezone(timedelta(hours=-3, minutes=-30))]
    times = []
    for _ in range(2000):
        at = start + timedelta(seconds=rng.uniform(0, 2.5e9))
        times.append(at.astimezone(rng.choice(zones)))
        times.append(at + timedelta(microseconds=rng.choice([0, 1, 999_999])))  # same second
        times.append(at.replace(tzinfo=None))  # naive: local time, as astimezone takes it
    for value in times:
        assert timestamp(value) == reference(value), value


def test_a_second_formatted_again_after_another_is_still_its_own() -> None:
    a = datetime(2026, 12, 5, 18, 0, 0, 999_999, tzinfo=UTC)
    b = a + timedelta(microseconds=1)  # the next second
    assert [timestamp(t) for t in (a, b, a, a, b)] == [
        "2026-12-05T18:00:00Z",
        "2026-12-05T18:00:01Z",
        "2026-12-05T18:00:00Z",
        "2026-12-05T18:00:00Z",
        "2026-12-05T18:00:01Z",
    ]
    assert parse_timestamp(timestamp(b) or "") == b.replace(microsecond=0)
    assert timestamp(None) is None
