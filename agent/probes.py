"""Container probes as the kubelet runs them: exec, httpGet and tcpSocket.

An exec probe runs its command in the container through the engine (success: exit code 0). An
httpGet or tcpSocket probe connects to the pod's address from inside the pod's network
namespace (its sandbox's): the namespaces' networks have no address of the host's, so the
agent makes the probe's socket in that namespace (setns(2) in a thread of its own, the socket
then used from the event loop). That needs what the kubelet needs: root, and the engine's
processes visible (the host's PID namespace). httpGet succeeds on a status from 200 to 399.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError

CLONE_NEWNET = 0x40000000
MAX_OUTPUT = 10 * 1024  # of an exec probe's output kept for its message
USER_AGENT = "kube-probe/1.33"


@dataclass(frozen=True)
class Timing:
    initial_delay: int
    period: int
    timeout: int
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, probe: dict[str, Any]) -> Timing:
        def number(key: str, default: int, least: int) -> int:
            value = probe.get(key)
            try:
                return max(int(value), least) if value is not None else default
            except (TypeError, ValueError):
                return default

        return cls(
            initial_delay=number("initialDelaySeconds", 0, 0),
            period=number("periodSeconds", 10, 1),
            timeout=number("timeoutSeconds", 1, 1),
            success_threshold=number("successThreshold", 1, 1),
            failure_threshold=number("failureThreshold", 3, 1),
        )


def port_of(container: dict[str, Any], port: Any) -> int | None:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port) if 0 < int(port) < 65536 else None
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared.get("containerPort") or 0) or None
    return None


def _socket_in(pid: int) -> socket.socket:
    """A TCP socket made in the network namespace of process `pid` (a thread of its own enters
    it and ends with it, so no other thread of the agent ever is in a pod's namespace)."""
    made: dict[str, Any] = {}

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"setns: {os.strerror(error)}")
            finally:
                os.close(fd)
            made["socket"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=enter, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    sock: socket.socket = made["socket"]
    sock.setblocking(False)
    return sock


async def _connect(pid: int, address: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = await asyncio.to_thread(_socket_in, pid)
    try:
        await loop.sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def tcp_socket(pid: int, address: str, port: int) -> tuple[bool, str]:
    try:
        sock = await _connect(pid, address, port)
    except OSError as exc:
        return False, f"dial tcp {address}:{port}: connect: {exc.strerror or exc}"
    sock.close()
    return True, ""


async def http_get(pid: int, address: str, port: int, probe: dict[str, Any]) -> tuple[bool, str]:
    scheme = str(probe.get("scheme") or "HTTP").upper()
    path = str(probe.get("path") or "/")
    path = path if path.startswith("/") else f"/{path}"
    url = f"{scheme.lower()}://{address}:{port}{path}"
    try:
        sock = await _connect(pid, address, port)
    except OSError as exc:
        return False, f'Get "{url}": dial tcp {address}:{port}: connect: {exc.strerror or exc}'
    context = None
    if scheme == "HTTPS":  # as the kubelet: the certificate is not verified
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    writer = None
    try:
        reader, writer = await asyncio.open_connection(
            sock=sock, ssl=context, server_hostname=address if context else None
        )
        headers = {"Host": f"{address}:{port}", "User-Agent": USER_AGENT, "Accept": "*/*"}
        for header in probe.get("httpHeaders") or []:
            headers[str(header.get("name"))] = str(header.get("value") or "")
        headers["Connection"] = "close"
        request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write((request + "\r\n").encode("latin-1", "replace"))
        await writer.drain()
        line = (await reader.readline()).decode("latin-1").split()
    except (OSError, ssl.SSLError) as exc:
        return False, f'Get "{url}": {exc}'
    finally:
        if writer is not None:
            writer.close()
        else:
            sock.close()
    if len(line) < 2 or not line[1].isdigit():
        return False, f'Get "{url}": malformed HTTP response'
    code = int(line[1])
    if 200 <= code < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {code}"


async def exec_in(container: DockerContainer, command: list[str]) -> tuple[bool, str]:
    try:
        execution = await container.exec([str(c) for c in command], stdout=True, stderr=True)
        output = b""
        async with execution.start(detach=False) as stream:
            while (message := await stream.read_out()) is not None:
                output = (output + message.data)[:MAX_OUTPUT]
        code = (await execution.inspect()).get("ExitCode")
    except DockerError as exc:
        return False, exc.message
    text = output.decode("utf-8", "replace").strip()
    if code == 0:
        return True, text
    return False, text or f"command {command} exited with {code}"


async def run(
    probe: dict[str, Any],
    *,
    spec: dict[str, Any],
    container: DockerContainer,
    pid: int,
    address: str,
) -> tuple[bool, str]:
    """One try of a probe within its timeoutSeconds: (succeeded, what it said)."""
    timing = Timing.of(probe)
    if probe.get("exec"):
        check = exec_in(container, list(probe["exec"].get("command") or []))
    elif probe.get("httpGet") or probe.get("tcpSocket"):
        kind = "httpGet" if probe.get("httpGet") else "tcpSocket"
        port = port_of(spec, probe[kind].get("port"))
        if port is None:
            return False, f"{kind}: no such port {probe[kind].get('port')!r}"
        if not pid or not address:
            return False, "the pod has no network address to probe"
        if kind == "httpGet":
            check = http_get(pid, address, port, probe["httpGet"])
        else:
            check = tcp_socket(pid, address, port)
    else:
        return False, "the probe names no handler (exec, httpGet or tcpSocket)"
    try:
        async with asyncio.timeout(timing.timeout):
            return await check
    except TimeoutError:
        return False, f"timeout: the probe took longer than {timing.timeout}s"
