"""Resource usage for `kubectl top`: every `metrics_seconds` the agent reports its pods' usage
per container and its node's (the sum of its pods') to the API (`POST
/api/v1/nodes/{node}/usage`), which serves it as metrics.k8s.io NodeMetrics and PodMetrics.

A runtime with `usage()` measures it (the docker runtime: the engine's stats, CPU as the rate
of the container's CPU time since the last report, memory as its working set: usage less
inactive file pages, as the kubelet counts it); one without (the virtual runtime: its pods run
nothing) reports what each container requests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from agent.client import NodeClient

log = logging.getLogger("tessera.agent.metrics")
STATS_AT_ONCE = 4  # the engine's stats of a node's containers asked at once

UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def cpu_nanocores(text: Any) -> int:
    value = str(text or "0").strip()
    try:
        if value.endswith("m"):
            return int(float(value[:-1]) * 1_000_000)
        if value.endswith("n"):
            return int(float(value[:-1]))
        return int(float(value) * 1_000_000_000)
    except ValueError:
        return 0


def memory_bytes(text: Any) -> int:
    value = str(text or "0").strip()
    try:
        for suffix, factor in UNITS.items():
            if value.endswith(suffix):
                return int(float(value[: -len(suffix)]) * factor)
        return int(float(value))
    except ValueError:
        return 0


def requested(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the virtual runtime reports: each running container's requests (else limits)."""
    out = []
    for pod in pods:
        if pod["status"].get("phase") != "Running":
            continue
        containers = []
        for c in pod["spec"].get("containers", []):
            resources = c.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            containers.append(
                {
                    "name": c["name"],
                    "cpu": cpu_nanocores(wanted.get("cpu")),
                    "memory": memory_bytes(wanted.get("memory")),
                }
            )
        meta = pod["metadata"]
        out.append({"namespace": meta["namespace"], "name": meta["name"], "containers": containers})
    return out


async def measure(runtime: Any, window: float) -> list[dict[str, Any]]:
    usage = getattr(runtime, "usage", None)
    if usage is not None:
        return list(await usage())
    pods = [p.pod for p in getattr(runtime, "pods", {}).values()]
    return requested(pods)


async def report_metrics(client: NodeClient, runtime: Any, timing: Any) -> None:
    window = float(timing.metrics_seconds)
    while True:
        await asyncio.sleep(window)
        try:
            pods = await measure(runtime, window)
            node = {
                "cpu": sum(c["cpu"] for p in pods for c in p["containers"]),
                "memory": sum(c["memory"] for p in pods for c in p["containers"]),
            }
            response = await client.http.post(
                f"/api/v1/nodes/{client.node}/usage",
                json={"window": window, "node": node, "pods": pods},
            )
            if response.status_code >= 400:
                log.warning(
                    "node %s: usage report refused (%s): %s",
                    client.node,
                    response.status_code,
                    response.text[:300],
                )
        except asyncio.CancelledError:
            raise
        except (httpx.HTTPError, OSError) as exc:
            log.info("node %s: usage not reported: %s", client.node, exc)
        except Exception:
            log.exception("node %s: usage not measured", client.node)


async def docker_usage(
    runtime: Any, previous: dict[str, tuple[float, int]]
) -> list[dict[str, Any]]:
    """Each running pod container's usage from the engine's stats (one-shot, no waiting).
    `previous`: by container id, the last (monotonic time, CPU nanoseconds) seen."""
    from agent.docker import CONTAINER, POD_NAME, POD_NAMESPACE, SANDBOX

    loop = asyncio.get_running_loop()
    running = [  # the pod's containers: its sandbox (which only holds its network) is none
        c for c in await runtime.running_containers() if c["Labels"].get(CONTAINER) != SANDBOX
    ]
    # a few at a time: a node's hundreds of containers at once would hold back the engine's
    # starts of the pods arriving meanwhile
    turns = asyncio.Semaphore(STATS_AT_ONCE)

    async def stats_of(
        info: dict[str, Any],
    ) -> tuple[dict[str, Any], dict[str, Any] | None, float]:
        try:
            async with turns:
                stats = await runtime.docker._query_json(
                    f"containers/{info['Id']}/stats",
                    params={"stream": "false", "one-shot": "true"},
                )
        except Exception:
            return info, None, loop.time()
        return info, stats, loop.time()  # the time of this sample, not of the slowest one's

    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    seen = set()
    for info, stats, at in await asyncio.gather(*(stats_of(c) for c in running)):
        if not stats:
            continue
        labels = info["Labels"]
        cid = info["Id"]
        seen.add(cid)
        total = int(((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0)
        before = previous.get(cid)
        previous[cid] = (at, total)
        if before is None or at <= before[0] or total < before[1]:
            continue  # a rate needs two samples: reported from the next one (as metrics-server)
        cpu = int((total - before[1]) / (at - before[0]))  # ns of CPU a second: nanocores
        memory_stats = stats.get("memory_stats") or {}
        detail = memory_stats.get("stats") or {}
        inactive = int(detail.get("inactive_file") or detail.get("total_inactive_file") or 0)
        memory = max(int(memory_stats.get("usage") or 0) - inactive, 0)
        key = (labels.get(POD_NAMESPACE, ""), labels.get(POD_NAME, ""))
        pods.setdefault(key, []).append(
            {"name": labels.get(CONTAINER, ""), "cpu": cpu, "memory": memory}
        )
    for cid in set(previous) - seen:
        previous.pop(cid, None)
    return [
        {"namespace": ns, "name": name, "containers": containers}
        for (ns, name), containers in sorted(pods.items())
        if ns and name
    ]
