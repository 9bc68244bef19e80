"""The docker runtime: the node's pods run as real containers through a Docker Engine API.

The engine is the one at `DOCKER_HOST` (a unix socket by default; Podman's Docker-compatible
socket works the same), spoken to with aiodocker. For each container of a pod, as the kubelet
does:

- its image per `imagePullPolicy` (Always, IfNotPresent, Never; the default by tag); a pull
  that fails is `ErrImagePull` with the engine's message in `state.waiting`, then
  `ImagePullBackOff` while the agent waits to try again (10 s doubling to 5 min). With Always,
  an image the engine already has is used when the pull fails (no registry reachable);
- `command` (the image's ENTRYPOINT replaced), `args` (its CMD), `env` (values, and `fieldRef`
  to metadata.name, metadata.namespace, metadata.uid), `workingDir`;
- the CPU and memory the pod was sold (its allocated resources: limits, else requests) as the
  container's `NanoCpus` and `Memory` (no swap), a pids limit, no new privileges, never
  privileged;
- one network per namespace (`tessera-ns-<namespace>`, internal and without a host address on
  its bridge: no route out, no route to another namespace's, with or without the engine's own
  firewall rules), so containers of two tenants never share one nor reach each other;
- its real exit code, `startedAt` and `finishedAt` from the engine, reason `Completed`,
  `Error`, `OOMKilled` (the engine's OOM flag, or a SIGKILL the agent did not send to a container
  with a memory limit) or `ContainerCannotRun` with the engine's
  message;
- `restartPolicy`: Always, OnFailure (a code other than 0) or Never, a restart waiting out
  `CrashLoopBackOff` (10 s doubling to 5 min, back to 10 s after 10 min of running); each run
  is a new container whose restart count is in its labels;
- its stdout and stderr, with the engine's timestamps, sent to the pod's log (`kubectl logs`,
  `-f`, `--previous`);
- a pod being deleted: its containers get the image's stop signal (or SIGTERM), then SIGKILL
  at the end of the pod's grace period; then the agent removes them and the pod;
- `activeDeadlineSeconds`: past it, the containers are stopped and the pod fails with reason
  DeadlineExceeded.

Every container carries labels (pod uid, namespace, name, container, restart count, node and
the Node object's uid, so two control planes' nodes of one name on one engine stay apart), so a
restarted agent finds its containers: one still running is resumed (not started again), one
that ended while the agent was away is reported with its real exit code and times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiodocker
import aiohttp
import httpx
from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError

from agent.client import Background, NodeClient, Outbox

log = logging.getLogger("tessera.agent.docker")

PREFIX = "tessera.io/"
POD_UID = PREFIX + "pod-uid"
POD_NAME = PREFIX + "pod-name"
POD_NAMESPACE = PREFIX + "pod-namespace"
CONTAINER = PREFIX + "container"
RESTART_COUNT = PREFIX + "restart-count"
NODE = PREFIX + "node"
NODE_UID = PREFIX + "node-uid"  # two Node objects of one name (two control planes): apart
NETWORK_PREFIX = "tessera-ns-"

BACKOFF_FIRST = 10.0  # the kubelet's numbers: 10 s doubling to 5 min
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0  # a run this long resets the back-off
PIDS_LIMIT = 4096
MAX_GRACE = 3600
ENDED_ELSEWHERE = ("Preempted", "NodeLost", "GPUFault")  # reasons the control plane fails a pod
LOG_FLUSH_SECONDS = 0.2
LOG_BATCH_LINES = 500
MAX_LOG_LINE = 16 * 1024
# A reference: [host[:port]/]path[:tag][@digest], lower-case path components.
IMAGE_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


class PullFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# --- quantities ---------------------------------------------------------------------------

_SUFFIX = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "m": 1e-3,
}


def quantity(text: Any) -> float | None:
    """A Kubernetes quantity ("500m", "2", "64Mi") as a number, or None."""
    value = str(text).strip()
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]{0,2})", value)
    if not match or (match.group(2) and match.group(2) not in _SUFFIX):
        return None
    return float(match.group(1)) * _SUFFIX.get(match.group(2), 1)


def sold(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """What the pod was sold for one container: the node's allocated resources as the API
    reports them, else the spec's limits over its requests."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == container["name"] and status.get("allocatedResources"):
            return dict(status["allocatedResources"])
    resources = container.get("resources") or {}
    return {**(resources.get("requests") or {}), **(resources.get("limits") or {})}


