"""Pod create to Running on one node: the docker runtime (real containers), and the virtual one
beside it in the same run.

    tessera bench start --pods 200 --clients 8

Starts the production shape of Tessera on a fresh PostgreSQL database (`tessera serve`,
`tessera scheduler`) and two node agents, each its own process acting for one node: `tessera
agent --runtime docker` against the Docker engine at DOCKER_HOST, and `tessera agent --runtime
virtual`. The image is present on the engine (`--image`; imagePullPolicy Never, so no pull is
timed). For each runtime, one pod first (the tenant's network, the sandbox image: made once,
not measured), then `--pods` pods `sleep`ing, created from `--clients` concurrent connections,
each with a nodeSelector for its runtime's node, in two modes (`--mode`), one after the other,
each on a node of its own with an agent of its own (nothing of one mode left to the next):

- `in-flight`: each client keeps one pod starting at a time, creating the next once its previous
  one is Running (`--clients` pods in flight): the per-pod path at a load the node sustains, the
  load at which Kubernetes measures its pod startup SLO (5 s at p99);
- `at-once`: every client creates its pods as fast as the API takes them, so the whole burst
  reaches the node at once: its p99 is bounded by the burst over the engine's start rate.

Reported per runtime: create to Running p50 and p99 (from the moment the bench sent the pod's
create to the moment a watch opened before the first create showed it Running: one clock, the
bench's), pods started per second (the first create to the last pod Running), the agent's CPU
per pod started (its process's user + system time over the phase), the API's and the
scheduler's CPU beside it, and on the docker runtime the engine's (dockerd, containerd and the
containers' shims). The virtual runtime waits TESSERA_AGENT_START_DELAY_SECONDS (0.5 s by
default) before it reports a pod Running: its figures are the control plane's path plus that.
`--redis-url` puts Redis between the processes, as the compose stack does (without it the
scheduler looks for pods every 0.5 s and the API's watches look for its binds every second).
`--out FOLDER` writes start.json and start.png (each runtime's create-to-Running distribution).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.api_create import _free_port, _fresh_postgres
from bench.burst import _processes, _tessera, cpu_by_role, start_stack
from bench.stats import quantile

RUNTIMES = ("docker", "virtual")
MODES = ("in-flight", "at-once")
MODE_LABEL = "bench.tessera.io/mode"  # each mode its own node, picked by this label
NAMESPACE = "start"
ENGINE_PROCESSES = ("dockerd", "containerd", "containerd-shim", "runc")
DEFAULT_IMAGE = "tessera-test/busybox:1"  # tests/engine.py builds it (`make test` does)


@dataclass
class Phase:
    runtime: str
    mode: str  # in-flight (one pod starting per client at a time) or at-once (the whole burst)
    pods: int
    clients: int
    running: int
    create_errors: int
    first_error: str
    create_to_running_p50_s: float
    create_to_running_p99_s: float
    create_to_running_max_s: float
    create_to_bind_p50_s: float  # the scheduler's part (the watch saw spec.nodeName set)
    create_to_bind_p99_s: float
    # on the docker runtime, each pod's way to Running in steps (p50, p99 of each), from the
    # engine's event stream: bound -> the agent's first create on the engine; that create ->
    # its container started; started -> the watch showing the pod Running
    steps_s: dict[str, list[float]]
    seconds: float  # the first create to the last pod Running
    most_in_flight: int  # the most pods created and not yet seen Running at one time
    started_per_second: float
    agent_cpu_ms_per_start: float
    cpu_seconds: dict[str, float]  # by process over the phase
    latencies_s: list[float] = field(default_factory=list)  # each pod's create to Running


@dataclass
class Result:
    pods: int
    clients: int
    image: str
    virtual_start_delay_s: float
    uptime: str  # the machine's load when it began (a shared machine)
    phases: list[Phase]
    uptime_end: str = ""  # and when it ended


def _engine_cpu() -> float:
    return sum(cpu for name, _, cpu in _processes().values() if name.startswith(ENGINE_PROCESSES))


def _pod(name: str, runtime: str, mode: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "start"}},
        "spec": {
            # its node alone has both (labelled by its agent, and by the bench)
            "nodeSelector": {"tessera.io/runtime": runtime, MODE_LABEL: mode},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }


async def _phase(
    base: str,
    context: ssl.SSLContext,
    token: str,
    *,
    runtime: str,
    mode: str,
    prefix: str,
    image: str,
    pods: int,
    clients: int,
    timeout: float,
    progress: Callable[[str], None],
    docker_host: str | None = None,
    node: str = "",
) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[str], float, Engine]:
    """Create `pods` pods on `runtime`'s node from `clients` connections and watch them to
    Running: (send time, bound time and Running time by name, errors, the end of the phase,
    the engine's events about the pods' containers when `node` runs on the docker runtime).
    In `mode` in-flight, each client creates its next pod once its last one is Running."""
    import httpx

    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    running: dict[str, float] = {}
    errors: list[str] = []
    seen: dict[str, asyncio.Event] = {}  # by name: the watch showed it Running (in-flight)
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, verify=context, timeout=60, limits=limits
    ) as http:
        listed = await http.get(path, params={"limit": 1})
        listed.raise_for_status()
        version = listed.json()["metadata"]["resourceVersion"]
        everyone = asyncio.Event()

        async def watch() -> None:
            params = {"watch": "1", "resourceVersion": version, "labelSelector": "app=start"}
            async with http.stream("GET", path, params=params, timeout=None) as stream:
                async for line in stream.aiter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    pod = event.get("object") or {}
                    name = (pod.get("metadata") or {}).get("name", "")
                    phase = (pod.get("status") or {}).get("phase")
                    if not name.startswith(prefix):
                        continue
                    if (pod.get("spec") or {}).get("nodeName") and name not in bound:
                        bound[name] = time.perf_counter()
                    if phase == "Running" and name not in running:
                        running[name] = time.perf_counter()
                        seen.setdefault(name, asyncio.Event()).set()
                        if len(running) == pods:
                            everyone.set()

        names = iter(f"{prefix}{i}" for i in range(pods))

        async def client() -> None:
            for name in names:
                body = _pod(name, runtime, mode, image)
                sent[name] = time.perf_counter()
                response = await http.post(path, json=body)
                if response.status_code != 201:
                    errors.append(f"{response.status_code}: {response.text[:300]}")
                elif mode == "in-flight":  # the next one once this one runs
                    left = deadline - time.perf_counter()
                    try:
                        async with asyncio.timeout(left):
                            await seen.setdefault(name, asyncio.Event()).wait()
                    except TimeoutError:
                        errors.append(f"{name} not Running within the phase's {timeout:g} s")
                        return

        engine = Engine()
        events = asyncio.create_task(engine.follow(docker_host, node)) if node else None
        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)  # the watch (and the engine's events) open before the first create
        began = time.perf_counter()
        deadline = began + timeout
        creating = asyncio.gather(*(client() for _ in range(clients)))
        while not everyone.is_set() and time.perf_counter() < deadline:
            if watcher.done():
                watcher.result()  # the watch ended: say why
                raise RuntimeError("the watch of the pods ended")
            try:
                async with asyncio.timeout(1.0):
                    await everyone.wait()
            except TimeoutError:
                progress(
                    f"  {time.perf_counter() - began:6.1f} s: {len(sent)} created, "
                    f"{len(running)} running"
                )
            if creating.done() and errors and len(running) + len(errors) >= pods:
                break
        await creating
        ended = max(running.values(), default=time.perf_counter())
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await watcher
        if events is not None:
            events.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await events
    return sent, bound, running, errors, ended, engine


@dataclass
class Engine:
    """The engine's container events about the phase's pods, on the bench's clock: the first
    container created for each pod and the start of its container `main`."""

    created: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # events by action

    async def follow(self, docker_host: str | None, node: str) -> None:
        import aiodocker

        docker = aiodocker.Docker(url=docker_host)
        # the engine stamps its events on the wall clock: moved onto perf_counter's
        offset = time.perf_counter() - time.time()
        try:
            filters = json.dumps({"type": ["container"], "label": [f"tessera.io/node={node}"]})
            async with docker._query(
                "events", method="GET", params={"filters": filters}, timeout=None
            ) as response:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    action = str(event.get("Action") or event.get("status") or "")
                    labels = (event.get("Actor") or {}).get("Attributes") or {}
                    pod = labels.get("tessera.io/pod-name", "")
                    at = int(event.get("timeNano") or 0) / 1e9 + offset
                    self.calls[action] = self.calls.get(action, 0) + 1
                    if action == "create":
                        self.created.setdefault(pod, at)
                    elif action == "start" and labels.get("tessera.io/container") == "main":
                        self.started.setdefault(pod, at)
        finally:
            await docker.close()


def _summary(
    runtime: str,
    *,
    mode: str,
    pods: int,
    clients: int,
    sent: dict[str, float],
    bound: dict[str, float],
    running: dict[str, float],
    errors: list[str],
    ended: float,
    cpu: dict[str, float],
    engine: Engine | None = None,
) -> Phase:
    waits = sorted(running[n] - sent[n] for n in running if n in sent)
    binds = sorted(bound[n] - sent[n] for n in bound if n in sent)
    steps: dict[str, list[float]] = {}
    if engine is not None and engine.created:
        created, started = engine.created, engine.started
        for step, (a, b) in {
            "bind_to_engine": (bound, created),
            "engine_create_to_started": (created, started),
            "started_to_running_seen": (started, running),
        }.items():
            spans = sorted(b[n] - a[n] for n in a if n in b and n in sent)
            steps[step] = [round(quantile(spans, 0.5), 3), round(quantile(spans, 0.99), 3)]
    seconds = ended - min(sent.values(), default=ended)
    # +1 at a pod's create, -1 when it is seen Running (a Running seen first at one instant)
    moves = sorted([(t, 1) for t in sent.values()] + [(t, -1) for t in running.values()])
    flying = most = 0
    for _, change in moves:
        flying += change
        most = max(most, flying)
    return Phase(
        runtime=runtime,
        mode=mode,
        pods=pods,
        clients=clients,
        running=len(running),
        create_errors=len(errors),
        first_error=errors[0] if errors else "",
        create_to_running_p50_s=round(quantile(waits, 0.5), 3),
        create_to_running_p99_s=round(quantile(waits, 0.99), 3),
        create_to_running_max_s=round(max(waits, default=0.0), 3),
        create_to_bind_p50_s=round(quantile(binds, 0.5), 3),
        create_to_bind_p99_s=round(quantile(binds, 0.99), 3),
        steps_s=steps,
        seconds=round(seconds, 2),
        most_in_flight=most,
        started_per_second=round(len(running) / seconds, 1) if seconds > 0 else 0.0,
        agent_cpu_ms_per_start=round(1000 * cpu["agent"] / max(len(running), 1), 1),
        cpu_seconds={k: round(v, 2) for k, v in cpu.items()},
        latencies_s=[round(w, 3) for w in waits],
    )


def _measured_phase(
    stack: Any,
    context: ssl.SSLContext,
    *,
    runtime: str,
    mode: str,
    node: str,
    agent: subprocess.Popen[bytes],
    image: str,
    pods: int,
    clients: int,
    timeout: float,
    progress: Callable[[str], None],
    docker_host: str | None,
) -> Phase:
    """One mode's pods on `runtime`'s node, with the processes' CPU over it."""
    shape = "one at a time from each" if mode == "in-flight" else "all at once from"
    progress(f"{runtime}, {mode}: {pods} pods {shape} {clients} clients onto {node}")
    roots = {
        "agent": agent.pid,
        "api": stack.processes["api"].pid,
        "scheduler": stack.processes["scheduler"].pid,
    }
    before = {**cpu_by_role(roots), "engine": _engine_cpu()}
    sent, bound, running, errors, ended, engine = asyncio.run(
        _phase(
            stack.base,
            context,
            stack.token,
            runtime=runtime,
            prefix=f"{runtime}-{mode}-",
            image=image,
            pods=pods,
            clients=clients,
            timeout=timeout,
            progress=progress,
            mode=mode,
            docker_host=docker_host,
            node=node if runtime == "docker" else "",
        )
    )
    after = {**cpu_by_role(roots), "engine": _engine_cpu()}
    cpu = {k: after[k] - before.get(k, 0.0) for k in after}
    # PostgreSQL's backends come and go (the sum over those alive is no measure)
    cpu.pop("postgresql", None)
    if runtime != "docker":
        cpu.pop("engine")
    return _summary(
        runtime,
        mode=mode,
        pods=pods,
        clients=clients,
        sent=sent,
        bound=bound,
        running=running,
        errors=errors,
        ended=ended,
        cpu=cpu,
        engine=engine if runtime == "docker" else None,
    )


