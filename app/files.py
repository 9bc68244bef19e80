"""Files other processes read while this one writes them (TLS certificates and keys,
kubeconfigs, the running server's record)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `path` so that a reader sees the old file or the new one, never a part: into a
    file of its own beside it (`mode` from the start: a key or a token is never readable by
    others, not even briefly), flushed to disk, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
