"""The runtime interface of the node agent, and the virtual runtime.

`Runtime` is what the agent asks of a runtime: it is told of every change to the node's pods
(`observe`), resumes what it already runs when the agent starts (`resume`), and stops (`close`)
leaving the containers as they are. Two implement it: `VirtualRuntime` below (like KWOK: for
benchmarks, the demo and tests of the control plane) and `agent.docker.DockerRuntime` (real
containers through a Docker Engine API). Every report a runtime makes goes through the pod's
`Outbox` (agent/client.py): in order, sent again until acknowledged.

The virtual runtime: containers that run for a while and exit, without running anything.

A pod bound to the node starts `start_delay` seconds after the agent sees it and reports
Running. It runs for `tessera.io/run-seconds` (annotation) or, failing that, until
`spec.activeDeadlineSeconds` (then it is stopped: Failed, reason DeadlineExceeded); with
neither it runs until deleted. On exit its code is `tessera.io/exit-code` (default 0):
restartPolicy Always (any code) and OnFailure (code != 0) restart it, counting restarts;
otherwise it ends Succeeded (reason Completed) or Failed (reason Error). A pod being deleted
gets SIGTERM: its containers stop `stop_seconds` later, the agent reports them terminated and
removes the pod (grace 0). Each pod reports an address, as KWOK gives its pods: one of
VIRTUAL_POD_NETWORK from a hash of its uid (nothing listens there; a Service's EndpointSlice
lists it). A restarted agent resumes a Running pod from what the API says:
its run started at the reported startedAt, so it ends when it would have (a run that would have
ended while the agent was away is reported ended then), never from zero.

Each run of a container writes its log, sent to the API (`POST .../pods/{name}/log`) before the
status that follows it: what it started (image, command, args), a line every `log_step`
seconds of run time (at most MAX_STEPS a run), the stop it was asked for, and how it exited. A
restart is a new run (its restartCount), so `kubectl logs --previous` shows the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from agent.client import Background, NodeClient, Outbox

log = logging.getLogger("tessera.agent.runtime")
RUN_SECONDS = "tessera.io/run-seconds"
EXIT_CODE = "tessera.io/exit-code"
MAX_SECONDS = 366 * 86400.0
CONTAINER = "\x00container\x00"  # in a log line: the container's name
MAX_STEPS = 1000  # "running" lines a run writes at most
RUNTIME_LABEL = "tessera.io/runtime"
VIRTUAL_POD_NETWORK = ipaddress.ip_network("10.244.0.0/16")


def virtual_pod_ip(uid: str) -> str:
    """A virtual pod's address: the same for the same pod, in VIRTUAL_POD_NETWORK."""
    hosts = VIRTUAL_POD_NETWORK.num_addresses - 2
    offset = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % hosts
    return str(VIRTUAL_POD_NETWORK.network_address + 1 + offset)


class Runtime(Protocol):
    """What runs the pods of one node."""

    kind: str  # the node's tessera.io/runtime label: "virtual" or "docker"

    async def resume(self) -> None:
        """Before the first pod is observed: find what this runtime already runs."""

    def synced(self, uids: set[str]) -> None:
        """After a full listing: the uids of every pod bound to the node."""

    def observe(self, event: str, pod: dict[str, Any]) -> None:
        """A pod bound to the node was ADDED, MODIFIED or DELETED (a listing: ADDED)."""

    async def close(self) -> None:
        """Stop acting (the containers are left as they are: a restarted agent resumes them)."""


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None