def _remove_containers(docker_host: str | None, node: str) -> None:
    """Every container the docker agent made for `node`, and the tenant's network."""

    async def remove() -> None:
        import aiodocker

        docker = aiodocker.Docker(url=docker_host)
        try:
            found = await docker.containers.list(
                all=True, filters={"label": [f"tessera.io/node={node}"]}
            )
            await asyncio.gather(*(c.delete(force=True) for c in found), return_exceptions=True)
            for network in await docker.networks.list():
                if network["Name"] == f"tessera-ns-{NAMESPACE}":
                    with contextlib.suppress(aiodocker.DockerError):
                        await (await docker.networks.get(network["Id"])).delete()
        finally:
            await docker.close()

    asyncio.run(remove())


def _image_present(docker_host: str | None, image: str) -> str:
    """ "" when the engine answers and has `image`, else why not."""

    async def look() -> str:
        import aiodocker

        try:
            docker = aiodocker.Docker(url=docker_host)
        except Exception as exc:  # no DOCKER_HOST and no socket
            return f"no Docker engine: {exc}"
        try:
            await docker.images.inspect(image)
            return ""
        except aiodocker.DockerError as exc:
            return f"the engine has no image {image} ({exc.message}): build it or give --image"
        except Exception as exc:
            return f"no Docker engine answers at {docker_host or 'the default socket'}: {exc}"
        finally:
            await docker.close()

    return asyncio.run(look())


