"""One NVIDIA MPS control daemon per shared GPU of a docker-runtime node, as NVIDIA's device
plugin runs them: started when the first slice pod of the GPU starts a container, stopped when
the last one has ended.

The daemon is a container of `agent_mps_image` running `agent_mps_command` (by default
`nvidia-cuda-mps-control -f`: the control daemon in the foreground, so that the container
lives as long as it does) with the GPU alone (the engine's device request, and
CUDA_VISIBLE_DEVICES=<its UUID>). Its pipe directory, its log directory and its /dev/shm are
volumes of the engine that every slice container of the GPU mounts at the same places
(CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY): the slices' CUDA programs reach the daemon
there, which enforces the limits each was given (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).

The daemon containers carry `tessera.io/mps-node` and `tessera.io/mps-gpu` labels, not a pod's:
a restarted agent finds a GPU's daemon by its name and keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any

from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.volumes import DockerVolume

if TYPE_CHECKING:
    from agent.docker import DockerRuntime

log = logging.getLogger("tessera.agent")

MPS_NODE = "tessera.io/mps-node"
MPS_GPU = "tessera.io/mps-gpu"
PIPE_DIRECTORY = "/tmp/nvidia-mps"
LOG_DIRECTORY = "/var/log/nvidia-mps"
SHM = "/dev/shm"
VOLUMES = {"pipe": PIPE_DIRECTORY, "log": LOG_DIRECTORY, "shm": SHM}
STOP_SECONDS = 5  # the daemon's grace to quit (`quit` on its pipe is its own way; SIGTERM works)


def _safe(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text)[:80]


class MpsDaemons:
    """The node's MPS control daemons, by GPU (its UUID, or its index where none is known)."""

    def __init__(self, runtime: DockerRuntime, *, image: str, command: list[str]) -> None:
        self.runtime = runtime
        self.image = image
        self.command = command
        self.holders: dict[str, set[str]] = {}  # GPU -> the slice pods that use its daemon
        self._locks: dict[str, asyncio.Lock] = {}

    def name(self, gpu: str) -> str:
        return f"tessera_mps_{_safe(self.runtime.client.node)}_{_safe(gpu)}"

    def volume(self, gpu: str, kind: str) -> str:
        return f"tessera-mps-{_safe(self.runtime.client.node)}-{_safe(gpu)}-{kind}"

    def mounts(self, gpu: str) -> list[dict[str, Any]]:
        return [
            {"Type": "volume", "Source": self.volume(gpu, kind), "Target": target}
            for kind, target in VOLUMES.items()
        ]

    @staticmethod
    def environment() -> list[str]:
        return [
            f"CUDA_MPS_PIPE_DIRECTORY={PIPE_DIRECTORY}",
            f"CUDA_MPS_LOG_DIRECTORY={LOG_DIRECTORY}",
        ]

    async def acquire(self, gpu: str, pod_uid: str) -> list[dict[str, Any]]:
        """The GPU's daemon running (started if it is not), `pod_uid` counted among its slice
        pods; the mounts a slice container of the GPU needs."""
        async with self._locks.setdefault(gpu, asyncio.Lock()):
            self.holders.setdefault(gpu, set()).add(pod_uid)
            await self._ensure(gpu)
        return self.mounts(gpu)

    async def release(self, gpu: str, pod_uid: str) -> None:
        """`pod_uid` no longer uses the GPU's daemon; the last slice pod gone, the daemon and
        its volumes are removed."""
        async with self._locks.setdefault(gpu, asyncio.Lock()):
            holders = self.holders.get(gpu)
            if holders is None or pod_uid not in holders:
                return
            holders.discard(pod_uid)
            if holders:
                return
            del self.holders[gpu]
            container = DockerContainer(self.runtime.docker, id=self.name(gpu))
            with contextlib.suppress(DockerError):
                await container.stop(t=STOP_SECONDS)
            with contextlib.suppress(DockerError):
                await container.delete(force=True)
            for kind in VOLUMES:
                with contextlib.suppress(DockerError):
                    await DockerVolume(self.runtime.docker, self.volume(gpu, kind)).delete()
            log.info("node %s: MPS control daemon of %s stopped", self.runtime.client.node, gpu)

    async def _ensure(self, gpu: str) -> None:
        docker = self.runtime.docker
        name = self.name(gpu)
        with contextlib.suppress(DockerError):
            info = await DockerContainer(docker, id=name).show()
            if (info.get("State") or {}).get("Running"):
                return
            await DockerContainer(docker, id=name).delete(force=True)
        await self.runtime.ensure_image(self.image, "IfNotPresent")
        for kind in VOLUMES:
            await docker.volumes.create(
                {
                    "Name": self.volume(gpu, kind),
                    "Driver": "local",
                    "DriverOpts": {"type": "tmpfs", "device": "tmpfs", "o": "mode=1777"},
                    "Labels": {MPS_NODE: self.runtime.client.node, MPS_GPU: gpu},
                }
            )
        host: dict[str, Any] = {
            "NetworkMode": "none",
            "Privileged": False,
            "SecurityOpt": ["no-new-privileges"],
            "RestartPolicy": {"Name": "no"},
            "Mounts": self.mounts(gpu),
        }
        if self.runtime.nvidia_runtime:
            host["DeviceRequests"] = [
                {"Driver": "nvidia", "DeviceIDs": [gpu], "Capabilities": [["gpu"]]}
            ]
        config: dict[str, Any] = {
            "Image": self.image,
            "Entrypoint": self.command[:1],
            "Cmd": self.command[1:],
            "Env": [
                f"CUDA_VISIBLE_DEVICES={gpu}",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                *self.environment(),
            ],
            "Labels": {MPS_NODE: self.runtime.client.node, MPS_GPU: gpu},
            "HostConfig": host,
        }
        container = await docker.containers.create(config, name=name)
        await container.start()
        log.info("node %s: MPS control daemon of %s started", self.runtime.client.node, gpu)
