"""Sessions on the docker runtime's pods: exec, attach and port-forward against the engine.

- exec: the engine's exec (create, then start with a hijacked stream) in the pod's running
  container, with the user's stdin (closed when the user closes it: v5's channel 255), stdout,
  stderr and terminal (resized from channel 4); its exit code ends the session, as the kubelet's
  Status (kubectl exits with it).
- attach: the engine's attach to the container's stdout and stderr (and stdin, for a container
  with `stdin: true`), until the container ends or the user goes.
- port-forward: the pod's network is its own namespace's, with no route from the host; a relay
  container (`TESSERA_AGENT_RELAY_IMAGE`, busybox by default) joins the network namespace of
  the pod's sandbox (else of its first container) for the session, and each forwarded port is an exec of
  `nc 127.0.0.1 PORT` in it, its stdin and stdout the port's data channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError
from aiodocker.stream import Stream

from agent.sessions import (
    CLOSE,
    ERROR,
    RESIZE,
    STDIN,
    Link,
    exit_status,
    failure,
    success,
)

if TYPE_CHECKING:
    from agent.docker import DockerRuntime

log = logging.getLogger("tessera.agent.sessions")
RELAY_LABEL = "tessera.io/relay-for"


def _half_close(stream: Stream) -> None:
    """End the process's stdin, keeping its output (aiodocker's close ends both)."""
    response = stream._resp
    transport = response.connection.transport if response and response.connection else None
    if transport is not None and transport.can_write_eof():
        transport.write_eof()


async def _started(stream: Stream) -> Stream:
    """The exec or attach started once, before its pumps: aiodocker starts a stream on its first
    read or write, unguarded, so a reader and a writer racing would start the same exec twice
    (the engine answers the second "is already running", which the reader may get instead of
    the process's output)."""
    await stream._init()
    return stream


async def running_container(runtime: DockerRuntime, uid: str, name: str) -> DockerContainer:
    from agent.docker import CONTAINER, RESTART_COUNT, SANDBOX

    if name == SANDBOX:  # the pod's sandbox is none of its containers
        raise LookupError(f'container "{name}" is not running')
    found = [
        c
        for c in await runtime.containers_of(uid)
        if c["Config"]["Labels"].get(CONTAINER) == name and c["State"].get("Running")
    ]
    if not found:
        raise LookupError(f'container "{name}" is not running')
    newest = max(found, key=lambda c: int(c["Config"]["Labels"].get(RESTART_COUNT) or 0))
    return DockerContainer(runtime.docker, id=newest["Id"])


async def _pump_out(stream: Stream, link: Link, channels: dict[int, int]) -> None:
    while True:
        message = await stream.read_out()
        if message is None:
            return
        channel = channels.get(message.stream)
        if channel is not None and message.data:
            await link.send(channel, message.data)


async def _pump_in(stream: Stream, link: Link, *, stdin: bool, resize: Any = None) -> None:
    while True:
        frame = await link.recv()
        if frame is None:
            raise ConnectionAbortedError("the user went")
        channel, data = frame
        if channel == STDIN and stdin:
            await stream.write_in(data)
        elif channel == CLOSE and data[:1] == bytes([STDIN]) and stdin:
            _half_close(stream)
        elif channel == RESIZE and resize is not None:
            with contextlib.suppress(ValueError, TypeError, DockerError):
                size = json.loads(data)
                await resize(h=int(size.get("Height") or 0), w=int(size.get("Width") or 0))


async def _until_output_ends(stream: Stream, link: Link, *, stdin: bool, resize: Any) -> bool:
    """Carry the frames until the process's output ends (True) or the user goes (False)."""
    out = asyncio.create_task(_pump_out(stream, link, {1: 1, 2: 2}))
    into = asyncio.create_task(_pump_in(stream, link, stdin=stdin, resize=resize))
    try:
        await asyncio.wait({out, into}, return_when=asyncio.FIRST_COMPLETED)
        if into.done() and not out.done():
            exc = into.exception()
            if exc is not None:
                return False
        return out.done()
    finally:
        for task in (out, into):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def session(runtime: DockerRuntime, offer: dict[str, Any], link: Link) -> dict[str, Any]:
    kind = offer.get("kind")
    try:
        if kind == "portforward":
            return await _portforward(runtime, offer, link)
        container = await running_container(runtime, offer["uid"], offer["container"])
        if kind == "exec":
            return await _exec(container, offer, link)
        if kind == "attach":
            return await _attach(container, offer, link)
    except LookupError as exc:
        return failure(f"{exc} in pod {offer['pod']}", "BadRequest", 400)
    except DockerError as exc:
        return failure(f"the container engine: {exc.message}", "InternalError", 500)
    return failure(f"unknown session kind {kind!r}", "BadRequest", 400)


async def _exec(container: DockerContainer, offer: dict[str, Any], link: Link) -> dict[str, Any]:
    command = [str(a) for a in offer["command"]]
    execution = await container.exec(
        command,
        stdout=bool(offer.get("stdout")),
        stderr=bool(offer.get("stderr")),
        stdin=bool(offer.get("stdin")),
        tty=bool(offer.get("tty")),
    )
    stream = await _started(execution.start())
    try:
        ended = await _until_output_ends(
            stream, link, stdin=bool(offer.get("stdin")), resize=execution.resize
        )
    finally:
        await stream.close()
    if not ended:
        return success()  # the user went: nobody reads the Status
    for _ in range(50):  # the engine notes the exit a moment after the output ends
        info = await execution.inspect()
        if not info.get("Running"):
            return exit_status(command, int(info.get("ExitCode") or 0))
        await asyncio.sleep(0.05)
    return success()


async def _attach(container: DockerContainer, offer: dict[str, Any], link: Link) -> dict[str, Any]:
    info = await container.show()
    stdin = bool(offer.get("stdin")) and bool(info["Config"].get("OpenStdin"))
    stream = await _started(
        container.attach(
            stdout=bool(offer.get("stdout")), stderr=bool(offer.get("stderr")), stdin=stdin
        )
    )
    try:
        await _until_output_ends(stream, link, stdin=stdin, resize=None)
    finally:
        await stream.close()
    return success()


async def _portforward(runtime: DockerRuntime, offer: dict[str, Any], link: Link) -> dict[str, Any]:
    from agent.docker import CONTAINER, POD_UID, SANDBOX

    ports = [int(p) for p in offer["ports"]]
    running = [c for c in await runtime.containers_of(offer["uid"]) if c["State"].get("Running")]
    # the pod's network namespace is its sandbox's (its containers join it), else the one of
    # its first container (an engine without the sandbox image)
    sandbox = [c for c in running if c["Config"]["Labels"].get(CONTAINER) == SANDBOX]
    if not [c for c in running if c not in sandbox]:
        return failure(f"pod {offer['pod']} has no running container", "BadRequest", 400)
    target = (sandbox or running)[0]
    image = runtime.relay_image
    await runtime.ensure_image(image, "IfNotPresent")
    relay = await runtime.docker.containers.create(
        {
            "Image": image,
            "Entrypoint": ["sleep"],
            "Cmd": ["86400"],
            "Labels": {RELAY_LABEL: target["Id"], POD_UID + "-relay": offer["uid"]},
            "HostConfig": {
                "NetworkMode": f"container:{target['Id']}",
                "AutoRemove": True,
                "SecurityOpt": ["no-new-privileges"],
                "CapDrop": ["ALL"],
                "PidsLimit": 64,
                "Memory": 32 << 20,
            },
        },
        name=f"tessera_relay_{offer['id'][:16].replace('-', '_')}",
    )
    try:
        await relay.start()
        for i, port in enumerate(ports):  # each channel opens with its port, as the kubelet's
            prefix = port.to_bytes(2, "little")
            await link.send(2 * i, prefix)
            await link.send(2 * i + 1, prefix)
        return await _forward(relay, ports, link)
    finally:
        with contextlib.suppress(DockerError):
            await relay.delete(force=True)


async def _forward(relay: DockerContainer, ports: list[int], link: Link) -> dict[str, Any]:
    """One connection per port: its data channel into `nc`, nc's output back. A session of
    one port ends when the pod's side closes the connection (kubectl's port-forward opens one
    session per local connection, and closes that connection then)."""
    streams: dict[int, Stream] = {}
    pumps: list[asyncio.Task[None]] = []
    closed = asyncio.Event()

    async def open_port(i: int) -> Stream:
        execution = await relay.exec(
            ["nc", "127.0.0.1", str(ports[i])], stdin=True, stdout=True, stderr=True
        )
        stream = await _started(execution.start())
        streams[i] = stream

        async def out() -> None:
            try:
                while True:
                    message = await stream.read_out()
                    if message is None:
                        return
                    channel = 2 * i if message.stream == 1 else 2 * i + 1
                    await link.send(channel, message.data)
            finally:
                if len(ports) == 1:
                    closed.set()

        pumps.append(asyncio.create_task(out()))
        return stream

    try:
        while True:
            received = asyncio.create_task(link.recv())
            ended = asyncio.create_task(closed.wait())
            await asyncio.wait({received, ended}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if not received.done():
                received.cancel()
                return success()
            frame = received.result()
            if frame is None:
                return success()
            channel, data = frame
            i, is_error = divmod(channel, 2)
            if is_error or i >= len(ports) or not data:
                continue
            stream = streams.get(i) or await open_port(i)
            await stream.write_in(data)
    finally:
        for task in pumps:
            task.cancel()
        for stream in streams.values():
            with contextlib.suppress(Exception):
                await stream.close()


__all__ = ["ERROR", "session"]
