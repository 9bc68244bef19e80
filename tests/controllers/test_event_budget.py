"""A controller's events about one object are budgeted as client-go's spam filter does: 25 at
once, then one per 5 minutes; other objects keep their own budget."""

from __future__ import annotations

import pytest

from app.controllers import base
from app.controllers.base import SPAM_BURST, SPAM_REFILL_SECONDS, Controller


def test_an_object_tells_25_events_then_one_per_refill(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(base.time, "monotonic", lambda: now[0])
    controller = Controller()
    told = [controller._may_tell("rs-1") for _ in range(40)]
    assert told == [True] * int(SPAM_BURST) + [False] * (40 - int(SPAM_BURST))
    assert controller._may_tell("rs-2")  # another object: its own budget
    now[0] += SPAM_REFILL_SECONDS / 2
    assert not controller._may_tell("rs-1")  # half a token back: not yet
    now[0] += SPAM_REFILL_SECONDS / 2
    assert controller._may_tell("rs-1") and not controller._may_tell("rs-1")
    now[0] += 100 * SPAM_REFILL_SECONDS  # refilled to the burst, no further
    assert sum(controller._may_tell("rs-1") for _ in range(40)) == int(SPAM_BURST)
