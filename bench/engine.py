"""The Docker engine alone: what one container start costs the machine, and how many it starts a
second, with nothing of Tessera running.

    tessera bench engine --starts 40 --at-once 1,2,4,8 --cpu 0.25,0.01

For each CPU quota and each count of starts at once: `--starts` containers of the busybox test
image (`sleep`), each created and started on an internal bridge network of its own making (as a
namespace's pods are: the agent's container settings, its CPU quota, a memory limit, no swap,
no new privileges), `--at-once` at a time. Reported: starts per second, create+start p50 and
p99, and the machine's busy CPU per start (from /proc/stat, every process on the machine: the
engine, containerd, its shims, runc and the kernel's work, which the engine's own process
counters miss). The bound this gives a node: with K pods in flight, a pod's start takes at
least K / (starts per second) on average (Little's law), and the control plane's processes
take their share of the same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.start import DEFAULT_IMAGE
from bench.stats import quantile


@dataclass
class Trial:
    cpu: float
    at_once: int
    starts: int
    per_second: float
    p50_s: float
    p99_s: float
    machine_cpu_ms_per_start: float
    busy_cores: float


def _busy() -> float:
    """CPU-seconds the machine has been busy (every core, every process)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / 100.0


async def _trial(
    docker: Any, network: str, image: str, cpu: float, at_once: int, starts: int
) -> Trial:
    gate = asyncio.Semaphore(at_once)
    label = f"tessera-bench-engine-{uuid.uuid4().hex[:8]}"
    took: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            config = {
                "Image": image,
                "Cmd": ["sleep", "3600"],
                "Labels": {"tessera.bench": label},
                "HostConfig": {
                    "NetworkMode": network,
                    "CapDrop": ["NET_RAW"],
                    "SecurityOpt": ["no-new-privileges"],
                    "PidsLimit": 4096,
                    "NanoCpus": int(cpu * 1e9),
                    "Memory": 512 << 20,
                    "MemorySwap": 512 << 20,
                },
            }
            began = time.perf_counter()
            container = await docker.containers.create(config, name=f"{label}-{i}")
            await container.start()
            took.append(time.perf_counter() - began)

    busy, began = _busy(), time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(starts)))
        seconds, used = time.perf_counter() - began, _busy() - busy
    finally:
        for container in await docker.containers.list(
            all=True, filters={"label": [f"tessera.bench={label}"]}
        ):
            await container.delete(force=True)
    return Trial(
        cpu=cpu,
        at_once=at_once,
        starts=starts,
        per_second=round(starts / seconds, 2),
        p50_s=round(quantile(took, 0.5), 3),
        p99_s=round(quantile(took, 0.99), 3),
        machine_cpu_ms_per_start=round(used / starts * 1000),
        busy_cores=round(used / seconds, 2),
    )


async def measure(
    docker_host: str | None, image: str, cpus: list[float], at_once: list[int], starts: int
) -> list[Trial]:
    import aiodocker

    docker = aiodocker.Docker(url=docker_host)
    network = f"tessera-bench-engine-{uuid.uuid4().hex[:8]}"
    try:
        await docker.images.inspect(image)
        await docker.networks.create({"Name": network, "Internal": True})
        trials = []
        for cpu in cpus:
            for k in at_once:
                await asyncio.sleep(3)  # the last trial's removals settle
                trial = await _trial(docker, network, image, cpu, k, starts)
                print(report(trial), file=sys.stderr)
                trials.append(trial)
        return trials
    finally:
        with contextlib.suppress(Exception):  # it was never made
            await (await docker.networks.get(network)).delete()
        await docker.close()


def report(trial: Trial) -> str:
    return (
        f"{trial.starts} starts, {trial.at_once} at once, CPU quota {trial.cpu:g}: "
        f"{trial.per_second}/s, create+start p50 {trial.p50_s} s p99 {trial.p99_s} s, "
        f"machine CPU {trial.machine_cpu_ms_per_start:g} ms per start "
        f"({trial.busy_cores} cores busy)"
    )


def main(
    starts: Annotated[int, typer.Option(min=1, max=1000, help="Starts per trial.")] = 40,
    at_once: Annotated[str, typer.Option(help="Starts at once, one trial each.")] = "1,2,4,8",
    cpu: Annotated[str, typer.Option(help="The containers' CPU quotas, one trial each.")] = "0.25",
    image: Annotated[str, typer.Option(help="An image present on the engine.")] = DEFAULT_IMAGE,
    docker_host: Annotated[
        str | None, typer.Option(envvar="DOCKER_HOST", help="The Docker engine.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for engine.json.")] = Path(
        "bench/results/latest"
    ),
) -> None:
    """The engine alone: container starts per second and the machine's CPU per start."""
    try:
        counts = [int(x) for x in at_once.split(",") if x.strip()]
        quotas = [float(x) for x in cpu.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(
            "--at-once takes integers, --cpu numbers (comma-separated)"
        ) from exc
    if not counts or not quotas or any(not 1 <= k <= 64 for k in counts):
        raise typer.BadParameter("--at-once takes 1 to 64, --cpu at least one quota")
    if any(not 0.01 <= q <= 64 for q in quotas):
        raise typer.BadParameter("--cpu takes quotas from 0.01 to 64")
    try:
        trials = asyncio.run(measure(docker_host, image, quotas, counts, starts))
    except Exception as exc:
        typer.secho(f"tessera bench engine: {exc}", err=True, fg="red")
        raise typer.Exit(1) from exc
    for trial in trials:
        typer.echo(report(trial))
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine.json").write_text(json.dumps([asdict(t) for t in trials], indent=2) + "\n")
    typer.echo(f"wrote {out / 'engine.json'}", err=True)
