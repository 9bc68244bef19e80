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
- the CPU and memory the pod was sold (`sold`: its spec, rounded up from what it asked, which
  it is billed for; a container's own limit where it sets one) as the container's `NanoCpus`
  and `Memory` (no swap), changed in place when the pod is resized; a pids limit, no new
  privileges, never privileged;
- one network per namespace (`tessera-ns-<namespace>`, internal and without a host address on
  its bridge: no route out, no route to another namespace's, with or without the engine's own
  firewall rules), so containers of two tenants never share one nor reach each other;
- a sandbox container holding the pod's network namespace (and its volumes) that its containers
  join, as the kubelet's pause container, for a pod that needs one (`needs_sandbox`): a pod of
  one container that is never restarted holds its network itself, one engine start instead of
  two;
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
import io
import json
import logging
import math
import platform
import re
import struct
import tarfile
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiodocker
import aiohttp
import httpx
from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.volumes import DockerVolume

from agent import probes, volumes
from agent.client import Background, NodeClient, Outbox
from app.constants import ANNOTATION_POD_USE_SPEC, GPU, SAFE_CAPABILITIES
from billing.specs import ComputeSpec

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
SANDBOX = "POD"  # the container label of a pod's sandbox (no container may be named so)
SANDBOX_IMAGE = "tessera-pod-sandbox:1"
# Containers the agent creates and starts on the engine at once (the node's pods beyond wait
# their turn, first come first served). The engine alone on a quiet two-core machine (`tessera
# bench engine`, containers of 0.25 CPU): 2 at once 5.1 starts a second, 4 at once 5.8, 8 at
# once 6.2, each start then 1.2 s; a start costs the machine about 0.3 CPU-seconds, so past a
# few at once more only makes each start wait longer.
STARTS_AT_ONCE = 8
IMAGE_SEEN_SECONDS = 10.0  # an image found present is not looked up again for this long
MAX_IMAGES_SEEN = 256
EMPTY_DIR_SIZE = 1 << 30  # an emptyDir without a sizeLimit holds at most this (tmpfs)
# A pull the registry refused for want of credentials: the engine's copy (pulled for another
# pod, perhaps another tenant's, with its credentials) is not used under Always.
REFUSED_PULL = ("unauthorized", "no basic auth credentials", "denied", "authentication required")
CONFIG_VOLUME_SIZE = 4 << 20  # a configMap or secret volume (the objects hold at most 1 MiB)

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


def _pod_spec(pod: dict[str, Any]) -> dict[str, float]:
    """The CPU (cores) and memory (bytes) the pod was sold and holds, resized or not: its
    `tessera.io/pod-use-spec` (`0.25-0.5Gi`), {} without one."""
    name = str((pod["metadata"].get("annotations") or {}).get(ANNOTATION_POD_USE_SPEC) or "")
    try:
        spec = ComputeSpec.parse(name)
    except ValueError:
        return {}
    return {"cpu": spec.cpu_milli / 1000, "memory": float(spec.memory_mib << 20)}


def _held(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A container's requests and limits, CPU in cores and memory in bytes, as its node holds
    them (the API's `containerStatuses[].resources`: a resize the pod waits for is not there
    yet), else as its spec asks."""
    resources = container.get("resources") or {}
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == container.get("name") and status.get("resources"):
            resources = status["resources"]
    out: dict[str, dict[str, float]] = {}
    for kind in ("requests", "limits"):
        asked = resources.get(kind) or {}
        out[kind] = {
            r: value
            for r in ("cpu", "memory")
            if asked.get(r) is not None and (value := quantity(asked[r])) is not None
        }
    return out


LEAST = {"cpu": 0.01, "memory": float(6 << 20)}  # the engine's least CPU quota and memory
LIMITS = ("NanoCpus", "Memory", "MemorySwap")  # what `limits_of` sets on the engine


def sold(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, float]:
    """The CPU (cores) and memory (bytes) one container gets of what the pod was sold (its
    `tessera.io/pod-use-spec`, which it is billed for: a request rounded up to a sold spec
    gets the whole spec, not the request). A container with a limit gets its limit; an init
    container (they run one at a time, before the others) the pod's whole spec; the other
    containers share what their siblings' limits leave, in proportion to their requests
    (equally when none asks). A pod without a sold spec: the container's limits, else its
    requests."""
    whole = _pod_spec(pod)
    mine = _held(pod, container)
    inits = pod["spec"].get("initContainers") or []
    init = any(c.get("name") == container.get("name") for c in inits)
    siblings = [_held(pod, c) for c in pod["spec"].get("containers") or []]
    out: dict[str, float] = {}
    for resource in ("cpu", "memory"):
        limit, request = mine["limits"].get(resource), mine["requests"].get(resource)
        total = whole.get(resource)
        if total is None:
            value = limit if limit is not None else request
        elif limit is not None:
            value = min(limit, total)
        elif init:
            value = total
        else:
            free = [h for h in siblings if resource not in h["limits"]]
            left = total - sum(h["limits"][resource] for h in siblings if resource in h["limits"])
            weights = sum(h["requests"].get(resource, 0.0) for h in free)
            share = (request or 0.0) / weights if weights else 1 / max(len(free), 1)
            value = max(left * share, request or 0.0)
        if value is not None:
            out[resource] = max(value, LEAST[resource])
    return out


DROPPED = ("NET_RAW",)  # always, whatever the pod asks


def security_context(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The pod's securityContext under the container's (the container's wins, as in
    Kubernetes)."""
    return {
        **(pod["spec"].get("securityContext") or {}),
        **(container.get("securityContext") or {}),
    }


def _capability(name: Any) -> str:
    text = str(name).upper()
    return text[4:] if text.startswith("CAP_") else text


def host_config(
    pod: dict[str, Any], container: dict[str, Any], network: str, cpus: int = 0
) -> dict[str, Any]:
    resources = sold(pod, container)
    context = security_context(pod, container)
    capabilities = context.get("capabilities") or {}
    drop = sorted({_capability(c) for c in capabilities.get("drop") or []} | set(DROPPED))
    add = sorted(
        c for c in {_capability(c) for c in capabilities.get("add") or []} if c in SAFE_CAPABILITIES
    )
    config: dict[str, Any] = {
        "NetworkMode": network,
        "Privileged": False,
        # the engine's default seccomp profile (never unconfined) and no new privileges
        "SecurityOpt": ["no-new-privileges"],
        "PidsLimit": PIDS_LIMIT,
        "CapDrop": ["ALL"] if "ALL" in drop else drop,
        "CapAdd": add,
        "ReadonlyRootfs": bool(context.get("readOnlyRootFilesystem")),
        "RestartPolicy": {"Name": "no"},
    }
    groups = [
        str(int(g))
        for g in pod["spec"].get("securityContext", {}).get("supplementalGroups") or []
        if str(g).isdigit()
    ]
    if context.get("fsGroup") is not None and str(context["fsGroup"]).isdigit():
        groups.append(str(int(context["fsGroup"])))
    if groups:
        config["GroupAdd"] = sorted(set(groups))
    return {**config, **limits_of(resources, cpus)}


def limits_of(resources: dict[str, float], cpus: int = 0) -> dict[str, int]:
    """The engine's CPU quota and memory limit (no swap) for what `sold` gives a container;
    the quota at most the engine's `cpus` (it refuses more than its host has)."""
    out: dict[str, int] = {}
    if resources.get("cpu"):
        cpu = min(resources["cpu"], cpus) if cpus else resources["cpu"]
        out["NanoCpus"] = int(cpu * 1e9)
    if resources.get("memory"):
        out["Memory"] = out["MemorySwap"] = int(resources["memory"])  # no swap
    return out


def user_of(
    pod: dict[str, Any], container: dict[str, Any], image_user: str = ""
) -> tuple[str | None, str | None]:
    """(`runAsUser[:runAsGroup]` as the engine's User, None: the image's; a reason the
    container may not run, or None). `image_user`: the image's own User."""
    context = security_context(pod, container)
    user, group = context.get("runAsUser"), context.get("runAsGroup")
    name = image_user.partition(":")[0]
    if user is not None:
        value = f"{int(user)}:{int(group)}" if group is not None else str(int(user))
    elif group is not None:
        value = f"{name or 0}:{int(group)}"
    else:
        value = None
    if context.get("runAsNonRoot"):
        effective = str(user) if user is not None else (name or "0")
        if effective in ("0", "root"):
            return value, "container has runAsNonRoot and image will run as root"
        if not effective.isdigit():
            return value, (
                f"container has runAsNonRoot and image has non-numeric user ({effective}), "
                "cannot verify user is non-root"
            )
    return value, None


GPU_ALLOCATION = "tessera.io/gpu-allocation"  # the scheduler's: [{gpu, memoryMiB, corePercent}]


def gpu_allocation(pod: dict[str, Any]) -> list[dict[str, Any]]:
    raw = (pod["metadata"].get("annotations") or {}).get(GPU_ALLOCATION)
    try:
        shares = json.loads(raw) if raw else []
    except ValueError:
        return []
    return (
        [s for s in shares if isinstance(s, dict) and s.get("gpu")]
        if isinstance(shares, list)
        else []
    )


def gpu_config(
    pod: dict[str, Any], devices: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """What the engine is asked for the pod's GPUs: `DeviceRequests` for the NVIDIA driver
    naming each GPU the pod was given (its UUID when the GPUDevice says it, else its index on
    the node), and for a slice (a share of a GPU's SMs or memory) NVIDIA MPS's limits as
    environment variables: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the SM share sold) and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (the memory sold, for the one GPU the container sees).
    `devices`: the GPUDevice objects by name."""
    shares = gpu_allocation(pod)
    if not shares:
        return [], []
    ids: list[str] = []
    env: list[str] = []
    for share in shares:
        device = devices.get(str(share["gpu"])) or {}
        spec = device.get("spec") or {}
        ident = spec.get("uuid") or (str(spec["index"]) if spec.get("index") is not None else None)
        if ident is None:  # unknown to the API: its index is the name's suffix (gpu0)
            ident = str(share["gpu"]).rsplit("gpu", 1)[-1]
        ids.append(str(ident))
        whole_memory = quantity(spec.get("memory")) if spec.get("memory") else None
        core = int(share.get("corePercent") or 100)
        memory = int(share.get("memoryMiB") or 0)
        full_memory = whole_memory is None or memory * (1 << 20) >= whole_memory
        if len(shares) == 1 and (core < 100 or not full_memory):
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={core}")
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory}M")
    requests = [{"Driver": "nvidia", "DeviceIDs": ids, "Capabilities": [["gpu"]]}]
    return requests, env


def _divided(value: float, divisor: Any) -> str:
    """A resource as `resourceFieldRef` gives it: rounded up in units of its divisor."""
    unit = quantity(divisor) if divisor is not None else None
    return str(max(math.ceil(value / unit - 1e-9), 1 if value else 0)) if unit else str(value)


def _resource_field(pod: dict[str, Any], spec: dict[str, Any], ref: dict[str, Any]) -> str | None:
    """`resourceFieldRef`: limits.cpu, limits.memory, requests.cpu, requests.memory of a
    container (this one, or the one it names), as sold to the pod."""
    name = ref.get("containerName") or spec["name"]
    every = (pod["spec"].get("containers") or []) + (pod["spec"].get("initContainers") or [])
    target = next((c for c in every if c.get("name") == name), None)
    what = str(ref.get("resource") or "")
    kind, _, resource = what.partition(".")
    if target is None or kind not in ("limits", "requests") or resource not in ("cpu", "memory"):
        return None
    resources = target.get("resources") or {}
    given = (resources.get(kind) or {}).get(resource)
    value = quantity(given) if given is not None else sold(pod, target).get(resource)
    if value is None:
        return None
    return _divided(value, ref.get("divisor") or ("1" if resource == "cpu" else None))


_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: dict[str, Any], path: str, pod_ip: str) -> str | None:
    """`fieldRef`: what the kubelet gives (None: a path it does not know)."""
    meta, spec = pod["metadata"], pod["spec"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": "",
    }
    if path in fields:
        return str(fields[path])
    match = _LABEL_REF.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    return None


def environment(
    pod: dict[str, Any],
    container: dict[str, Any],
    pod_ip: str = "",
    resolved: dict[str, str] | None = None,
) -> list[str]:
    """The container's environment: `envFrom` first, then `env` in order (a later entry wins),
    with `$(VAR)` of an earlier one expanded as the kubelet does. `resolved`: the values of
    ConfigMap and Secret references the agent read (by "configMap/NAME/KEY")."""
    values: dict[str, str] = {}
    resolved = resolved or {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, key in (("configMapRef", "configMap"), ("secretRef", "secret")):
            ref = source.get(kind)
            if not ref:
                continue
            head = f"{key}/{ref.get('name')}/"
            for full, found in resolved.items():
                if full.startswith(head):
                    values[prefix + full[len(head) :]] = found
    for item in container.get("env") or []:
        name = str(item.get("name") or "")
        if "value" in item or not item.get("valueFrom"):
            values[name] = _expand(str(item.get("value") or ""), values)
            continue
        source = item["valueFrom"]
        value: str | None
        if source.get("fieldRef"):
            value = field_value(pod, str(source["fieldRef"].get("fieldPath") or ""), pod_ip)
        elif source.get("resourceFieldRef"):
            value = _resource_field(pod, container, source["resourceFieldRef"])
        elif source.get("configMapKeyRef") or source.get("secretKeyRef"):
            kind = "configMap" if source.get("configMapKeyRef") else "secret"
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
            value = resolved.get(f"{kind}/{ref.get('name')}/{ref.get('key')}")
        else:
            value = None
        if value is not None:
            values[name] = value
    return [f"{k}={v}" for k, v in values.items()]


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(text: str, values: dict[str, str]) -> str:
    """`$(NAME)` of a variable defined before, as the kubelet expands it; `$$` is `$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return values.get(match.group(1), match.group(0))

    return _VAR.sub(one, text)


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


def address_on(info: dict[str, Any], network: str) -> str:
    """A container's address on `network` (its id or name), from the engine's inspect (which
    keys its networks by name)."""
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    for key, attached in networks.items():
        if network in (key, (attached or {}).get("NetworkID")):
            return str((attached or {}).get("IPAddress") or "")
    return ""


_NETWORK_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def network_lock(name: str) -> asyncio.Lock:
    """The lock of one network's name in this process (its event loop): every node's runtime
    here finds or makes it one at a time; other names are not held back."""
    locks = _NETWORK_LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(name, asyncio.Lock())


# --- the pod sandbox ----------------------------------------------------------------------

# A program that waits for ever (pause(2), or ppoll(2) with nothing to poll where pause does
# not exist), by machine: the pod sandbox's only file.
_PAUSE_CODE = {
    "x86_64": (62, bytes.fromhex("b8220000000f05ebf7")),  # mov eax, 34; syscall; jmp back
    "aarch64": (  # x0-x3 = 0; x8 = 73 (ppoll); svc 0; b back
        183,
        bytes.fromhex("000080d2010080d2020080d2030080d2280980d2010000d4faffff17"),
    ),
}
_PAUSE_CODE["amd64"] = _PAUSE_CODE["x86_64"]
_PAUSE_CODE["arm64"] = _PAUSE_CODE["aarch64"]


def pause_program(machine: str | None = None) -> bytes | None:
    """A static ELF executable of one loadable segment running `_PAUSE_CODE` (None: a machine
    without one)."""
    known = _PAUSE_CODE.get((machine or platform.machine()).lower())
    if known is None:
        return None
    arch, code = known
    base, header_size, entry_size = 0x400000, 64, 56
    start = base + header_size + entry_size
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, SysV
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, arch, 1, start, header_size, 0, 0, header_size, entry_size, 1, 0, 0, 0
    )
    size = header_size + entry_size + len(code)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # LOAD, R+X
    return header + segment + code


def sandbox_tar(program: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        entry = tarfile.TarInfo("pause")
        entry.size, entry.mode = len(program), 0o755
        tar.addfile(entry, io.BytesIO(program))
    return out.getvalue()


def needs_sandbox(pod: dict[str, Any]) -> bool:
    """Whether the pod's network namespace (and volumes) must be held by a sandbox container of
    their own: for containers that share them (more than one, init containers), for volumes
    (they live while the sandbox holds them mounted; a configMap's files are written through
    it), for a container that may be restarted (its pod keeps its address through restarts),
    and for `status.podIP` in the environment (known before the container is made). Otherwise
    the pod's one container holds its network itself."""
    spec = pod["spec"]
    containers = spec.get("containers") or []
    if len(containers) != 1 or spec.get("initContainers") or spec.get("volumes"):
        return True
    if spec.get("restartPolicy") != "Never":  # Always by default
        return True
    for item in containers[0].get("env") or []:
        ref = (item.get("valueFrom") or {}).get("fieldRef") or {}
        if ref.get("fieldPath") in ("status.podIP", "status.podIPs"):
            return True
    return False


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

    init: bool = False
    ready: bool = True  # its readiness probe's last answer (True without one)
    starting: bool = False  # its startup probe has not succeeded yet
    killed: bool = False  # stopped by the agent (a failed liveness or startup probe)
    redefined: bool = False  # stopped by the agent to start again with its new image
    limits: dict[str, int] = field(default_factory=dict)  # the running container's, on the engine
    refused: dict[str, int] = field(default_factory=dict)  # limits the engine refused it
    resizing: bool = False  # its limits are being set on the engine

    def status(self, *, terminating: bool) -> dict[str, Any]:
        running = "running" in self.state
        if self.init:  # an init container is ready once it completed
            ready = int(self.state.get("terminated", {}).get("exitCode", 1)) == 0
        else:
            ready = running and self.ready and not terminating
        return {
            "name": self.spec["name"],
            "ready": ready,
            "started": running and not self.starting,
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
        self.event_outbox = Outbox(self.client, f"{meta['namespace']}/{meta['name']} events")
        self.stopping = asyncio.Event()
        self.deadline_passed = False
        self.deleted = False  # the API removed the pod while its containers still ran
        self.task: asyncio.Task[None] | None = None
        self.pod_ip = str(pod["status"].get("podIP") or "")
        self.network_pid = 0  # the process holding the pod's network namespace (its sandbox's)
        self.sandbox_id = ""
        self.volume_errors: dict[str, str] = {}  # a volume whose object is missing: why
        self.inits = {c["name"]: Run(c, init=True) for c in pod["spec"].get("initContainers") or []}
        self.runs = {c["name"]: Run(c) for c in pod["spec"].get("containers", [])}
        for waiting in self.runs.values() if self.inits else ():
            waiting.state = {"waiting": {"reason": "PodInitializing"}}
        for key, runs in (("containerStatuses", self.runs), ("initContainerStatuses", self.inits)):
            for status in pod["status"].get(key) or []:
                known = runs.get(status.get("name", ""))
                if known is not None:
                    known.restarts = int(status.get("restartCount") or 0)
                    known.last = status.get("lastState") or {}
                    if key == "initContainerStatuses" and status.get("state"):
                        known.state = status["state"]
        self.init_failed = False
        self.mps_gpu = ""  # the GPU whose MPS control daemon the pod's slice uses

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

    @property
    def initialized(self) -> bool:
        """Every init container completed (a pod the API says runs: it did)."""
        if self.pod["status"].get("phase") in ("Running", "Succeeded", "Failed"):
            return True
        return all(
            r.done and int(r.state.get("terminated", {}).get("exitCode", 1)) == 0
            for r in self.inits.values()
        )

    def report(self, *, reason: str | None = None, message: str | None = None) -> None:
        runs = list(self.runs.values())
        terminating = "deletionTimestamp" in self.pod["metadata"]
        if self.init_failed and not terminating:
            phase = "Failed"
        elif not self.initialized:
            phase = "Pending"
        elif all(r.done for r in runs) and not terminating:
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
        if self.inits:
            status["initContainerStatuses"] = [
                r.status(terminating=terminating) for r in self.inits.values()
            ]
        if self.pod_ip:
            status["podIP"] = self.pod_ip
        if phase == "Running":
            ready = all(r.status(terminating=terminating)["ready"] for r in runs)
            value = "True" if ready else "False"
            why = None if ready else "ContainersNotReady"
            status["conditions"] = [
                {"type": "ContainersReady", "status": value, **({"reason": why} if why else {})},
                {"type": "Ready", "status": value, **({"reason": why} if why else {})},
            ]
        if reason:
            status["reason"], status["message"] = reason, message
        self.outbox.put(f"status {phase}", lambda: self.client.report(self.pod, status))

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An event about the pod, as the kubelet writes it (`kubectl describe pod`)."""
        kind = "Warning" if warning else "Normal"
        # events go on their own outbox: one the API is slow to take never holds back a status
        self.event_outbox.put(
            f"event {reason}", lambda: self.client.event(self.pod, reason, message, kind)
        )

    def send_log(self, name: str, restarts: int, lines: list[tuple[str, str]]) -> None:
        self.outbox.put("log", lambda: self.client.send_log(self.pod, name, restarts, lines))

    # --- changes while it runs ------------------------------------------------------------

    def respec(self) -> None:
        """The API changed the pod while it runs, as the kubelet follows it: a container whose
        image changed (`kubectl set image`) is stopped and started again with it at once,
        whatever the restart policy; one whose CPU or memory changed (an in-place resize) gets
        them on the engine without a restart."""
        for spec in self.pod["spec"].get("containers") or []:
            run = self.runs.get(spec.get("name", ""))
            if run is None or run.done:
                continue
            image_changed = spec.get("image") != run.spec.get("image")
            run.spec = spec
            if "running" not in run.state:
                continue  # its next start takes the new spec
            if image_changed:
                self._redefine(run)
            else:
                self._resize(run)

    def _redefine(self, run: Run) -> None:
        if run.redefined or not run.container_id:
            return
        run.redefined = run.killed = True
        name = run.spec["name"]
        self.event("Killing", f"Container {name} definition changed, will be restarted")
        container = DockerContainer(self.docker, id=run.container_id.removeprefix("docker://"))
        self.runtime.later(self._stop(container))

    async def _stop(self, container: DockerContainer) -> None:
        with contextlib.suppress(DockerError):
            await container.stop(t=self.grace)

    def _resize(self, run: Run) -> None:
        """The running container's CPU quota and memory limit set to what the pod holds now
        (in the background, one update at a time per container)."""
        if not run.container_id or run.resizing:
            return
        if self.runtime.cpus and self._limits(run, self.runtime.cpus) in (run.limits, run.refused):
            return  # as it is (the common case: a status report's echo)
        run.resizing = True
        self.runtime.later(self._apply_limits(run))

    def _limits(self, run: Run, cpus: int) -> dict[str, int]:
        return limits_of(sold(self.pod, run.spec), cpus)

    async def _apply_limits(self, run: Run) -> None:
        try:
            while True:  # again if the pod changed while the engine was asked
                wanted = self._limits(run, await self.runtime.engine_cpus())
                container_id = run.container_id.removeprefix("docker://")
                if not wanted or wanted in (run.limits, run.refused) or not container_id:
                    return
                try:
                    await self.docker._query_json(
                        f"containers/{container_id}/update", method="POST", data=json.dumps(wanted)
                    )
                except DockerError as exc:  # told once, not at every change of the pod
                    run.refused = wanted
                    message = f"Resizing container {run.spec['name']} failed: {exc.message}"
                    self.event("ResizeFailed", message[:1024], warning=True)
                    return
                run.limits = wanted
                cpu, memory = wanted.get("NanoCpus", 0) / 1e9, wanted.get("Memory", 0) >> 20
                name = run.spec["name"]
                self.event(
                    "ResizedContainer", f"Container {name} now has {cpu:g} CPU, {memory} MiB"
                )
        except (DockerError, aiohttp.ClientError, OSError) as exc:  # the engine away: next change
            log.warning("node %s: resizing a container failed: %s", self.client.node, exc)
        finally:
            run.resizing = False

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
            mode = await self._sandbox(network, found)
            if not self.initialized:
                await self._initialize(mode, found)
            if not self.init_failed and not self.stopping.is_set():
                await asyncio.gather(
                    *(self._container(run, mode, found) for run in self.runs.values())
                )
            else:
                for run in self.runs.values():
                    run.done = True
        finally:
            deadline.cancel()
        with contextlib.suppress(DockerError):
            await self.release_mps()  # its containers ended: it no longer uses the daemon
        if self.sandbox_id:  # every container ended: the pod's network goes with them
            with contextlib.suppress(DockerError):
                await DockerContainer(self.docker, id=self.sandbox_id).kill()
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

    async def _initialize(self, mode: str, found: list[dict[str, Any]]) -> None:
        """The init containers, one after the other, each to its successful end (one that
        fails is restarted after its back-off, unless the pod's restartPolicy is Never: then
        the pod fails)."""
        never = self.pod["spec"].get("restartPolicy") == "Never"
        for run in self.inits.values():
            ended = run.state.get("terminated") or {}
            if run.done or (ended and int(ended.get("exitCode", 1)) == 0):
                run.done = True
                continue
            await self._container(run, mode, found, policy="Never" if never else "OnFailure")
            code = int((run.state.get("terminated") or {}).get("exitCode", 1))
            if self.stopping.is_set():
                return
            if code != 0:
                self.init_failed = True
                return
            self.report()

    async def _sandbox(self, network: str, found: list[dict[str, Any]]) -> str:
        """The pod's sandbox, which holds its network namespace (the kubelet's pause
        container): the pod's address, its containers' localhost, the same through their
        restarts. Returns the network mode of its containers: `network` itself for a pod that
        needs no sandbox (`needs_sandbox`; its container holds its network), or when the engine
        has no sandbox image for this machine."""
        mine = [i for i in found if i["Config"]["Labels"].get(CONTAINER) == SANDBOX]
        if network == "none" or not (mine or needs_sandbox(self.pod)):
            return network
        if not await self.runtime.sandbox_image():
            return network
        info = next((i for i in mine if (i.get("State") or {}).get("Running")), None)
        for stale in mine:
            if stale is not info:
                await self.runtime.remove_container(stale["Id"])
        if info is None:
            meta = self.pod["metadata"]
            mounts = await self._volumes()
            config = {
                "Image": SANDBOX_IMAGE,
                "Cmd": ["/pause"],
                "Labels": {**self._labels(), CONTAINER: SANDBOX, RESTART_COUNT: "0"},
                "Hostname": meta["name"][:63],
                "HostConfig": {
                    "NetworkMode": network,
                    "Privileged": False,
                    "SecurityOpt": ["no-new-privileges"],
                    "CapDrop": ["ALL"],
                    "ReadonlyRootfs": True,
                    "PidsLimit": 8,
                    "Memory": 6 << 20,
                    "MemorySwap": 6 << 20,
                    "RestartPolicy": {"Name": "no"},
                    # it holds the pod's volumes mounted (tmpfs: they live while it runs)
                    "Mounts": [
                        {"Type": "volume", "Source": source, "Target": f"/volumes/{volume}"}
                        for volume, source in mounts.items()
                    ],
                },
            }
            name = f"tessera_{meta['namespace']}_{meta['name']}"[:200] + f"_pod_{self.uid[:8]}"
            async with self.runtime.starting:
                container = await self.runtime.create(config, name)
                await container.start()
            await self._fill_volumes(container)
            info = await container.show()
        self.pod_ip = address_on(info, network)
        self.network_pid = int((info.get("State") or {}).get("Pid") or 0)
        self.sandbox_id = str(info["Id"])
        return f"container:{info['Id']}"

    async def _fetch(self, resource: str, name: str) -> dict[str, Any] | None:
        return await self.client.get_used(self.pod["metadata"]["namespace"], resource, name)

    def volume_name(self, volume: str) -> str:
        return f"tessera-{self.uid}-{volume}"

    async def _volumes(self) -> dict[str, str]:
        """The pod's emptyDir, configMap and secret volumes made on the engine (local tmpfs
        volumes, labelled with the pod): their engine names by the pod's names."""
        made: dict[str, str] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            name = str(volume.get("name") or "")
            if volume.get("emptyDir") is not None:
                limit = (
                    quantity((volume["emptyDir"] or {}).get("sizeLimit") or "") or EMPTY_DIR_SIZE
                )
                options = f"mode=1777,size={int(limit)}"
            elif volume.get("configMap") is not None or volume.get("secret") is not None:
                options = f"mode=0755,size={CONFIG_VOLUME_SIZE}"
            else:
                kind = next((k for k in volume if k != "name"), "?")
                self.event(
                    "FailedMount",
                    f'volume "{name}": {kind} volumes are not offered (emptyDir, configMap, '
                    "secret are)",
                    warning=True,
                )
                continue
            source = self.volume_name(name)
            await self.docker.volumes.create(
                {
                    "Name": source,
                    "Driver": "local",
                    "DriverOpts": {"type": "tmpfs", "device": "tmpfs", "o": options},
                    "Labels": {POD_UID: self.uid, NODE: self.client.node},
                }
            )
            made[name] = source
        return made

    async def _fill_volumes(self, sandbox: DockerContainer) -> None:
        """Write the configMap and secret volumes' files (through the running sandbox, which
        holds them mounted). One whose object is missing waits: CreateContainerConfigError on
        the containers that mount it, and the sandbox is made again on the next try."""
        namespace = self.pod["metadata"]["namespace"]
        for volume in self.pod["spec"].get("volumes") or []:
            try:
                files = await volumes.files_of(self._fetch, namespace, volume)
            except volumes.ConfigError as exc:
                self.volume_errors[str(volume.get("name"))] = str(exc)
                continue
            self.volume_errors.pop(str(volume.get("name")), None)
            if files:
                await sandbox.put_archive(f"/volumes/{volume['name']}", volumes.tar_of(files))

    async def _gpus(self, spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
        """The pod's GPUs for the container that asks for them (nvidia.com/gpu,
        tessera.io/gpu-memory or tessera.io/gpu-core in its resources)."""
        resources = spec.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        if not any(k == GPU or k.startswith("tessera.io/gpu") for k in asked):
            return [], []
        devices = {}
        for share in gpu_allocation(self.pod):
            with contextlib.suppress(httpx.HTTPError):
                devices[str(share["gpu"])] = await self.client.get_gpu(str(share["gpu"]))
        return gpu_config(self.pod, devices)

    async def _refill(self) -> None:
        with contextlib.suppress(DockerError):
            await self._fill_volumes(DockerContainer(self.docker, id=self.sandbox_id))

    def _mounts(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        kinds = {v.get("name"): v for v in self.pod["spec"].get("volumes") or []}
        mounts = []
        for mount in spec.get("volumeMounts") or []:
            volume = kinds.get(mount.get("name"))
            if volume is None:
                continue
            if self.volume_errors.get(str(mount.get("name"))):
                raise volumes.ConfigError(self.volume_errors[str(mount["name"])])
            shared = volume.get("emptyDir") is not None
            mounts.append(
                {
                    "Type": "volume",
                    "Source": self.volume_name(str(mount["name"])),
                    "Target": str(mount.get("mountPath") or ""),
                    "ReadOnly": bool(mount.get("readOnly")) or not shared,
                }
            )
        return mounts

    def _labels(self) -> dict[str, str]:
        meta = self.pod["metadata"]
        return {
            POD_UID: self.uid,
            POD_NAME: meta["name"],
            POD_NAMESPACE: meta["namespace"],
            NODE: self.client.node,
            NODE_UID: self.runtime.node_uid,
        }

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

    async def _resume_mps(self, run: Run) -> None:
        """A slice's container found by a restarted agent: counted again among its GPU's
        daemon's users (the daemon started again if it is gone), so that the daemon stops after
        it as after any other."""
        requests, env = await self._gpus(run.spec)
        if not (requests and env):
            return
        self.mps_gpu = str(requests[0]["DeviceIDs"][0])
        try:
            await self.runtime.mps.acquire(self.mps_gpu, self.uid)
        except (DockerError, PullFailed) as exc:
            log.warning(
                "node %s: the MPS control daemon of %s did not start again: %s",
                self.client.node,
                self.mps_gpu,
                exc,
            )

    async def release_mps(self) -> None:
        if self.mps_gpu:
            await self.runtime.mps.release(self.mps_gpu, self.uid)

    async def _cleanup(self) -> None:
        await self.release_mps()
        for info in await self.runtime.containers_of(self.uid):
            await self.runtime.remove_container(info["Id"])
        await self.runtime.remove_volumes(self.uid)

    async def _wait_stop(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        except TimeoutError:
            return False
        return True

    async def _container(
        self, run: Run, network: str, found: list[dict[str, Any]], policy: str | None = None
    ) -> None:
        name = run.spec["name"]
        mine = sorted(
            (i for i in found if i["Config"]["Labels"].get(CONTAINER) == name),
            key=lambda i: int(i["Config"]["Labels"].get(RESTART_COUNT, "0")),
        )
        current = mine[-1] if mine else None
        if current is not None:
            run.restarts = int(current["Config"]["Labels"].get(RESTART_COUNT, "0"))
            await self._resume_mps(run)
        backoff = BACKOFF_FIRST
        pull_backoff = BACKOFF_FIRST
        policy = policy or str(self.pod["spec"].get("restartPolicy") or "Always")
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
                    if failed.reason == "CreateContainerConfigError":  # tried again
                        if not await self._wait_stop(pull_backoff):
                            pull_backoff = min(pull_backoff * 2, BACKOFF_MAX)
                            if self.volume_errors and self.sandbox_id:
                                await self._refill()
                        continue
                    if await self._wait_stop(pull_backoff):
                        continue
                    self.event(
                        "BackOff", f'Back-off pulling image "{run.spec.get("image")}"', warning=True
                    )
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
            if not network.startswith("container:"):  # it holds the pod's network itself
                self._network_of(current, network)
            container = DockerContainer(self.docker, id=current["Id"])
            run.container_id = f"docker://{current['Id']}"
            run.image_id = str(current.get("Image") or "")
            held = current.get("HostConfig") or {}
            run.limits = {k: int(held[k]) for k in LIMITS if held.get(k)}
            state = current.get("State") or {}
            began = engine_time(state.get("StartedAt"))
            logs = None
            if state.get("Running"):
                # changed while it started, or while the agent was away
                if (current.get("Config") or {}).get("Image") != run.spec.get("image"):
                    self._redefine(run)
                else:
                    self._resize(run)
                run.state = {"running": {"startedAt": began or self._now()}}
                run.started = True
                # not ready (nor started) until its probes say so
                run.starting = run.spec.get("startupProbe") is not None
                run.ready = not run.starting and run.spec.get("readinessProbe") is None
                self.report()
                since = await self._log_since(name) if resumed else 0.0
                logs = asyncio.create_task(self._forward_logs(container, run, since))
                probing = asyncio.create_task(self._probe(run, container))
                try:
                    await self._wait_exit(container)
                finally:
                    probing.cancel()
            elif began:  # it ran and ended already (at once, or while the agent was away)
                run.started = True
                since = await self._log_since(name) if resumed else 0.0
                await self._forward_logs(container, run, since)
            elif resumed and not state.get("Error"):  # created, never started: start anew
                await self.runtime.remove_container(current["Id"])
                current = None
                continue
            info = await container.show()
            if logs is not None:  # its last lines go before its end is told; 5 s at most
                _, late = await asyncio.wait([logs], timeout=5.0)
                for task in late:
                    task.cancel()
                if logs.done() and not logs.cancelled() and logs.exception() is not None:
                    log.warning("forwarding %s's logs: %r", name, logs.exception())
            ended = terminated_of(info, stopped=self.stopping.is_set() or run.killed)
            run.killed = False
            run.state = {"terminated": ended}
            current = None
            if run.redefined and not self.stopping.is_set():  # at once, whatever the policy
                run.redefined = False
                run.last = {"terminated": ended}
                run.restarts += 1
                await self.runtime.remove_older(self.uid, name, run.restarts - 1)
                continue
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
            self.event(
                "BackOff",
                f"Back-off restarting failed container {name} in pod "
                f"{self.pod['metadata']['name']}_{self.pod['metadata']['namespace']}"
                f"({self.uid})",
                warning=True,
            )
            if await self._wait_stop(backoff):
                run.state = {"terminated": ended}
                run.done = True
                return
            backoff = min(backoff * 2, BACKOFF_MAX)
            run.restarts += 1
            await self.runtime.remove_older(self.uid, name, run.restarts - 1)

    def _network_of(self, info: dict[str, Any], network: str) -> None:
        """The pod's address and network namespace, from the container holding them."""
        address = address_on(info, network)
        if address:
            self.pod_ip = address
        pid = int((info.get("State") or {}).get("Pid") or 0)
        if pid:
            self.network_pid = pid

    # --- probes ---------------------------------------------------------------------------

    async def _probe(self, run: Run, container: DockerContainer) -> None:
        """The container's probes while it runs: the startup probe first (the others wait for
        it; failing it, the container is killed), then liveness (failing it: killed, and
        restarted per restartPolicy) and readiness (the container's `ready` and the pod's Ready
        condition)."""
        spec = run.spec
        startup, liveness, readiness = (
            spec.get("startupProbe"),
            spec.get("livenessProbe"),
            spec.get("readinessProbe"),
        )
        if startup is not None:
            if not await self._until_verdict(run, container, "Startup", startup):
                return
            run.starting = False
            run.ready = readiness is None
            self.report()
        checks: list[Awaitable[Any]] = []
        if liveness is not None:
            checks.append(self._until_verdict(run, container, "Liveness", liveness))
        if readiness is not None:
            checks.append(self._readiness(run, container, readiness))
        await asyncio.gather(*checks)

    async def _try(
        self, run: Run, container: DockerContainer, probe: dict[str, Any]
    ) -> tuple[bool, str]:
        return await probes.run(
            probe,
            spec=run.spec,
            container=container,
            pid=self.network_pid,
            address=self.pod_ip,
        )

    async def _until_verdict(
        self, run: Run, container: DockerContainer, kind: str, probe: dict[str, Any]
    ) -> bool:
        """A startup probe until it succeeds (True), or a liveness probe for ever; either
        failing failureThreshold times in a row kills the container (False)."""
        timing = probes.Timing.of(probe)
        await asyncio.sleep(timing.initial_delay)
        failures = successes = 0
        while True:
            ok, said = await self._try(run, container, probe)
            if ok:
                failures, successes = 0, successes + 1
                if kind == "Startup" and successes >= timing.success_threshold:
                    return True
            else:
                failures, successes = failures + 1, 0
                self.event("Unhealthy", f"{kind} probe failed: {said}"[:1024], warning=True)
                if failures >= timing.failure_threshold:
                    name = run.spec["name"]
                    self.event(
                        "Killing",
                        f"Container {name} failed {kind.lower()} probe, will be restarted",
                    )
                    run.killed = True
                    grace = probe.get("terminationGracePeriodSeconds")
                    with contextlib.suppress(DockerError):
                        await container.stop(t=self.grace if grace is None else int(grace))
                    return False
            await asyncio.sleep(timing.period)

    async def _readiness(self, run: Run, container: DockerContainer, probe: dict[str, Any]) -> None:
        timing = probes.Timing.of(probe)
        await asyncio.sleep(timing.initial_delay)
        failures = successes = 0
        while True:
            ok, said = await self._try(run, container, probe)
            if ok:
                failures, successes = 0, successes + 1
                if not run.ready and successes >= timing.success_threshold:
                    run.ready = True
                    self.report()
            else:
                failures, successes = failures + 1, 0
                self.event("Unhealthy", f"Readiness probe failed: {said}"[:1024], warning=True)
                if run.ready and failures >= timing.failure_threshold:
                    run.ready = False
                    self.report()
            await asyncio.sleep(timing.period)

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
                labels = (await container.show()).get("Config", {}).get("Labels") or {}
                self.event("Killing", f"Stopping container {labels.get(CONTAINER, '')}")
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
                    async with asyncio.timeout(LOG_FLUSH_SECONDS if batch else None):
                        line = await lines.get()
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
        auth = None
        if self.pod["spec"].get("imagePullSecrets"):
            auth = await volumes.pull_auth(self._fetch, self.pod, image)
        found = await self.runtime.ensure_image(image, pull_policy(spec), self.event, auth=auth)
        meta = self.pod["metadata"]
        try:
            resolved = await volumes.environment_refs(self._fetch, meta["namespace"], spec)
            mounts = self._mounts(spec)
        except volumes.ConfigError as exc:
            self.event("Failed", f"Error: {exc}", warning=True)
            raise PullFailed("CreateContainerConfigError", str(exc)) from exc
        labels = {**self._labels(), CONTAINER: spec["name"], RESTART_COUNT: str(run.restarts)}
        image_user = (
            str((found.get("Config") or {}).get("User") or "")
            if found is not None
            else await self.runtime.image_user(image)
        )
        user, refused = user_of(self.pod, spec, image_user)
        if refused:
            self.event("Failed", f"Error: {refused}", warning=True)
            raise PullFailed("CreateContainerConfigError", refused)
        env = environment(self.pod, spec, self.pod_ip, resolved)
        gpu_requests, gpu_env = await self._gpus(spec)
        env += gpu_env
        if gpu_env and gpu_requests:  # a slice: its GPU's MPS control daemon, shared
            self.mps_gpu = str(gpu_requests[0]["DeviceIDs"][0])
            try:
                mounts = mounts + await self.runtime.mps.acquire(self.mps_gpu, self.uid)
            except (DockerError, PullFailed) as exc:  # tried again after the back-off
                why = exc.message if isinstance(exc, DockerError) else str(exc.message)
                message = f"the MPS control daemon of GPU {self.mps_gpu} did not start: {why}"
                self.event("Failed", f"Error: {message}"[:1024], warning=True)
                raise PullFailed("CreateContainerConfigError", message[:1024]) from exc
            env += self.runtime.mps.environment()
        if not self.runtime.nvidia_runtime:
            gpu_requests = []
        values = dict(item.partition("=")[::2] for item in env)
        config: dict[str, Any] = {
            "Image": image,
            "Env": env,
            "Labels": labels,
            "HostConfig": {
                **host_config(self.pod, spec, network, await self.runtime.engine_cpus()),
                "Mounts": mounts,
                **({"DeviceRequests": gpu_requests} if gpu_requests else {}),
            },
            "Tty": False,
            "OpenStdin": bool(spec.get("stdin")),  # for `kubectl attach -i`
            "StdinOnce": bool(spec.get("stdinOnce")),
            "StopTimeout": self.grace,
        }
        if user is not None:
            config["User"] = user
        if spec.get("command"):
            config["Entrypoint"] = [_expand(str(x), values) for x in spec["command"]]
            config["Cmd"] = [_expand(str(x), values) for x in spec.get("args") or []]
        elif spec.get("args"):
            config["Cmd"] = [_expand(str(x), values) for x in spec["args"]]
        if spec.get("workingDir"):
            config["WorkingDir"] = str(spec["workingDir"])
        if not network.startswith("container:"):  # it holds the pod's network (and name)
            config["Hostname"] = meta["name"][:63]
        name = f"tessera_{meta['namespace']}_{meta['name']}_{spec['name']}_{run.restarts}"
        name = f"{name[:200]}_{self.uid[:8]}"
        async with self.runtime.starting:
            container = await self.runtime.create(config, name)
            self.event("Created", f"Created container: {spec['name']}")
            try:
                await container.start()
            except DockerError as exc:
                log.info("node %s: %s cannot run: %s", self.client.node, name, exc.message)
                self.event("Failed", f"Error: {exc.message}"[:1024], warning=True)
            else:
                self.event("Started", f"Started container {spec['name']}")
        return await container.show()


# --- the runtime --------------------------------------------------------------------------


def engine_client(url: str | None) -> aiodocker.Docker:
    """A client of the engine at `url` (None: DOCKER_HOST or the default socket) that opens as
    many connections as it is asked for. aiohttp's connector holds 100 at most by default, and
    every running container holds two for as long as it runs (its wait and its log stream): past
    50 pods on a node, every other call to the engine (the next pod's create, start) would wait
    for a container to end. The node's pods bound them."""
    docker = aiodocker.Docker(url=url)
    docker.connector._limit = 0  # aiohttp has no public setter; 0 is its "no limit"
    return docker


class DockerRuntime:
    """The pods of one node as containers of the engine at DOCKER_HOST."""

    kind = "docker"

    def __init__(
        self,
        client: NodeClient,
        *,
        url: str | None = None,
        relay_image: str = "busybox:stable",
        mps_image: str = "nvidia/cuda:12.4.1-base-ubuntu22.04",
        mps_command: list[str] | None = None,
        nvidia_runtime: bool = True,
        egress: bool = False,
    ) -> None:
        from agent.mps import MpsDaemons

        self.client = client
        # False: the engine has no NVIDIA runtime (tests): no device requests are made
        self.nvidia_runtime = nvidia_runtime
        self.mps = MpsDaemons(
            self, image=mps_image, command=mps_command or ["nvidia-cuda-mps-control", "-f"]
        )
        self.url = url
        self.relay_image = relay_image  # port-forward's relay (agent/docker_sessions.py)
        self.egress = egress  # the namespaces' networks route out (TESSERA_AGENT_POD_EGRESS)
        self._docker: aiodocker.Docker | None = None
        self.pods: dict[str, DockerPod] = {}
        self.found: dict[str, list[dict[str, Any]]] = {}  # by pod uid, at resume
        self._networks: dict[str, str] = {}  # the namespaces' networks found or made
        self._pulls: dict[str, asyncio.Lock] = {}
        self._images_seen: dict[str, tuple[float, dict[str, Any]]] = {}  # (when, its inspect)
        self.node_uid = ""
        self.later = Background()
        self._sandbox_lock = asyncio.Lock()
        self._sandbox_ready = False
        self.starting = asyncio.Semaphore(STARTS_AT_ONCE)  # creates and starts on the engine
        self.cpus = 0  # the engine's host's CPUs, once asked (`engine_cpus`)

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = engine_client(self.url)
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

    async def running_containers(self) -> list[dict[str, Any]]:
        """The node's running containers as the engine lists them (Id, Labels, State): one
        call, where `containers_of` inspects each."""
        labels = [f"{NODE}={self.client.node}", f"{NODE_UID}={self.node_uid}"]
        filters = json.dumps({"label": labels, "status": ["running"]})
        listed = await self.docker.containers.list(filters=filters)
        return [dict(item._container) for item in listed]

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
                    self.later(known.outbox.close())
                    self.later(known.event_outbox.close())
                    self.later(known._cleanup())
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
        known.respec()
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
                self.later(self.remove_container(info["Id"]))

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
        """The name of the namespace's own network (internal), found or made the first time;
        "none" when the engine cannot make one. The engine allows two networks of one name
        (its API before 1.44 checks no duplicate unless asked, and even then not atomically),
        so a name is made once at a time in this process (`network_lock`: every node this
        process acts for), found by name and label before it is made (a restarted agent, or
        another node's agent on this engine, made it already), and duplicates left by agents
        that raced are removed."""
        name = f"{NETWORK_PREFIX}{namespace}"
        if name not in self._networks:
            async with network_lock(name):
                if name not in self._networks:
                    self._networks[name] = await self._find_or_make_network(name, namespace)
        return self._networks[name]

    async def _networks_named(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """The engine's networks of `name` made for `namespace`, with their containers, the one
        to use first: the one with the most containers (pods on it keep their addresses), then
        the oldest."""
        filters = {"name": [name], "label": [f"{POD_NAMESPACE}={namespace}"]}
        listed = await self.docker.networks.list(filters=filters)  # name: a substring match
        found = []
        for item in listed:
            if item.get("Name") != name:
                continue
            with contextlib.suppress(DockerError):  # removed meanwhile
                found.append(await (await self.docker.networks.get(item["Id"])).show())
        return sorted(
            found, key=lambda n: (-len(n.get("Containers") or {}), n.get("Created", ""), n["Id"])
        )

    async def _find_or_make_network(self, name: str, namespace: str) -> str:
        try:
            found = await self._networks_named(name, namespace)
            if not found:
                # Without egress: no address of the host's on the bridge, so nothing routes out
                # of it, nor to another namespace's bridge, whatever the host's firewall. With
                # it: a bridge the engine NATs out through the host; other namespaces' bridges
                # are kept apart by the engine's own firewall rules (dockerd's default).
                options = {} if self.egress else {"com.docker.network.bridge.inhibit_ipv4": "true"}
                with contextlib.suppress(DockerError):  # another engine client made it: found
                    await self.docker.networks.create(
                        {
                            "Name": name,
                            "CheckDuplicate": True,
                            "Driver": "bridge",
                            "Internal": not self.egress,
                            "Options": options,
                            "Labels": {POD_NAMESPACE: namespace},
                        }
                    )
                found = await self._networks_named(name, namespace)  # another's, made at once?
        except DockerError as exc:
            log.warning(
                "node %s: no network for %s (%s): its pods run without one",
                self.client.node,
                namespace,
                exc.message,
            )
            return "none"
        if not found:
            log.warning(
                "node %s: the network %s of %s is gone as soon as made: its pods run without one",
                self.client.node,
                name,
                namespace,
            )
            return "none"
        kept, *duplicates = found
        for duplicate in duplicates:
            if duplicate.get("Containers"):  # in use: its pods keep it until they end
                log.warning(
                    "node %s: network %s has a duplicate %s in use by %d container(s); kept %s",
                    self.client.node,
                    name,
                    duplicate["Id"][:12],
                    len(duplicate["Containers"]),
                    kept["Id"][:12],
                )
                continue
            with contextlib.suppress(DockerError):  # in use by now, or removed by another
                await (await self.docker.networks.get(duplicate["Id"])).delete()
                log.info(
                    "node %s: removed %s's duplicate network %s",
                    self.client.node,
                    name,
                    duplicate["Id"][:12],
                )
        if bool(kept.get("Internal")) == self.egress:
            log.warning(
                "node %s: network %s %s; TESSERA_AGENT_POD_EGRESS is %s: it takes effect "
                "for a namespace whose network is made again (once its pods are gone)",
                self.client.node,
                name,
                "routes nowhere" if kept.get("Internal") else "routes out",
                self.egress,
            )
        return name  # now the engine's only network of that name (or one is left in use)

    async def ensure_image(
        self,
        image: str,
        policy: str,
        note: Callable[..., None] | None = None,
        *,
        auth: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """The image present per `policy`, with the kubelet's events through `note(reason,
        message, warning=...)`: Pulling, then Pulled with the time the pull took (and the time
        with the wait for another pull of it), or Failed. Returns the engine's inspect of the
        image when it looked at it (None after a pull)."""
        tell = note or (lambda *args, **kwargs: None)
        if not image or not IMAGE_REFERENCE.match(image):
            message = f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": invalid reference format'
            tell("InspectFailed", message, warning=True)
            tell("Failed", "Error: InvalidImageName", warning=True)
            raise PullFailed("InvalidImageName", message)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        if policy != "Always" and (info := await self._inspect(image)) is not None:
            # present: nothing to pull, no lock to wait for (a node's many pods of one image
            # would otherwise look it up one after the other)
            tell("Pulled", f'Container image "{image}" already present on machine')
            return info
        lock = self._pulls.setdefault(image, asyncio.Lock())
        async with lock:  # one pull of an image at a time
            info = await self._inspect(image)
            present = info is not None
            if policy == "Never":
                if not present:
                    message = f'Container image "{image}" is not present with pull policy of Never'
                    tell("ErrImageNeverPull", message, warning=True)
                    tell("Failed", "Error: ErrImageNeverPull", warning=True)
                    raise PullFailed("ErrImageNeverPull", message)
                tell("Pulled", f'Container image "{image}" already present on machine')
                return info
            if policy == "IfNotPresent" and present:
                tell("Pulled", f'Container image "{image}" already present on machine')
                return info
            tell("Pulling", f'Pulling image "{image}"')
            began = loop.time()
            try:
                if auth is None:
                    await self.docker.images.pull(image)
                else:  # the engine is told the registry: a reference that names none is Docker Hub's
                    full = (
                        image
                        if volumes.registry_of(image) != "docker.io"
                        or image.startswith("docker.io/")
                        else f"docker.io/{image if '/' in image else 'library/' + image}"
                    )
                    await self.docker.images.pull(full, auth=auth)
            except DockerError as exc:
                refused = any(word in exc.message.lower() for word in REFUSED_PULL)
                if present and not refused:  # Always, no registry answers: the engine's copy
                    log.warning(
                        "node %s: pulling %s failed (%s); using the engine's copy",
                        self.client.node,
                        image,
                        exc.message,
                    )
                    tell(
                        "Pulled",
                        f'Container image "{image}" already present on machine (the pull '
                        f"failed: {exc.message})"[:1024],
                    )
                    return info
                message = f'Failed to pull image "{image}": {exc.message}'[:1000]
                tell("Failed", message, warning=True)
                tell("Failed", "Error: ErrImagePull", warning=True)
                raise PullFailed("ErrImagePull", message) from exc
            self._images_seen.pop(image, None)  # another image by that name now
            done = loop.time()
            tell(
                "Pulled",
                f'Successfully pulled image "{image}" in {done - began:.3f}s '
                f"({done - asked:.3f}s including waiting)",
            )
        return None

    async def engine_cpus(self) -> int:
        """The engine's host's CPUs (asked once): a container's CPU quota is at most that."""
        if not self.cpus:
            self.cpus = int((await self.docker.system.info()).get("NCPU") or 0)
        return self.cpus

    async def image_user(self, image: str) -> str:
        """The image's own User ("" for root, or when the engine cannot say)."""
        try:
            info = await self.docker.images.inspect(image)
        except DockerError:
            return ""
        return str((info.get("Config") or {}).get("User") or "")

    async def sandbox_image(self) -> bool:
        """The pods' sandbox image on the engine (made from a 129-byte program that only
        waits: the kubelet's pause container), made the first time; False on a machine this
        agent has no such program for."""
        if self._sandbox_ready:
            return True
        program = pause_program()
        if program is None:
            return False
        async with self._sandbox_lock:
            if not self._sandbox_ready:
                if not await self._present(SANDBOX_IMAGE):
                    repo, _, tag = SANDBOX_IMAGE.partition(":")
                    async with self.docker._query(
                        "images/create",
                        "POST",
                        params={"fromSrc": "-", "repo": repo, "tag": tag},
                        data=sandbox_tar(program),
                        headers={"Content-Type": "application/x-tar"},
                    ) as response:
                        await response.read()
                self._sandbox_ready = await self._present(SANDBOX_IMAGE)
        return self._sandbox_ready

    async def _present(self, image: str) -> bool:
        return await self._inspect(image) is not None

    async def _inspect(self, image: str) -> dict[str, Any] | None:
        """The engine's inspect of `image`, None when it has none. One found present is taken as
        present for IMAGE_SEEN_SECONDS without asking again: a burst of a node's pods of one
        image costs the busy engine one look-up, not one per pod on each start's way (an image
        removed meanwhile fails the create, which forgets it: the pod is tried again)."""
        now = asyncio.get_running_loop().time()
        seen = self._images_seen.get(image)
        if seen is not None and now - seen[0] < IMAGE_SEEN_SECONDS:
            return seen[1]
        try:
            info = dict(await self.docker.images.inspect(image))
        except DockerError:
            self._images_seen.pop(image, None)
            return None
        if len(self._images_seen) >= MAX_IMAGES_SEEN:
            self._images_seen.clear()
        self._images_seen[image] = (now, info)
        return info

    async def create(self, config: dict[str, Any], name: str) -> DockerContainer:
        """A container made on the engine; a leftover of its name (a start cut short, by the
        agent's restart or the engine's) removed first."""
        try:
            return await self.docker.containers.create(config, name=name)
        except DockerError as exc:
            if exc.status == 404:  # its image is gone: looked up again on the next try
                self._images_seen.pop(str(config.get("Image") or ""), None)
            if exc.status != 409:  # the name is taken
                raise
        await self.remove_container(name)
        return await self.docker.containers.create(config, name=name)

    async def remove_container(self, container_id: str) -> None:
        with contextlib.suppress(DockerError):
            await DockerContainer(self.docker, id=container_id).delete(force=True)

    async def remove_volumes(self, uid: str) -> None:
        """The pod's volumes (after its containers: a volume in use is not removed)."""
        with contextlib.suppress(DockerError):
            listed = await self.docker.volumes.list(
                filters={"label": [f"{POD_UID}={uid}", f"{NODE}={self.client.node}"]}
            )
            for volume in listed.get("Volumes") or []:
                with contextlib.suppress(DockerError):
                    await DockerVolume(self.docker, volume["Name"]).delete()

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
            await docker_pod.event_outbox.close()
        if self._docker is not None:
            await self._docker.close()
