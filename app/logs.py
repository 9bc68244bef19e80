"""How every Tessera process writes its log: one line per record, with its UTC time.

2026-12-06T03:01:20.675Z INFO tessera.scheduler: bound 12 pods in 18 ms
"""

from __future__ import annotations

import logging
import time
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Formatter(logging.Formatter):
    """RFC 3339 times in UTC, to the millisecond."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


def configure(level: int = logging.INFO) -> None:
    """The root logger's one handler, on stderr (what `logging.basicConfig` would set up)."""
    handler = logging.StreamHandler()
    handler.setFormatter(Formatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)


def uvicorn_config() -> dict[str, Any]:
    """uvicorn's `log_config`: its own loggers in the same format."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"tessera": {"()": Formatter}},
        "handlers": {
            "tessera": {
                "class": "logging.StreamHandler",
                "formatter": "tessera",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["tessera"], "level": "INFO", "propagate": False},
            "uvicorn.access": {"handlers": ["tessera"], "level": "INFO", "propagate": False},
        },
    }