def measure(
    *,
    pods: int,
    clients: int,
    image: str,
    postgres_url: str,
    docker_host: str | None,
    runtimes: tuple[str, ...] = RUNTIMES,
    modes: tuple[str, ...] = MODES,
    timeout: float = 600.0,
    logs_dir: Path | None = None,
    redis_url: str | None = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> Result:
    if "docker" in runtimes and (why := _image_present(docker_host, image)):
        raise RuntimeError(why)
    start_delay = float(os.environ.get("TESSERA_AGENT_START_DELAY_SECONDS", "0.5"))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    nodes = {(r, m): f"start-{r}-{m}" for r in runtimes for m in modes}
    with tempfile.TemporaryDirectory(prefix="tessera-bench-start-") as tmp:
        data = Path(tmp)
        url, drop = _fresh_postgres(postgres_url)
        env = {"TESSERA_NODE_RATE_LIMIT_PER_SECOND": "0", "TESSERA_AGENT_HEARTBEAT_SECONDS": "2"}
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        try:
            # each node its own agent (started per runtime below): no pool, no node loop
            stack = start_stack(
                "postgresql",
                data=data,
                url=url,
                port=_free_port(),
                gpus=0,
                redis_url=redis_url,
                logs=logs_dir or data,
                env=env,
                pool=False,
                node_loop=False,
                tenant=NAMESPACE,
            )
        except BaseException:
            drop()
            raise
        try:
            admin = _tessera(stack.env, "token", "create", "--admin")
            context = ssl.create_default_context(cafile=str(stack.ca))
            _nodes(stack.base, context, admin, nodes)
            phases = []
            for runtime, mode in nodes:
                # each mode on a node of its own with an agent of its own, so that nothing of
                # the last mode (its pods, their containers) is left to the next
                node = nodes[runtime, mode]
                agent = stack.start_agent(runtime, node)
                _until_labelled(stack.base, context, admin, node, runtime)
                progress(f"{runtime}: one pod first (the tenant's network, the sandbox image)")
                asyncio.run(
                    _phase(
                        stack.base,
                        context,
                        stack.token,
                        runtime=runtime,
                        mode=mode,
                        prefix=f"warm-{runtime}-{mode}-",
                        image=image,
                        pods=1,
                        clients=1,
                        timeout=120,
                        progress=progress,
                    )
                )
                phase = _measured_phase(
                    stack,
                    context,
                    runtime=runtime,
                    mode=mode,
                    node=node,
                    agent=agent,
                    image=image,
                    pods=pods,
                    clients=clients,
                    timeout=timeout,
                    progress=progress,
                    docker_host=docker_host,
                )
                phases.append(phase)
                progress(report_phase(phase))
                stack.stop_process(f"agent-{runtime}")
                if runtime == "docker":
                    _remove_containers(docker_host, node)
        finally:
            stack.stop()
            for (runtime, _), node in nodes.items():
                if runtime == "docker":
                    _remove_containers(docker_host, node)
            drop()
    ended = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return Result(pods, clients, image, start_delay, uptime, phases, ended)


def _nodes(
    base: str, context: ssl.SSLContext, admin: str, nodes: dict[tuple[str, str], str]
) -> None:
    import httpx

    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {admin}"}, verify=context
    ) as http:
        for (_, mode), name in nodes.items():
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {MODE_LABEL: mode}},
                "status": {"capacity": {"cpu": "64", "memory": "256Gi"}},
            }
            created = http.post("/api/v1/nodes", json=body)
            if created.status_code != 201:
                raise RuntimeError(f"node {name} not created: {created.text[:300]}")


