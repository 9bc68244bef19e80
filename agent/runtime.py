"""The virtual runtime: containers that run for a while and exit, without running anything.

A pod bound to the node starts `start_delay` seconds after the agent sees it and reports
Running. It runs for `tessera.io/run-seconds` (annotation) or, failing that, until
`spec.activeDeadlineSeconds` (then it is stopped: Failed, reason DeadlineExceeded); with
neither it runs until deleted. On exit its code is `tessera.io/exit-code` (default 0):
restartPolicy Always (any code) and OnFailure (code != 0) restart it, counting restarts;
otherwise it ends Succeeded (reason Completed) or Failed (reason Error). A pod being deleted
gets SIGTERM: its containers stop `stop_seconds` later, the agent reports them terminated and
removes the pod (grace 0).

Each run of a container writes its log, sent to the API (`POST .../pods/{name}/log`) before the
status that follows it: what it started (image, command, args), a line every `log_step`
seconds of run time (at most MAX_STEPS a run), the stop it was asked for, and how it exited. A
restart is a new run (its restartCount), so `kubectl logs --previous` shows the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.client import NodeClient, now_text

log = logging.getLogger("tessera.agent.runtime")
RUN_SECONDS = "tessera.io/run-seconds"
EXIT_CODE = "tessera.io/exit-code"
MAX_SECONDS = 366 * 86400.0
CONTAINER = "\x00container\x00"  # in a log line: the container's name
MAX_STEPS = 1000  # "running" lines a run writes at most


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
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        plan = Plan.of(self.pod)
        phase = self.pod["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            if "deletionTimestamp" in self.pod["metadata"]:
                await self.client.remove(self.pod)
            return
        if phase == "Pending" and await self._wait_stop(self.start_delay):
            await self.client.remove(self.pod)  # deleted before it started
            return
        loop = asyncio.get_running_loop()
        began = loop.time()
        restarts = 0
        last: dict[str, Any] | None = None
        if phase == "Running":  # the agent restarted: keep counting from the reported state
            statuses = self.pod["status"].get("containerStatuses") or [{}]
            restarts = int(statuses[0].get("restartCount") or 0)
            last = statuses[0].get("lastState")
        while True:
            started = now_text()
            running = {"running": {"startedAt": started}}
            await self._log(restarts, self._started_lines)
            await self._report("Running", self._statuses(running, restarts, last, True))
            left = None if plan.deadline is None else plan.deadline - (loop.time() - began)
            run_for = plan.run_seconds
            deadline_first = left is not None and (run_for is None or run_for >= left)
            stopped = await self._run_for(
                max(left or 0.0, 0.0) if deadline_first else run_for, restarts
            )
            if stopped:
                grace = int(self.pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                sigterm = f"tessera-runtime: SIGTERM: stopping within {grace}s"
                await self._log(restarts, [sigterm])
                await asyncio.sleep(self.stop_seconds)  # SIGTERM: the container exits
                await self._log(restarts, [_exited(0, "Completed")])
                end = self._terminated(0, "Completed", started)
                await self._report("Running", self._statuses(end, restarts, last, False))
                await self.client.remove(self.pod)
                return
            if deadline_first:
                await self._log(
                    restarts,
                    [
                        f"tessera-runtime: active deadline of {plan.deadline:g}s reached: SIGKILL",
                        _exited(137, "Error"),
                    ],
                )
                end = self._terminated(137, "Error", started)
                await self._report(
                    "Failed",
                    self._statuses(end, restarts, last, False),
                    reason="DeadlineExceeded",
                    message="Pod was active on the node longer than the specified deadline",
                )
                return
            code = plan.exit_code
            reason = "Completed" if code == 0 else "Error"
            await self._log(restarts, [_exited(code, reason)])
            end = self._terminated(code, reason, started)
            if not plan.restarts_after(code):
                phase = "Succeeded" if code == 0 else "Failed"
                await self._report(phase, self._statuses(end, restarts, last, False))
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
                await self._log(restarts, [running])
        return False

    async def _log(
        self, restarts: int, lines: list[str] | Callable[[dict[str, Any]], list[str]]
    ) -> None:
        """Send each container's lines for this run (CONTAINER in a line: its name); a refusal
        is logged, the run goes on."""
        for container in self.pod["spec"].get("containers", []):
            name = container["name"]
            texts = (
                [line.replace(CONTAINER, name) for line in lines]
                if isinstance(lines, list)
                else lines(container)
            )
            try:
                response = await self.client.send_log(self.pod, name, restarts, texts)
            except httpx.HTTPError as exc:
                log.warning("node %s: log not sent: %s", self.client.node, exc)
                continue
            if response.status_code >= 400:
                log.warning(
                    "node %s: log of %s refused (%s): %s",
                    self.client.node,
                    self.pod["metadata"]["name"],
                    response.status_code,
                    response.text[:300],
                )

    def _terminated(self, code: int, reason: str, started: str) -> dict[str, Any]:
        return {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": started,
                "finishedAt": now_text(),
            }
        }

    async def _report(
        self,
        phase: str,
        statuses: list[dict[str, Any]],
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses}
        if reason:
            status["reason"], status["message"] = reason, message
        response = await self.client.report(self.pod, status)
        if response.status_code >= 400:
            log.warning(
                "node %s: status of %s/%s refused (%s): %s",
                self.client.node,
                self.pod["metadata"]["namespace"],
                self.pod["metadata"]["name"],
                response.status_code,
                response.text[:300],
            )


class Runtime:
    """The virtual pods of one node, by uid."""

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

    def observe(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        known = self.pods.get(uid)
        if event == "DELETED":
            if known is not None and known.task is not None:
                known.task.cancel()
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
                known.task = asyncio.create_task(self._remove(known))

    async def _remove(self, virtual: VirtualPod) -> None:
        response = await self.client.remove(virtual.pod)
        if response.status_code >= 400 and response.status_code != 404:
            log.warning(
                "node %s: could not remove %s: %s",
                self.client.node,
                virtual.pod["metadata"]["name"],
                response.text[:300],
            )

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