def host_config(pod: dict[str, Any], container: dict[str, Any], network: str) -> dict[str, Any]:
    resources = sold(pod, container)
    config: dict[str, Any] = {
        "NetworkMode": network,
        "Privileged": False,
        "SecurityOpt": ["no-new-privileges"],
        "PidsLimit": PIDS_LIMIT,
        "CapDrop": ["NET_RAW", "MKNOD", "AUDIT_WRITE"],
        "RestartPolicy": {"Name": "no"},
    }
    cpu = quantity(resources.get("cpu")) if resources.get("cpu") is not None else None
    if cpu:
        config["NanoCpus"] = max(int(cpu * 1e9), 10_000_000)  # the engine's least: 0.01 CPU
    memory = quantity(resources.get("memory")) if resources.get("memory") is not None else None
    if memory:
        config["Memory"] = max(int(memory), 6 << 20)  # the engine refuses less than 6 MiB
        config["MemorySwap"] = config["Memory"]  # no swap
    return config


def environment(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    meta = pod["metadata"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
    }
    out = []
    for item in container.get("env") or []:
        if "value" in item:
            out.append(f"{item['name']}={item.get('value') or ''}")
            continue
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref in fields:
            out.append(f"{item['name']}={fields[ref]}")
    return out


def pull_policy(container: dict[str, Any]) -> str:
    policy = container.get("imagePullPolicy")
    if policy in ("Always", "IfNotPresent", "Never"):
        return str(policy)
    image = str(container.get("image") or "")
    tag = image.rsplit("/", 1)[-1]
    return "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"


def engine_time(text: str | None) -> str | None:
    """The engine's time (nanoseconds) as RFC 3339 with microseconds; None for its zero."""
    if not text or text.startswith("0001-"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    return f"{head}.{(frac + '000000')[:6]}Z" if frac else f"{head}Z"


def _time_of(line: tuple[str, str]) -> str:
    return line[0]


def as_datetime(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def terminated_of(info: dict[str, Any], *, stopped: bool = False) -> dict[str, Any]:
    """The `state.terminated` of an ended container, from the engine's inspect. `stopped`: the
    agent stopped it (a deletion, a deadline)."""
    state = info.get("State") or {}
    code = int(state.get("ExitCode") or 0)
    limited = bool((info.get("HostConfig") or {}).get("Memory"))
    # The engine's OOM flag, or a SIGKILL (137) the agent did not send to a container with a
    # memory limit: the kernel's OOM killer (an engine on cgroup v2 can miss setting its flag
    # when the killed process is the container's first).
    if state.get("OOMKilled") or (code == 137 and limited and not stopped):
        reason = "OOMKilled"
    elif state.get("Error"):
        reason = "ContainerCannotRun"
        code = code or 128  # as the kubelet reports a container the engine could not start
    else:
        reason = "Completed" if code == 0 else "Error"
    out: dict[str, Any] = {
        "exitCode": code,
        "reason": reason,
        "containerID": f"docker://{info.get('Id', '')}",
    }
    if state.get("Error"):
        out["message"] = str(state["Error"])[:1024]
    started, finished = engine_time(state.get("StartedAt")), engine_time(state.get("FinishedAt"))
    if started:
        out["startedAt"] = started
    if finished:
        # the engine stamps the start after the process runs: one that exits at once can
        # show an end a few milliseconds before its start
        out["finishedAt"] = max(finished, started) if started else finished
    return out


# --- one pod ------------------------------------------------------------------------------


@dataclass
class Run:
    """A container of the pod as the agent last saw it."""

    spec: dict[str, Any]
    restarts: int = 0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last: dict[str, Any] = field(default_factory=dict)
    started: bool = False
    done: bool = False  # ended and not restarted
    container_id: str = ""
    image_id: str = ""

    def status(self, *, terminating: bool) -> dict[str, Any]:
        running = "running" in self.state
        return {
            "name": self.spec["name"],
            "ready": running and not terminating,
            "started": running,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id,
            "containerID": self.container_id,
        }


class DockerPod:
    def __init__(self, runtime: DockerRuntime, pod: dict[str, Any]) -> None:
        self.runtime = runtime
        self.pod = pod
        self.client = runtime.client
        meta = pod["metadata"]
        self.uid = meta["uid"]
        self.outbox = Outbox(self.client, f"{meta['namespace']}/{meta['name']}")
        self.stopping = asyncio.Event()
        self.deadline_passed = False
        self.deleted = False  # the API removed the pod while its containers still ran
        self.task: asyncio.Task[None] | None = None
        self.runs = {c["name"]: Run(c) for c in pod["spec"].get("containers", [])}
        for status in pod["status"].get("containerStatuses") or []:
            known = self.runs.get(status.get("name", ""))
            if known is not None:
                known.restarts = int(status.get("restartCount") or 0)
                known.last = status.get("lastState") or {}

    @property
    def docker(self) -> aiodocker.Docker:
        return self.runtime.docker

    @property
    def grace(self) -> int:
        meta = self.pod["metadata"]
        value = meta.get("deletionGracePeriodSeconds")
        if value is None:
            value = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return min(max(int(value or 0), 0), MAX_GRACE)

    # --- reports --------------------------------------------------------------------------

    def report(self, *, reason: str | None = None, message: str | None = None) -> None:
        runs = list(self.runs.values())
        terminating = "deletionTimestamp" in self.pod["metadata"]
        if all(r.done for r in runs) and not terminating:
            codes = [int(r.state.get("terminated", {}).get("exitCode", 1)) for r in runs]
            phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
            if self.deadline_passed:
                phase = "Failed"
        elif any(r.started or r.last for r in runs):
            phase = "Running"
        else:
            phase = "Pending"
        known = self.pod["status"]
        if known.get("phase") == "Failed" and known.get("reason") in ENDED_ELSEWHERE:
            # ended by the control plane (preempted, its node lost): it stays so
            phase, reason, message = "Failed", known["reason"], known.get("message")
        status: dict[str, Any] = {
            "phase": phase,
            "containerStatuses": [r.status(terminating=terminating) for r in runs],
        }
        if reason:
            status["reason"], status["message"] = reason, message
        self.outbox.put(f"status {phase}", lambda: self.client.report(self.pod, status))

    def send_log(self, name: str, restarts: int, lines: list[tuple[str, str]]) -> None:
        self.outbox.put("log", lambda: self.client.send_log(self.pod, name, restarts, lines))

    # --- the pod's life -------------------------------------------------------------------

    async def run(self) -> None:
        phase = self.pod["status"].get("phase")
        found = self.runtime.found.pop(self.uid, [])
        if phase in ("Succeeded", "Failed"):
            for info in found:  # ended: its containers are no longer needed
                await self.runtime.remove_container(info["Id"])
            if "deletionTimestamp" in self.pod["metadata"]:
                await self.finish()
            return
        network = await self.runtime.network(self.pod["metadata"]["namespace"])
        deadline = asyncio.create_task(self._deadline())
        try:
            await asyncio.gather(
                *(self._container(run, network, found) for run in self.runs.values())
            )
        finally:
            deadline.cancel()
        if "deletionTimestamp" in self.pod["metadata"]:
            self.report()
            await self.finish()
        elif self.deadline_passed:
            self.report(
                reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline",
            )
        else:
            self.report()

    async def _deadline(self) -> None:
        seconds = self.pod["spec"].get("activeDeadlineSeconds")
        if seconds is None:
            return
        start = as_datetime(self.pod["status"].get("startTime")) or datetime.now(UTC)
        left = (start + timedelta(seconds=float(seconds)) - datetime.now(UTC)).total_seconds()
        await asyncio.sleep(max(left, 0.0))
        self.deadline_passed = True
        self.stopping.set()

    async def finish(self) -> None:
        await self._cleanup()
        self.outbox.put("removal", lambda: self.client.remove(self.pod))

    async def _cleanup(self) -> None:
        for info in await self.runtime.containers_of(self.uid):
            await self.runtime.remove_container(info["Id"])

    async def _wait_stop(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _container(self, run: Run, network: str, found: list[dict[str, Any]]) -> None:
        name = run.spec["name"]
        mine = sorted(
            (i for i in found if i["Config"]["Labels"].get(CONTAINER) == name),
            key=lambda i: int(i["Config"]["Labels"].get(RESTART_COUNT, "0")),
        )
        current = mine[-1] if mine else None
        if current is not None:
            run.restarts = int(current["Config"]["Labels"].get(RESTART_COUNT, "0"))
        backoff = BACKOFF_FIRST
        pull_backoff = BACKOFF_FIRST
        policy = str(self.pod["spec"].get("restartPolicy") or "Always")
        while True:
            if self.stopping.is_set() and current is None:
                run.done = True
                return
            resumed = current is not None
            if current is None:
                try:
                    current = await self._start(run, network)
                except PullFailed as failed:
                    run.state = {"waiting": {"reason": failed.reason, "message": failed.message}}
                    self.report()
                    if failed.reason == "InvalidImageName":
                        await self.stopping.wait()
                        continue
                    if await self._wait_stop(pull_backoff):
                        continue
                    run.state = {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": f'Back-off pulling image "{run.spec.get("image")}": '
                            f"{failed.message}"[:1024],
                        }
                    }
                    self.report()
                    pull_backoff = min(pull_backoff * 2, BACKOFF_MAX)
                    continue
            container = DockerContainer(self.docker, id=current["Id"])
            run.container_id = f"docker://{current['Id']}"
            run.image_id = str(current.get("Image") or "")
            state = current.get("State") or {}
            began = engine_time(state.get("StartedAt"))
            logs = None
            if state.get("Running"):
                run.state = {"running": {"startedAt": began or self._now()}}
                run.started = True
                self.report()
                since = await self._log_since(name) if resumed else 0.0
                logs = asyncio.create_task(self._forward_logs(container, run, since))
                await self._wait_exit(container)
            elif began:  # it ran and ended already (at once, or while the agent was away)
                run.started = True
                since = await self._log_since(name) if resumed else 0.0
                await self._forward_logs(container, run, since)
            elif resumed and not state.get("Error"):  # created, never started: start anew
                await self.runtime.remove_container(current["Id"])
                current = None
                continue
            info = await container.show()
            if logs is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(logs, 5.0)
            ended = terminated_of(info, stopped=self.stopping.is_set())
            run.state = {"terminated": ended}
            current = None
            restart = not self.stopping.is_set() and (
                policy == "Always" or (policy == "OnFailure" and ended["exitCode"] != 0)
            )
            if not restart:
                run.done = True
                return
            ran = self._seconds(ended)
            if ran >= BACKOFF_RESET:
                backoff = BACKOFF_FIRST
            run.last = {"terminated": ended}
            run.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:g}s restarting failed container={name} "
                    f"pod={self.pod['metadata']['name']}",
                }
            }
            run.started = True
            self.report()
            if await self._wait_stop(backoff):
                run.state = {"terminated": ended}
                run.done = True
                return
            backoff = min(backoff * 2, BACKOFF_MAX)
            run.restarts += 1
            await self.runtime.remove_older(self.uid, name, run.restarts - 1)

    @staticmethod
    def _now() -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @staticmethod
    def _seconds(ended: dict[str, Any]) -> float:
        start, end = as_datetime(ended.get("startedAt")), as_datetime(ended.get("finishedAt"))
        return (end - start).total_seconds() if start and end else 0.0

    async def _wait_exit(self, container: DockerContainer) -> None:
        """Until the container exits; told to stop meanwhile: the stop signal, then SIGKILL at
        the end of the grace period."""
        waiting = asyncio.create_task(container.wait())
        stop = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                grace = 0 if self.deadline_passed else self.grace
                with contextlib.suppress(DockerError):
                    await container.stop(t=grace)
                await waiting
        finally:
            stop.cancel()
            if not waiting.done():
                waiting.cancel()

    async def _log_since(self, name: str) -> float:
        """Where the container's output the API holds ends (a Unix time), 0 for nothing."""
        try:
            tail = await self.client.get_log_tail(self.pod, name)
        except Exception:  # the API away: send all again rather than lose lines
            return 0.0
        at = as_datetime(tail) if tail else None
        return at.timestamp() + 1e-6 if at else 0.0

    async def _forward_logs(self, container: DockerContainer, run: Run, since: float) -> None:
        """The container's stdout and stderr, with the engine's timestamps, to the pod's log:
        each line sent within LOG_FLUSH_SECONDS (in batches when it writes fast), until its
        output ends."""
        name, restarts = run.spec["name"], run.restarts
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        params: dict[str, Any] = {"timestamps": True}
        if since:  # the engine reads "seconds.nanoseconds"
            whole = int(since)
            params["since"] = f"{whole}.{round((since - whole) * 1e6) * 1000:09d}"

        async def read() -> None:
            try:
                async for chunk in container.log(stdout=True, stderr=True, follow=True, **params):
                    for line in chunk.splitlines():
                        lines.put_nowait(line)
            except DockerError as exc:
                log.warning("node %s: logs of %s: %s", self.client.node, name, exc)
            finally:
                lines.put_nowait(None)

        reader = asyncio.create_task(read())
        batch: list[tuple[str, str]] = []
        ended = False
        try:
            while not ended:
                try:
                    line = await asyncio.wait_for(lines.get(), LOG_FLUSH_SECONDS if batch else None)
                except TimeoutError:
                    self.send_log(
                        name, restarts, sorted(batch, key=_time_of)
                    )  # stdout and stderr, by time
                    batch = []
                    continue
                if line is None:
                    ended = True
                    break
                stamp, _, text = line.partition(" ")
                at = engine_time(stamp) if stamp[:1].isdigit() else None
                if at is None:
                    at, text = self._now(), line
                batch.append((at, text[:MAX_LOG_LINE]))
                if len(batch) >= LOG_BATCH_LINES:
                    self.send_log(name, restarts, sorted(batch, key=_time_of))
                    batch = []
        finally:
            if batch:
                self.send_log(name, restarts, sorted(batch, key=_time_of))
            if not reader.done():
                reader.cancel()

    async def _start(self, run: Run, network: str) -> dict[str, Any]:
        spec = run.spec
        image = str(spec.get("image") or "")
        await self.runtime.ensure_image(image, pull_policy(spec))
        meta = self.pod["metadata"]
        labels = {
            POD_UID: self.uid,
            POD_NAME: meta["name"],
            POD_NAMESPACE: meta["namespace"],
            CONTAINER: spec["name"],
            RESTART_COUNT: str(run.restarts),
            NODE: self.client.node,
            NODE_UID: self.runtime.node_uid,
        }
        config: dict[str, Any] = {
            "Image": image,
            "Env": environment(self.pod, spec),
            "Labels": labels,
            "HostConfig": host_config(self.pod, spec, network),
            "Tty": False,
            "OpenStdin": bool(spec.get("stdin")),  # for `kubectl attach -i`
            "StdinOnce": bool(spec.get("stdinOnce")),
            "StopTimeout": self.grace,
        }
        if spec.get("command"):
            config["Entrypoint"] = [str(x) for x in spec["command"]]
            config["Cmd"] = [str(x) for x in spec.get("args") or []]
        elif spec.get("args"):
            config["Cmd"] = [str(x) for x in spec["args"]]
        if spec.get("workingDir"):
            config["WorkingDir"] = str(spec["workingDir"])
        name = f"tessera_{meta['namespace']}_{meta['name']}_{spec['name']}_{run.restarts}"
        name = f"{name[:200]}_{self.uid[:8]}"
        with contextlib.suppress(DockerError):  # a leftover of a start that was cut short
            await DockerContainer(self.docker, id=name).delete(force=True)
        container = await self.docker.containers.create(config, name=name)
        try:
            await container.start()
        except DockerError as exc:
            log.info("node %s: %s cannot run: %s", self.client.node, name, exc.message)
        return await container.show()


