"""What a long-running Tessera process (the API, the scheduler, the node loop) sets for itself."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

GC_THRESHOLD = 10_000


@contextlib.contextmanager
def collector_for_serving() -> Iterator[None]:
    """Python's cyclic garbage collector set for a busy process, while it serves (then as before).

    - What exists once the process has started (modules, routes, models, caches: some 260,000
      objects in the API) lives as long as it: frozen (`gc.freeze`), the collector no longer
      walks it. Under load it did, in a full collection every second or two, each some 0.1 s of
      CPU. `freeze_long_lived` does the same for what a process keeps later (the scheduler's
      copy of the pool).
    - A collection starts after GC_THRESHOLD new objects rather than Python's 700. A request
      makes hundreds, which reference counting frees; at 700 the collector ran every few
      requests, and found about one object of cyclic garbage per request.
    """
    threshold = gc.get_threshold()
    freeze_long_lived()
    gc.set_threshold(GC_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def freeze_long_lived() -> None:
    """Collect, then keep everything alive now out of the collector's walks (reference counting
    still frees it when it goes)."""
    gc.collect()
    gc.freeze()
