"""A whole Tessera of its own for the workload tests: `tessera serve`, `tessera scheduler`,
`tessera agent` (its pool's pods reach Running and Ready) and the controller manager(s)
`tessera controllers`, all real processes on a database of their own (a scheduler on the
suite's shared database would bind other tests' pending pods)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.conftest import INVENTORY, TESSERA, Process, start_server, stop_server

LEASE_SECONDS = 3  # the controllers' leader lease in these tests (renewed every 0.4 s)


@dataclass
class Stack:
    server: Process
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    managers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.server.data_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [TESSERA, *args],
            env={
                **self.server.env,
                "TESSERA_AGENT_SERVER": self.server.url,
                "TESSERA_AGENT_CA_CERT": str(self.server.ca),
                "TESSERA_CONTROLLERS_LEASE_SECONDS": str(LEASE_SECONDS),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def start_manager(self, identity: str) -> subprocess.Popen[bytes]:
        process = self.start(
            f"controllers-{identity}", "controllers", "--issue-token", "--identity", identity
        )
        self.managers[identity] = process
        return process

    def log(self, name: str) -> str:
        path = self.server.data_dir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        stop_server(self.server)


def start_stack(
    data_dir: Path, database_url: str, zone: str, *, workers: int = 1, **extra_env: str
) -> Stack:
    """`tessera serve` (`workers` API processes), `tessera scheduler` and `tessera agent` on
    `database_url`; `extra_env` (TESSERA_* settings) is every process's."""
    server = start_server(data_dir, database_url, workers=workers, **extra_env)
    inventory = data_dir / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("ZONE", zone))
    server.cli("inventory", "load", str(inventory))
    stack = Stack(server)
    stack.start("scheduler", "scheduler", "--interval", "0.2")
    stack.start("agent", "agent", "--interval", "0.2")
    return stack


def wait_for(what: str, check: Callable[[], object], timeout: float = 90.0) -> object:
    """Poll `check` until it returns something true (an event awaited by looking, with a
    generous bound that only ends a hung test)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
