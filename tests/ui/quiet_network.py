"""Chromium in a network namespace of its own, reaching the test server through a Unix socket.

Chromium aborts every request in flight (net::ERR_NETWORK_CHANGED) when an address appears on
any interface of its network namespace, as one does each time a container starts on this
machine (the suite runs containers beside the browser tests). In a namespace holding only its
own loopback nothing ever changes: there, a forwarder listens on 127.0.0.1:PORT (the server's
port, so URLs, Host and Origin are the same) and passes each connection through a Unix socket
to a forwarder in the test process, which connects to the server. Playwright talks to Chromium
over a pipe, not the network.

Run as `python -m tests.ui.quiet_network PORT SOCKET` under `unshare --net`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _join(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: object
) -> None:
    try:
        other_reader, other_writer = await connect()  # type: ignore[operator]
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, other_writer), _pipe(other_reader, writer))


async def _inside(port: int, socket_path: str) -> None:
    server = await asyncio.start_server(
        lambda r, w: _join(r, w, lambda: asyncio.open_unix_connection(socket_path)),
        "127.0.0.1",
        port,
    )
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class QuietNetwork:
    """The namespace, its forwarder, the test process's forwarder, and a Chromium launcher that
    runs Chromium inside the namespace."""

    def __init__(self, port: int, chromium: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tessera-quiet-"))
        self.socket = str(self.folder / "server.sock")
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def outside() -> None:
            await asyncio.start_unix_server(
                lambda r, w: _join(r, w, lambda: asyncio.open_connection("127.0.0.1", port)),
                self.socket,
            )
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(outside(), self.loop)
        started.wait(10)
        root = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen(
            [
                "unshare",
                "--net",
                "sh",
                "-c",
                'ip link set lo up && exec "$0" -m tests.ui.quiet_network "$1" "$2"',
                sys.executable,
                str(port),
                self.socket,
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError("could not make a network namespace for the browser")
        self.launcher = self.folder / "chromium"
        self.launcher.write_text(
            f'#!/bin/sh\nexec nsenter --net=/proc/{self.process.pid}/ns/net "{chromium}" "$@"\n'
        )
        self.launcher.chmod(0o755)

    def close(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.socket)


def usable() -> bool:
    """Whether this machine lets the tests make a network namespace (root, util-linux)."""
    try:
        done = subprocess.run(
            ["unshare", "--net", "ip", "link", "set", "lo", "up"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


if __name__ == "__main__":
    asyncio.run(_inside(int(sys.argv[1]), sys.argv[2]))
