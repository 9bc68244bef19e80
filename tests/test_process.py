"""Settings of long-running processes: the garbage collector."""

from __future__ import annotations

import gc

from app.process import GC_THRESHOLD, collector_for_serving


def test_the_collector_is_set_for_serving_while_the_process_runs() -> None:
    before = gc.get_threshold()
    with collector_for_serving():
        assert gc.get_threshold()[0] == GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