def time_text(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Plan:
    run_seconds: float | None  # None: until deleted
    deadline: float | None  # spec.activeDeadlineSeconds
    exit_code: int
    restart: str  # Always, OnFailure, Never

    @classmethod
    def of(cls, pod: dict[str, Any]) -> Plan:
        annotations = pod["metadata"].get("annotations") or {}
        spec = pod["spec"]
        return cls(
            run_seconds=_number(annotations.get(RUN_SECONDS)),
            deadline=_number(spec.get("activeDeadlineSeconds")),
            exit_code=int(_number(annotations.get(EXIT_CODE)) or 0) % 256,
            restart=str(spec.get("restartPolicy") or "Always"),
        )

    def restarts_after(self, code: int) -> bool:
        return self.restart == "Always" or (self.restart == "OnFailure" and code != 0)


def _exited(code: int, reason: str) -> str:
    return f"tessera-runtime: container {CONTAINER} exited with code {code} ({reason})"


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return min(max(number, 0.0), MAX_SECONDS) if number == number else None


@dataclass
class VirtualPod:
    """One pod's containers on this node, run by one task."""

    pod: dict[str, Any]
    client: NodeClient
    start_delay: float
    stop_seconds: float
    log_step: float = 10.0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    outbox: Outbox = field(init=False)

    def __post_init__(self) -> None:
        meta = self.pod["metadata"]
        self.outbox = Outbox(self.client, f"{meta['namespace']}/{meta['name']}")

    @property
    def containers(self) -> list[str]:
        return [c["name"] for c in self.pod["spec"].get("containers", [])]

    def _statuses(
        self, state: dict[str, Any], restarts: int, last: dict[str, Any] | None, ready: bool
    ) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "ready": ready,
                "started": "running" in state,
                "restartCount": restarts,
                "state": state,
                "lastState": last or {},
                "containerID": f"virtual://{self.pod['metadata']['uid']}/{name}",
                "imageID": "",
            }
            for name in self.containers
        ]

    async def _wait_stop(self, seconds: float | None) -> bool:
        """Wait `seconds` (None: forever); True when told to stop meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        plan = Plan.of(self.pod)
        phase = self.pod["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            if "deletionTimestamp" in self.pod["metadata"]:
                self._remove()
            return
        if phase == "Pending" and await self._wait_stop(self.start_delay):
            self._remove()  # deleted before it started
            return
        loop = asyncio.get_running_loop()
        began = loop.time()
        restarts = 0
        last: dict[str, Any] | None = None
        resumed: datetime | None = None  # the reported start of the run going on
        if phase == "Running":  # the agent restarted: resume from the reported state
            statuses = self.pod["status"].get("containerStatuses") or [{}]
            restarts = int(statuses[0].get("restartCount") or 0)
            last = statuses[0].get("lastState") or None
            running = (statuses[0].get("state") or {}).get("running") or {}
            resumed = parse_time(str(running.get("startedAt") or ""))
            start = parse_time(str(self.pod["status"].get("startTime") or ""))
            if start is not None:  # the active deadline counts from the pod's start
                began -= max((datetime.now(UTC) - start).total_seconds(), 0.0)
        while True:
            if resumed is not None:
                started_at = resumed
                resumed = None
            else:
                started_at = datetime.now(UTC)
                self._log(restarts, self._started_lines)
            started = time_text(started_at)
            running = {"running": {"startedAt": started}}
            self._report("Running", self._statuses(running, restarts, last, True))
            left = None if plan.deadline is None else plan.deadline - (loop.time() - began)
            now = datetime.now(UTC)
            # when the run ends as planned, and when its deadline comes (either perhaps past:
            # while the agent was away)
            run_end = (
                None
                if plan.run_seconds is None
                else started_at + timedelta(seconds=plan.run_seconds)
            )
            deadline_end = None if left is None else now + timedelta(seconds=left)
            deadline_first = deadline_end is not None and (
                run_end is None or run_end >= deadline_end
            )
            ends_at = deadline_end if deadline_first else run_end
            run_for = None if run_end is None else max((run_end - now).total_seconds(), 0.0)
            stopped = await self._run_for(
                max(left or 0.0, 0.0) if deadline_first else run_for, restarts
            )
            if stopped:
                grace = int(self.pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                sigterm = f"tessera-runtime: SIGTERM: stopping within {grace}s"
                self._log(restarts, [sigterm])
                await asyncio.sleep(self.stop_seconds)  # SIGTERM: the container exits
                self._log(restarts, [_exited(0, "Completed")])
                end = self._terminated(0, "Completed", started)
                self._report("Running", self._statuses(end, restarts, last, False))
                self._remove()
                return
            if deadline_first:
                self._log(
                    restarts,
                    [
                        f"tessera-runtime: active deadline of {plan.deadline:g}s reached: SIGKILL",
                        _exited(137, "Error"),
                    ],
                )
                end = self._terminated(137, "Error", started, ends_at)
                self._report(
                    "Failed",
                    self._statuses(end, restarts, last, False),
                    reason="DeadlineExceeded",
                    message="Pod was active on the node longer than the specified deadline",
                )
                return
            code = plan.exit_code
            reason = "Completed" if code == 0 else "Error"
            self._log(restarts, [_exited(code, reason)])
            end = self._terminated(code, reason, started, ends_at)
            if not plan.restarts_after(code):
                phase = "Succeeded" if code == 0 else "Failed"
                self._report(phase, self._statuses(end, restarts, last, False))
                return
            restarts += 1
            last = end

    def _started_lines(self, container: dict[str, Any]) -> list[str]:
        command, args = container.get("command"), container.get("args")
        return [
            f"tessera-runtime: started container {container['name']} from image "
            f"{container.get('image', '')}",
            "tessera-runtime: command "
            + (json.dumps(command) if command else "(the image's entrypoint)")
            + ", args "
            + (json.dumps(args) if args else "(none)"),
        ]

    async def _run_for(self, seconds: float | None, restarts: int) -> bool:
        """Run `seconds` (None: until stopped), writing a line every `log_step` seconds; True
        when told to stop meanwhile."""
        ran, steps = 0.0, 0
        while seconds is None or ran < seconds:
            chunk = self.log_step if seconds is None else min(self.log_step, seconds - ran)
            if await self._wait_stop(chunk):
                return True
            ran += chunk
            if steps < MAX_STEPS and (seconds is None or ran < seconds):
                steps += 1
                running = f"tessera-runtime: container {CONTAINER} running ({ran:g}s)"
                self._log(restarts, [running])
        return False

    def _log(self, restarts: int, lines: list[str] | Callable[[dict[str, Any]], list[str]]) -> None:
        """Send each container's lines for this run (CONTAINER in a line: its name), stamped
        now, through the outbox."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for container in self.pod["spec"].get("containers", []):
            name = container["name"]
            texts = (
                [line.replace(CONTAINER, name) for line in lines]
                if isinstance(lines, list)
                else lines(container)
            )
            stamped = [(stamp, text) for text in texts]
            self.outbox.put(
                "log",
                lambda n=name, t=stamped: self.client.send_log(self.pod, n, restarts, t),  # type: ignore[misc]
            )

    def _remove(self) -> None:
        self.outbox.put("removal", lambda: self.client.remove(self.pod))

    def _terminated(
        self, code: int, reason: str, started: str, at: datetime | None = None
    ) -> dict[str, Any]:
        ended = min(at, datetime.now(UTC)) if at is not None else datetime.now(UTC)
        return {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": started,
                "finishedAt": time_text(ended),
            }
        }

    def _report(
        self,
        phase: str,
        statuses: list[dict[str, Any]],
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses}
        status["podIP"] = virtual_pod_ip(str(self.pod["metadata"].get("uid") or ""))
        if reason:
            status["reason"], status["message"] = reason, message
        self.outbox.put(f"status {phase}", lambda: self.client.report(self.pod, status))


