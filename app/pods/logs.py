"""What `kubectl logs` shows, and when a container's log is over.

A node agent sends its pods' logs (app/pods/log_store.py keeps them). A pod on a node no agent
manages has a log derived here from the pod as the API holds it: what was started (image,
command, args), the stop it was asked for, and how the container exited, so it always agrees
with its status. Pure: the router reads the pod and applies the query (`tailLines`,
`sinceSeconds`, `timestamps`, `limitBytes`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.errors import BadRequest
from app.kube.meta import parse_timestamp


@dataclass(frozen=True)
class Line:
    at: datetime
    text: str

    def render(self, *, timestamps: bool) -> str:
        if not timestamps:
            return self.text + "\n"
        return f"{self.at.strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z {self.text}\n"


def container_of(pod: dict[str, Any], container: str | None) -> dict[str, Any]:
    """The container `kubectl logs -c` names, or the only one; 400 in Kubernetes' words."""
    name = pod["metadata"]["name"]
    containers = pod["spec"].get("containers", [])
    if container is None:
        if len(containers) == 1:
            return dict(containers[0])
        names = " ".join(c["name"] for c in containers)
        raise BadRequest(
            f"a container name must be specified for pod {name}, choose one of: [{names}]"
        )
    for candidate in containers + (pod["spec"].get("initContainers") or []):
        if candidate["name"] == container:
            return dict(candidate)
    raise BadRequest(f"container {container} is not valid for pod {name}")


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers' statuses, the init containers' included."""
    status = pod["status"]
    return list(status.get("containerStatuses") or []) + list(
        status.get("initContainerStatuses") or []
    )


def lines(pod: dict[str, Any], container: dict[str, Any]) -> list[Line]:
    """The container's log, oldest first; 400 (saying why) when it has not started yet."""
    name, cname = pod["metadata"]["name"], container["name"]
    status = pod["status"]
    if "startTime" not in status:
        why = (
            "Tessera has not placed the pod on a node yet"
            if "nodeName" not in pod["spec"]
            else "the pod is placed and its node is starting it"
        )
        raise BadRequest(
            f'container "{cname}" in pod "{name}" is waiting to start: {why}; '
            "its log begins when it runs"
        )
    started = parse_timestamp(status["startTime"])
    command = container.get("command")
    args = container.get("args")
    out = [
        Line(
            started,
            f"tessera-runtime: started container {cname} from image {container.get('image', '')}",
        ),
        Line(
            started,
            "tessera-runtime: command "
            + (json.dumps(command) if command else "(the image's entrypoint)")
            + ", args "
            + (json.dumps(args) if args else "(none)"),
        ),
    ]
    meta = pod["metadata"]
    if "deletionTimestamp" in meta:
        grace = int(meta.get("deletionGracePeriodSeconds") or 0)
        asked = parse_timestamp(meta["deletionTimestamp"]) - timedelta(seconds=grace)
        out.append(Line(max(asked, started), f"tessera-runtime: SIGTERM: stopping within {grace}s"))
    state: dict[str, Any] = next(
        (s.get("state", {}) for s in status.get("containerStatuses", []) if s["name"] == cname),
        {},
    )
    if "terminated" in state:
        ended = _ended(pod) or started
        exit_code = state["terminated"].get("exitCode", 0)
        reason = state["terminated"].get("reason", "")
        out.append(
            Line(
                max(ended, started),
                f"tessera-runtime: container {cname} exited with code {exit_code} ({reason})",
            )
        )
    return out


def finished(pod: dict[str, Any]) -> bool:
    """No more lines will come: `kubectl logs -f` ends here."""
    return pod["status"]["phase"] in ("Succeeded", "Failed")


def run_over(pod: dict[str, Any], container: str, run: int) -> bool:
    """The run `run` (a restartCount) of the container has ended: `kubectl logs -f` ends."""
    if finished(pod):
        return True
    for status in _statuses(pod):
        if status.get("name") == container:
            restarts = int(status.get("restartCount") or 0)
            return restarts > run or (restarts == run and "terminated" in status.get("state", {}))
    return False


def restarts_of(pod: dict[str, Any], container: str) -> int:
    for status in _statuses(pod):
        if status.get("name") == container:
            return int(status.get("restartCount") or 0)
    return 0


def select(
    all_lines: Sequence[Line],
    *,
    now: datetime,
    tail: int | None,
    since_seconds: int | None,
    since_time: datetime | None,
) -> list[Line]:
    chosen = list(all_lines)
    if since_seconds is not None:
        since_time = now - timedelta(seconds=since_seconds)
    if since_time is not None:
        chosen = [line for line in chosen if line.at >= since_time]
    if tail is not None:
        chosen = chosen[-tail:] if tail else []
    return chosen


def _ended(pod: dict[str, Any]) -> datetime | None:
    for condition in pod["status"].get("conditions", []):
        if condition["type"] == "Ready" and condition.get("lastTransitionTime"):
            return parse_timestamp(condition["lastTransitionTime"])
    return None
