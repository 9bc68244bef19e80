"""The pod logs node agents send, kept in a bounded store (table `pod_log_lines`).

A node agent is the source of its pods' logs: it sends each container run's lines
(`POST .../pods/{name}/log`) and the API keeps them per pod, container and run (the run is
the container's restart count). Only the current and the previous run of each container are
kept (what `kubectl logs` and `kubectl logs --previous` show), each run up to
`pod_log_max_lines` lines and `pod_log_max_bytes` bytes, the oldest dropped first; the lines
go with the pod (the foreign key cascades). Queries and the write rule only; the router parses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.models import PodLogLine, table
from app.pods.logs import Line

lines_table = table(PodLogLine)


@dataclass(frozen=True)
class Stored:
    id: int
    line: Line


def append(
    session: Session,
    *,
    pod_uid: str,
    container: str,
    run: int,
    batch: Sequence[Line],
    max_lines: int,
    max_bytes: int,
) -> None:
    """Add a batch of lines to a run; drop runs older than the previous one and, in this run,
    the oldest lines beyond the caps."""
    c = lines_table.c
    if batch:
        session.execute(
            lines_table.insert(),
            [
                {
                    "pod_uid": pod_uid,
                    "container": container,
                    "run": run,
                    "at": line.at,
                    "text": line.text,
                    "size": len(line.text.encode()),
                }
                for line in batch
            ],
        )
    of_container = (c.pod_uid == pod_uid) & (c.container == container)
    # the two newest runs are kept, whatever order the batches came in
    newest = session.scalar(select(func.max(c.run)).where(of_container))
    session.execute(delete(lines_table).where(of_container & (c.run < max(run, newest or 0) - 1)))
    rows = session.execute(
        select(c.id, c.size).where(of_container & (c.run == run)).order_by(c.id.desc())
    ).all()
    kept, used, cut = 0, 0, None
    for row in rows:
        if kept + 1 > max_lines or used + row.size > max_bytes:
            cut = row.id
            break
        kept, used = kept + 1, used + row.size
    if cut is not None:
        session.execute(delete(lines_table).where(of_container & (c.run == run) & (c.id <= cut)))


def runs(session: Session, *, pod_uid: str, container: str) -> list[int]:
    """The runs of a container that have lines, oldest first."""
    c = lines_table.c
    query = (
        select(c.run)
        .where(c.pod_uid == pod_uid, c.container == container)
        .group_by(c.run)
        .order_by(c.run)
    )
    return list(session.scalars(query))


def read(
    session: Session, *, pod_uid: str, container: str, run: int, after: int = 0
) -> list[Stored]:
    """A run's lines after the line id `after`, oldest first."""
    c = lines_table.c
    query = (
        select(c.id, c.at, c.text)
        .where(c.pod_uid == pod_uid, c.container == container, c.run == run, c.id > after)
        .order_by(c.id)
    )
    return [Stored(row.id, Line(row.at, row.text)) for row in session.execute(query)]


def count(session: Session, *, pod_uid: str) -> int:
    query = select(func.count()).select_from(lines_table).where(lines_table.c.pod_uid == pod_uid)
    return int(session.scalar(query) or 0)