class VirtualRuntime:
    """The virtual pods of one node, by uid."""

    kind = "virtual"

    def __init__(
        self,
        client: NodeClient,
        *,
        start_delay: float,
        stop_seconds: float,
        log_step: float = 10.0,
    ) -> None:
        self.client = client
        self.log_step = log_step
        self.start_delay = start_delay
        self.stop_seconds = stop_seconds
        self.pods: dict[str, VirtualPod] = {}
        self._later = Background()

    async def resume(self) -> None:
        """Nothing to find: a virtual pod resumes from what the API says of it."""

    def synced(self, uids: set[str]) -> None:
        """Nothing to clean up: a virtual pod leaves nothing behind."""

    def observe(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        known = self.pods.get(uid)
        if event == "DELETED":
            if known is not None:
                if known.task is not None:
                    known.task.cancel()
                self._later(known.outbox.close())
            self.pods.pop(uid, None)
            return
        if known is None:
            virtual = VirtualPod(
                pod, self.client, self.start_delay, self.stop_seconds, self.log_step
            )
            if "deletionTimestamp" in pod["metadata"]:
                virtual.stopping.set()
            virtual.task = asyncio.create_task(self._guard(virtual))
            self.pods[uid] = virtual
            return
        known.pod = pod
        # Ended by the control plane (preempted, lost): its containers are gone.
        ended_elsewhere = pod["status"].get("phase") == "Failed" and pod["status"].get(
            "reason"
        ) in ("Preempted", "NodeLost")
        if ended_elsewhere and known.task is not None and not known.task.done():
            known.task.cancel()
        if "deletionTimestamp" in pod["metadata"]:
            known.stopping.set()
            if known.task is not None and known.task.done():  # it ended: remove it now
                known.task = None
                known._remove()

    async def _guard(self, virtual: VirtualPod) -> None:
        try:
            await virtual.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: virtual pod failed", self.client.node)

    async def close(self) -> None:
        for virtual in self.pods.values():
            if virtual.task is not None:
                virtual.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await virtual.task
            await virtual.outbox.close()