def _until_labelled(
    base: str, context: ssl.SSLContext, admin: str, node: str, runtime: str
) -> None:
    """Until the node's agent has labelled it with its runtime (it acts for it from then)."""
    import httpx

    deadline = time.monotonic() + 60
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {admin}"}, verify=context
    ) as http:
        while time.monotonic() < deadline:
            labels = http.get(f"/api/v1/nodes/{node}").json()["metadata"].get("labels") or {}
            if labels.get("tessera.io/runtime") == runtime:
                return
            time.sleep(0.2)
    raise RuntimeError(f"the {runtime} agent did not take node {node} within 60 s")


def report_phase(phase: Phase) -> str:
    cpu = ", ".join(f"{k} {v} s" for k, v in phase.cpu_seconds.items())
    return (
        f"{phase.runtime}, {phase.mode}: {phase.running}/{phase.pods} Running from "
        f"{phase.clients} clients; "
        f"create to Running p50 {phase.create_to_running_p50_s} s, p99 "
        f"{phase.create_to_running_p99_s} s, max {phase.create_to_running_max_s} s (to bind "
        f"p50 {phase.create_to_bind_p50_s} s, p99 {phase.create_to_bind_p99_s} s); "
        f"{phase.started_per_second} pods started/s ({phase.seconds} s, at most "
        f"{phase.most_in_flight} in flight); agent CPU "
        f"{phase.agent_cpu_ms_per_start} ms per start; CPU: {cpu}"
        + "".join(
            f"; {step} p50 {p50} s, p99 {p99} s" for step, (p50, p99) in phase.steps_s.items()
        )
        + (
            f"; {phase.create_errors} creates refused: {phase.first_error}"
            if phase.create_errors
            else ""
        )
    )