# --- the runtime --------------------------------------------------------------------------


class DockerRuntime:
    """The pods of one node as containers of the engine at DOCKER_HOST."""

    kind = "docker"

    def __init__(
        self, client: NodeClient, *, url: str | None = None, relay_image: str = "busybox:stable"
    ) -> None:
        self.client = client
        self.url = url
        self.relay_image = relay_image  # port-forward's relay (agent/docker_sessions.py)
        self._docker: aiodocker.Docker | None = None
        self.pods: dict[str, DockerPod] = {}
        self.found: dict[str, list[dict[str, Any]]] = {}  # by pod uid, at resume
        self._networks: dict[str, str] = {}
        self._pulls: dict[str, asyncio.Lock] = {}
        self.node_uid = ""
        self._later = Background()
        self._network_lock = asyncio.Lock()

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = aiodocker.Docker(url=self.url)
        return self._docker

    async def session(self, offer: dict[str, Any], link: Any) -> dict[str, Any]:
        """exec, attach or port-forward in one of this node's pods (agent/sessions.py)."""
        from agent.docker_sessions import session

        return await session(self, offer, link)

    async def usage(self) -> list[dict[str, Any]]:
        """Its pods' resource usage, for `kubectl top` (agent/metrics.py)."""
        from agent.metrics import docker_usage

        return await docker_usage(self, self.__dict__.setdefault("_cpu_seen", {}))

    async def containers_of(self, uid: str | None = None) -> list[dict[str, Any]]:
        labels = [f"{NODE}={self.client.node}", f"{NODE_UID}={self.node_uid}"]
        labels += [f"{POD_UID}={uid}"] if uid else []
        listed = await self.docker.containers.list(all=True, filters=json.dumps({"label": labels}))
        out = []
        for item in listed:
            with contextlib.suppress(DockerError):
                out.append(await item.show())
        return out

    async def resume(self) -> None:
        """Find the containers this node runs (by label), to resume their pods."""
        delay = 0.5
        while True:
            try:
                self.node_uid = str((await self.client.get_node())["metadata"].get("uid", ""))
                found = await self.containers_of()
                break
            except (DockerError, OSError, httpx.HTTPError) as exc:
                log.warning(
                    "node %s: the Docker engine or the API not answering: %s", self.client.node, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        for info in found:
            uid = info["Config"]["Labels"].get(POD_UID, "")
            self.found.setdefault(uid, []).append(info)
        if found:
            log.info(
                "node %s: found %d container(s) of %d pod(s) to resume",
                self.client.node,
                len(found),
                len(self.found),
            )

    def observe(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        known = self.pods.get(uid)
        if event == "DELETED":
            if known is not None:
                if known.task is not None and not known.task.done():
                    known.stopping.set()  # deleted at once (grace 0): stop what runs
                    known.deleted = True
                    known.pod["metadata"].setdefault("deletionTimestamp", "")
                    known.pod["metadata"]["deletionGracePeriodSeconds"] = 0
                else:  # it ended: its containers go with it
                    self._later(known.outbox.close())
                    self._later(known._cleanup())
                    self.pods.pop(uid, None)
            return
        if known is None:
            docker_pod = DockerPod(self, pod)
            if "deletionTimestamp" in pod["metadata"]:
                docker_pod.stopping.set()
            docker_pod.task = asyncio.create_task(self._guard(docker_pod))
            self.pods[uid] = docker_pod
            return
        known.pod = pod
        ended_elsewhere = (
            pod["status"].get("phase") == "Failed"
            and pod["status"].get("reason") in ENDED_ELSEWHERE
        )
        if ended_elsewhere or "deletionTimestamp" in pod["metadata"]:
            known.stopping.set()
            if (
                known.task is not None
                and known.task.done()
                and "deletionTimestamp" in pod["metadata"]
            ):  # it ended: its containers and the pod go now
                known.task = asyncio.create_task(known.finish())

    def synced(self, uids: set[str]) -> None:
        """After a full listing of the node's pods: containers of pods the API no longer has
        are removed."""
        for uid in [u for u in self.found if u not in uids]:
            for info in self.found.pop(uid):
                self._later(self.remove_container(info["Id"]))

    async def _guard(self, docker_pod: DockerPod) -> None:
        """Run the pod; an engine that goes away (restarted, its socket gone) is waited for and
        the pod resumed from its containers as they are then."""
        delay = 1.0
        while True:
            try:
                await docker_pod.run()
                if docker_pod.deleted:  # gone from the API while it stopped
                    self.pods.pop(docker_pod.uid, None)
                return
            except asyncio.CancelledError:
                raise
            except (DockerError, aiohttp.ClientError, OSError) as exc:
                log.warning(
                    "node %s: the engine failed pod %s (%s); resuming it in %.0fs",
                    self.client.node,
                    docker_pod.pod["metadata"]["name"],
                    exc,
                    delay,
                )
            except Exception:
                log.exception(
                    "node %s: pod %s failed in the runtime",
                    self.client.node,
                    docker_pod.pod["metadata"]["name"],
                )
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
            with contextlib.suppress(DockerError, aiohttp.ClientError, OSError):
                self.found[docker_pod.uid] = await self.containers_of(docker_pod.uid)

    async def network(self, namespace: str) -> str:
        """The namespace's own network (internal), made the first time; "none" when the engine
        cannot make one."""
        name = f"{NETWORK_PREFIX}{namespace}"
        async with self._network_lock:  # the engine would make two of one name
            if name not in self._networks:
                self._networks[name] = await self._make_network(name, namespace)
        return self._networks[name]

    async def _make_network(self, name: str, namespace: str) -> str:
        try:
            await self.docker.networks.get(name)
        except DockerError:
            try:
                await self.docker.networks.create(
                    {
                        "Name": name,
                        "Driver": "bridge",
                        "Internal": True,
                        # no address of the host's on the bridge: nothing routes out of it,
                        # nor to another namespace's bridge, whatever the host's firewall
                        "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"},
                        "Labels": {POD_NAMESPACE: namespace},
                    }
                )
            except DockerError as exc:
                if "already exists" not in exc.message:
                    log.warning(
                        "node %s: no network for %s (%s): its pods run without one",
                        self.client.node,
                        namespace,
                        exc.message,
                    )
                    return "none"
        return name

    async def ensure_image(self, image: str, policy: str) -> None:
        if not image or not IMAGE_REFERENCE.match(image):
            raise PullFailed(
                "InvalidImageName",
                f'Failed to apply default image tag "{image}": invalid reference',
            )
        lock = self._pulls.setdefault(image, asyncio.Lock())
        async with lock:  # one pull of an image at a time
            present = await self._present(image)
            if policy == "Never":
                if not present:
                    raise PullFailed(
                        "ErrImageNeverPull",
                        f'Container image "{image}" is not present with pull policy of Never',
                    )
                return
            if policy == "IfNotPresent" and present:
                return
            try:
                await self.docker.images.pull(image)
            except DockerError as exc:
                if present:  # Always, and no registry answers: the engine's copy will do
                    log.warning(
                        "node %s: pulling %s failed (%s); using the engine's copy",
                        self.client.node,
                        image,
                        exc.message,
                    )
                    return
                raise PullFailed(
                    "ErrImagePull", f'Failed to pull image "{image}": {exc.message}'[:1000]
                ) from exc

    async def _present(self, image: str) -> bool:
        try:
            await self.docker.images.inspect(image)
        except DockerError:
            return False
        return True

    async def remove_container(self, container_id: str) -> None:
        with contextlib.suppress(DockerError):
            await DockerContainer(self.docker, id=container_id).delete(force=True)

    async def remove_older(self, uid: str, name: str, keep_from: int) -> None:
        """Remove the pod's runs of a container before `keep_from` (its logs are the API's)."""
        try:
            infos = await self.containers_of(uid)
        except DockerError:
            return
        for info in infos:
            labels = info["Config"]["Labels"]
            if labels.get(CONTAINER) == name and int(labels.get(RESTART_COUNT, "0")) < keep_from:
                await self.remove_container(info["Id"])

    async def close(self) -> None:
        """Stop acting; the containers go on (a restarted agent resumes them)."""
        tasks: list[Awaitable[Any]] = []
        for docker_pod in self.pods.values():
            if docker_pod.task is not None:
                docker_pod.task.cancel()
                tasks.append(docker_pod.task)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for docker_pod in self.pods.values():
            await docker_pod.outbox.close()
        if self._docker is not None:
            await self._docker.close()
