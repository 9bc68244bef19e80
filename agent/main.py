"""Run the agent for one or many nodes (`tessera agent --runtime docker|virtual`).

The inventory file (YAML) names the API and the nodes, each with its node token:

    server: https://127.0.0.1:8443
    caCert: .tessera/tls/ca.crt        # optional
    nodes:
      - name: gpu-a-1
        token: tsr_...
        runtime: docker                # optional: docker or virtual (default: the agent's)
        register: {...}                # optional: a v1 Node to create when it does not exist

`tessera dev` writes one for the demo pool (data dir, virtual-nodes.yaml).

Fault injection (virtual nodes): the admin annotates a Node
`tessera.io/inject-gpu-fault: "gpu0:xid:79"` (`<gpu>:<kind>[:<xid>]`, the GPU as its index
suffix `gpu0` or its full name; kind ecc, xid, bus or driver). The agent, which reads its Node
at every heartbeat, reports the fault through the API (`POST .../gpudevices/{gpu}/fault`, as a
real node's agent would on an Xid) and removes the annotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from agent.client import Gone, NodeClient, verify_for
from agent.metrics import report_metrics
from agent.runtime import RUNTIME_LABEL, Runtime, VirtualRuntime
from agent.sessions import SessionHub

RUNTIMES = ("virtual", "docker")

log = logging.getLogger("tessera.agent")
INJECT_GPU_FAULT = "tessera.io/inject-gpu-fault"
MAX_INJECTION_CHARS = 256


def parse_injection(node: str, value: str) -> tuple[str, dict[str, Any]]:
    """`gpu0:xid:79` -> ("<node>-gpu0", {"kind": "xid", "xid": 79, ...}); ValueError saying
    what is wrong."""
    parts = value.strip()[:MAX_INJECTION_CHARS].split(":")
    if len(parts) not in (2, 3) or not parts[0] or parts[1] not in ("ecc", "xid", "bus", "driver"):
        raise ValueError(
            f'{INJECT_GPU_FAULT} must read "<gpu>:<kind>[:<xid>]" with kind ecc, xid, bus or '
            f'driver, like "gpu0:xid:79"; got "{value[:64]}"'
        )
    gpu = parts[0] if parts[0].startswith(f"{node}-") else f"{node}-{parts[0]}"
    spec: dict[str, Any] = {"kind": parts[1], "message": f"injected through {INJECT_GPU_FAULT}"}
    if len(parts) == 3:
        if not parts[2].isdigit() or len(parts[2]) > 3:
            raise ValueError(
                f'{INJECT_GPU_FAULT}: the Xid must be a number 1-999, got "{parts[2]}"'
            )
        spec["xid"] = int(parts[2])
    return gpu, spec


@dataclass(frozen=True)
class NodeEntry:
    name: str
    token: str
    register: dict[str, Any] | None = None
    runtime: str | None = None  # None: the agent's default


@dataclass(frozen=True)
class Inventory:
    server: str
    ca_cert: Path | None
    nodes: tuple[NodeEntry, ...]


@dataclass(frozen=True)
class Timing:
    heartbeat: float
    lease_seconds: int
    start_delay: float
    stop_seconds: float
    log_step: float = 10.0
    runtime: str = "virtual"  # of the nodes whose entry names none
    docker_host: str | None = None  # of the docker runtime (None: DOCKER_HOST, the default)
    session_max: int = 32  # sessions (exec, attach, port-forward) a node runs at once
    relay_image: str = "busybox:stable"  # port-forward's relay (docker runtime)
    metrics_seconds: float = 15.0  # how often usage is reported (`kubectl top`)
    gpu_file: Path | None = None  # the host's GPUs described (docker runtime; else NVML's)
    mps_image: str = "nvidia/cuda:12.4.1-base-ubuntu22.04"  # a GPU's MPS control daemon
    mps_command: tuple[str, ...] = ("nvidia-cuda-mps-control", "-f")
    nvidia_runtime: bool = True  # False: the engine has none (tests): no device requests
    pod_egress: bool = False  # the pods' networks route out of the host (docker runtime)


def load_inventory(path: Path) -> Inventory:
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise ValueError(f"{path}: expected a mapping with server and a list of nodes")
    nodes = []
    for i, entry in enumerate(raw["nodes"]):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("token"):
            raise ValueError(f"{path}: nodes[{i}] needs a name and a token")
        runtime = entry.get("runtime")
        if runtime is not None and runtime not in RUNTIMES:
            raise ValueError(
                f"{path}: nodes[{i}].runtime must be docker or virtual, not {runtime!r}"
            )
        nodes.append(
            NodeEntry(
                str(entry["name"]),
                str(entry["token"]),
                entry.get("register"),
                str(runtime) if runtime is not None else None,
            )
        )
    ca = raw.get("caCert")
    return Inventory(str(raw.get("server") or ""), Path(ca) if ca else None, tuple(nodes))


def write_inventory(path: Path, inventory: Inventory) -> None:
    body: dict[str, Any] = {
        "server": inventory.server,
        "nodes": [
            {"name": n.name, "token": n.token, **({"runtime": n.runtime} if n.runtime else {})}
            for n in inventory.nodes
        ],
    }
    if inventory.ca_cert:
        body["caCert"] = str(inventory.ca_cert)
    # Written whole or not at all (a reader, such as an agent starting meanwhile, never sees
    # half a file): to a file beside it, then renamed over it. Tokens: never readable by
    # others, even briefly.
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.touch(mode=0o600, exist_ok=True)
    partial.chmod(0o600)
    partial.write_text(yaml.safe_dump(body, sort_keys=False))
    os.replace(partial, path)


class NodeAgent:
    """One node: its lease and its pods."""

    def __init__(self, entry: NodeEntry, inventory: Inventory, timing: Timing) -> None:
        self.entry = entry
        self.timing = timing
        self.client = NodeClient(
            inventory.server, entry.token, entry.name, ca_cert=inventory.ca_cert
        )
        self.runtime = make_runtime(entry.runtime or timing.runtime, self.client, timing)

    async def run(self) -> None:
        await self._retry(lambda: self.client.register(self._manifest()))
        await self._retry(self._label)
        await self.runtime.resume()
        sessions = SessionHub(self.client, self.runtime, max_sessions=self.timing.session_max)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._lease())
                group.create_task(self._pods())
                group.create_task(sessions.run())
                group.create_task(report_metrics(self.client, self.runtime, self.timing))
        finally:
            await sessions.close()
            await self.runtime.close()
            await self.client.close()

    def _manifest(self) -> dict[str, Any] | None:
        """The Node to create when it does not exist: the inventory's, else (docker runtime)
        this host as it is (agent/host.py), else none."""
        if self.entry.register is not None or self.runtime.kind != "docker":
            return self.entry.register
        from agent.host import host_gpus, node_manifest

        return node_manifest(self.entry.name, host_gpus(self.timing.gpu_file))

    async def _retry(self, call: Any) -> Any:
        delay = 0.2
        while True:
            try:
                return await call()
            except (httpx.HTTPError, OSError) as exc:
                log.warning("node %s: %s; retrying", self.entry.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _label(self) -> None:
        labelled = await self.client.label({RUNTIME_LABEL: self.runtime.kind})
        if labelled.status_code >= 400:
            log.warning(
                "node %s: label %s=%s not set (%s): %s",
                self.entry.name,
                RUNTIME_LABEL,
                self.runtime.kind,
                labelled.status_code,
                labelled.text[:300],
            )

    async def _lease(self) -> None:
        while True:
            try:
                await self.client.renew(self.timing.lease_seconds)
            except (httpx.HTTPError, OSError) as exc:
                log.warning("node %s: lease not renewed: %s", self.entry.name, exc)
            try:
                await self._injected_faults()
            except (httpx.HTTPError, OSError) as exc:
                log.warning("node %s: node not read: %s", self.entry.name, exc)
            await asyncio.sleep(self.timing.heartbeat)

    async def _injected_faults(self) -> None:
        """Report the GPU fault the Node's annotation asks for. The annotation is removed first,
        on the Node as read (a conflict: read again next heartbeat), so a fault is reported once
        even when the report itself changes the Node."""
        node = await self.client.get_node()
        value = (node["metadata"].get("annotations") or {}).get(INJECT_GPU_FAULT)
        if value is None:
            return
        removed = await self.client.unannotate(
            INJECT_GPU_FAULT, node["metadata"]["resourceVersion"]
        )
        if removed.status_code >= 400:
            return  # the Node changed meanwhile: next time
        try:
            gpu, spec = parse_injection(self.entry.name, str(value))
        except ValueError as exc:
            log.warning("node %s: %s; annotation removed", self.entry.name, exc)
            return
        reported = await self.client.report_fault(gpu, spec)
        if reported.status_code >= 400:
            log.warning(
                "node %s: injected fault of %s refused (%s): %s",
                self.entry.name,
                gpu,
                reported.status_code,
                reported.text[:300],
            )
            return
        log.info("node %s: reported the injected fault %s of %s", self.entry.name, value, gpu)

    async def _pods(self) -> None:
        while True:
            try:
                pods, version = await self.client.list_pods()
                for pod in pods:
                    self.runtime.observe("ADDED", pod)
                self.runtime.synced({p["metadata"]["uid"] for p in pods})
                while True:
                    async for kind, obj in self.client.watch_pods(version):
                        if kind == "BOOKMARK":
                            version = obj["metadata"]["resourceVersion"]
                            continue
                        version = obj["metadata"].get("resourceVersion", version)
                        self.runtime.observe(kind, obj)
            except Gone:
                continue
            except (httpx.HTTPError, OSError, ValueError) as exc:
                log.warning("node %s: pod watch ended: %s; listing again", self.entry.name, exc)
                await asyncio.sleep(0.5)


async def run(inventory: Inventory, timing: Timing) -> None:
    """Act for every node of the inventory until cancelled."""
    # One line per request the agents make (httpx logs each at INFO) would bury what matters.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
    agents = [NodeAgent(entry, inventory, timing) for entry in inventory.nodes]
    if not agents:
        log.warning("the inventory names no node: idle until restarted with one")
        await asyncio.Event().wait()
    await wait_for_server(inventory)
    log.info("acting for %d node(s) against %s", len(agents), inventory.server)
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


SERVER_PROBE_SECONDS = 0.1  # between looks at a server that does not answer yet
SERVER_QUIET_SECONDS = 2.0  # a server starting as quickly as this is not reported
SERVER_REPORT_SECONDS = 10.0  # after that, a server that stays away is reported this often


async def wait_for_server(inventory: Inventory) -> None:
    """Until the API server answers `/healthz`. A server that takes its time (not started, or
    restarting) is reported in one line now and then, not once per node (every node's agent
    would fail the same way)."""
    loop = asyncio.get_running_loop()
    report_at = loop.time() + SERVER_QUIET_SECONDS
    server, verify = inventory.server.rstrip("/"), verify_for(inventory.ca_cert)
    async with httpx.AsyncClient(base_url=server, verify=verify) as http:
        while True:
            try:
                (await http.get("/healthz", timeout=5.0)).raise_for_status()
                return
            except (httpx.HTTPError, OSError) as exc:
                if loop.time() >= report_at:
                    log.warning("waiting for the API server at %s: %s", inventory.server, exc)
                    report_at = loop.time() + SERVER_REPORT_SECONDS
            await asyncio.sleep(SERVER_PROBE_SECONDS)


def make_runtime(kind: str, client: NodeClient, timing: Timing) -> Runtime:
    if kind == "docker":
        from agent.docker import DockerRuntime

        return DockerRuntime(
            client,
            url=timing.docker_host,
            relay_image=timing.relay_image,
            mps_image=timing.mps_image,
            mps_command=list(timing.mps_command),
            nvidia_runtime=timing.nvidia_runtime,
            egress=timing.pod_egress,
        )
    return VirtualRuntime(
        client,
        start_delay=timing.start_delay,
        stop_seconds=timing.stop_seconds,
        log_step=timing.log_step,
    )


def timing_from(settings: Any, runtime: str | None = None) -> Timing:
    return Timing(
        heartbeat=settings.agent_heartbeat_seconds,
        lease_seconds=settings.node_lease_seconds,
        start_delay=settings.agent_start_delay_seconds,
        stop_seconds=settings.agent_stop_seconds,
        log_step=settings.agent_log_step_seconds,
        runtime=runtime or settings.agent_runtime or "virtual",
        docker_host=settings.docker_host,
        session_max=settings.agent_session_max,
        relay_image=settings.agent_relay_image,
        metrics_seconds=settings.agent_metrics_seconds,
        gpu_file=settings.agent_gpu_file,
        mps_image=settings.agent_mps_image,
        mps_command=tuple(settings.agent_mps_command),
        nvidia_runtime=settings.agent_nvidia_runtime,
        pod_egress=settings.agent_pod_egress,
    )