def plot(result: Result, path: Path) -> None:
    """Each runtime's create-to-Running times, as the share of pods Running by then."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for phase in result.phases:
        waits = sorted(phase.latencies_s)
        shares = [(i + 1) / max(phase.pods, 1) for i in range(len(waits))]
        axes.step(
            waits,
            shares,
            where="post",
            label=f"{phase.runtime}, {phase.mode}: p50 {phase.create_to_running_p50_s} s, "
            f"p99 {phase.create_to_running_p99_s} s",
        )
    axes.set_xlabel("seconds from create to Running")
    axes.set_ylabel("share of the pods")
    axes.set_title(f"{result.pods} pods from {result.clients} clients onto one node")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(
    pods: Annotated[int, typer.Option(min=1, max=2000, help="Pods per runtime.")] = 200,
    clients: Annotated[int, typer.Option(min=1, max=64, help="Concurrent connections.")] = 8,
    image: Annotated[
        str, typer.Option(help="The image the pods run; present on the engine (never pulled).")
    ] = DEFAULT_IMAGE,
    runtime: Annotated[
        str, typer.Option(help="docker, virtual, or both (comma-separated).")
    ] = "docker,virtual",
    mode: Annotated[
        str,
        typer.Option(
            help="in-flight (each client creates its next pod once its last is Running), "
            "at-once (the whole burst), or both (comma-separated)."
        ),
    ] = "in-flight,at-once",
    postgres_url: Annotated[
        str, typer.Option(envvar="TESSERA_TEST_POSTGRES_URL")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    docker_host: Annotated[
        str | None, typer.Option(envvar="DOCKER_HOST", help="The Docker engine.")
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(
            help="Redis between the processes (as the compose stack runs them): the API's "
            "commits wake the scheduler, and the scheduler's binds the API's watches, at once. "
            "Without: each looks every TESSERA_WATCH_POLL_SECONDS (1 s), the scheduler every "
            "0.5 s."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for start.json and start.png.")] = Path(
        "bench/results/latest"
    ),
    logs: Annotated[Path | None, typer.Option(help="Keep the processes' logs here.")] = None,
) -> None:
    """Pod create to Running on one node with the docker runtime and the virtual one, with a
    few pods in flight and with the whole burst at once: p50/p99, pods started per second, the
    agent's CPU per start."""
    chosen = tuple(r.strip() for r in runtime.split(",") if r.strip())
    if not chosen or any(r not in RUNTIMES for r in chosen):
        raise typer.BadParameter("--runtime takes docker, virtual or both")
    modes = tuple(m.strip() for m in mode.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        raise typer.BadParameter("--mode takes in-flight, at-once or both")
    try:
        result = measure(
            pods=pods,
            clients=clients,
            image=image,
            postgres_url=postgres_url,
            redis_url=redis_url,
            docker_host=docker_host,
            runtimes=chosen,
            modes=modes,
            logs_dir=logs,
        )
    except RuntimeError as exc:
        typer.secho(f"tessera bench start: {exc}", err=True, fg="red")
        raise typer.Exit(1) from exc
    typer.echo(f"the machine: {result.uptime}; at the end: {result.uptime_end}")
    for phase in result.phases:
        typer.echo(report_phase(phase))
    out.mkdir(parents=True, exist_ok=True)
    (out / "start.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    plot(result, out / "start.png")
    typer.echo(f"wrote {out / 'start.json'} and {out / 'start.png'}", err=True)
