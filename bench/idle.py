"""What `make run` costs the machine at rest: `tessera dev` with nothing to do.

    tessera bench idle --runs 2 --settle 40 --seconds 60
    tessera bench idle --tree ../before   # the same beside another checkout, run after run

Each run starts `tessera dev` on a fresh data directory with the virtual runtime only (the demo
pool's 88 node agents renewing their leases, reporting their usage and watching their pods, the
scheduler, the controller manager), waits until it answers `/readyz`, lets it settle for
`--settle` seconds, then takes the CPU the process used over `--seconds` (user + system, from
/proc, so Linux only) and stops it. With `--tree`, each run is followed by one of the `tessera
dev` of that checkout (its code first on PYTHONPATH), so the two are compared on the same
machine at nearly the same time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Run:
    tree: str
    settle_s: float
    seconds: float
    cpu_s: float
    cores: float  # CPU seconds per second of the measured window


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tessera dev exited with {process.returncode}")
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"tessera dev did not answer /readyz within {timeout:.0f} s")


def _label(tree: Path | None) -> str:
    """How a run names its tree in the results: "this", or the other checkout's commit (its
    folder's name if it is no git checkout), never a path of the machine."""
    if tree is None:
        return "this"
    found = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else tree.resolve().name


def measure(tree: Path | None, settle: float, seconds: float) -> Run:
    """One `tessera dev` at rest: the CPU it takes over `seconds`, after `settle`."""
    with tempfile.TemporaryDirectory(prefix="tessera-idle-") as data:
        port = _free_port()
        env = {
            **os.environ,
            "TESSERA_DATA_DIR": data,
            "TESSERA_PORT": str(port),
            "TESSERA_AGENT_RUNTIME": "virtual",
        }
        if tree is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(tree.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        process = subprocess.Popen(
            [sys.executable, "-c", "from app.cli import main; main()", "dev"],
            env=env,
            cwd=data,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_ready(port, process, timeout=180)
            time.sleep(settle)
            before, start = _cpu_seconds(process.pid), time.monotonic()
            time.sleep(seconds)
            used, took = _cpu_seconds(process.pid) - before, time.monotonic() - start
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return Run(
        tree=_label(tree),
        settle_s=settle,
        seconds=round(took, 1),
        cpu_s=round(used, 2),
        cores=round(used / took, 3),
    )


def main(
    runs: Annotated[int, typer.Option(min=1, max=20, help="Runs (of each tree).")] = 2,
    settle: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds at rest before measuring.")
    ] = 40.0,
    seconds: Annotated[float, typer.Option(min=5, max=3600, help="Seconds measured.")] = 60.0,
    tree: Annotated[
        Path | None,
        typer.Option(help="Another checkout, measured after each run of this one."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for idle.json.")] = Path("bench/results/latest"),
) -> None:
    """`tessera dev` at rest: the CPU it takes with nothing to do."""
    if not Path("/proc/self/stat").exists():
        raise typer.BadParameter("tessera bench idle reads /proc: it runs on Linux")
    if tree is not None and not (tree / "app" / "cli.py").is_file():
        raise typer.BadParameter(f"--tree {tree}: no Tessera checkout there (no app/cli.py)")
    results: list[Run] = []
    for i in range(runs):
        for which in [None, tree] if tree is not None else [None]:
            try:
                run = measure(which, settle, seconds)
            except RuntimeError as exc:
                typer.secho(f"tessera bench idle: {exc}", err=True, fg="red")
                raise typer.Exit(1) from exc
            results.append(run)
            typer.echo(
                f"run {i + 1}/{runs}, {run.tree}: {run.cpu_s} CPU-s in {run.seconds} s "
                f"= {run.cores} of a core"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "idle.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    typer.echo(f"wrote {out / 'idle.json'}", err=True)
