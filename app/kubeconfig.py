"""Kubeconfig files that point kubectl and the Kubernetes clients at Tessera."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from app.files import write_whole


def build(
    *, server: str, ca_cert: Path | None, user: str, token: str, namespace: str | None
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca_cert is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_cert.read_bytes()).decode()
    context: dict[str, Any] = {"cluster": "tessera", "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tessera", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": f"tessera-{user}", "context": context}],
        "current-context": f"tessera-{user}",
        "preferences": {},
    }


def write(path: Path, config: dict[str, Any]) -> Path:
    """Write with owner-only permissions (a kubeconfig holds a token), whole: into a file of
    its own first, then renamed into place, so that a process reading it meanwhile (a
    controller manager or agent started beside the server) reads the old one or the new one,
    never a part."""
    write_whole(path, yaml.safe_dump(config, sort_keys=False).encode(), 0o600)
    return path


# A running server records where it listens, so that a kubeconfig made in another terminal (where
# TESSERA_PORT may not be set) points at the server that is actually running.
SERVER_RECORD = "server.json"


# ... and, for a command run from another directory (whose relative data directory is not the
# server's), in the user's own list of running servers, one file per server process.
def servers_dir() -> Path:
    return Path.home() / ".local" / "state" / "tessera" / "servers"


def record_server(data_dir: Path, url: str) -> Path:
    path = data_dir / SERVER_RECORD
    record = {"url": url, "pid": os.getpid(), "dataDir": str(data_dir.resolve())}
    write_whole(path, json.dumps(record).encode())
    with contextlib.suppress(OSError):  # a home that cannot be written: only the hint is lost
        write_whole(servers_dir() / f"{os.getpid()}.json", json.dumps(record).encode())
    return path


def forget_server(data_dir: Path) -> None:
    """Remove this process's records (not one a later server wrote)."""
    path = data_dir / SERVER_RECORD
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    with contextlib.suppress(OSError):
        (servers_dir() / f"{os.getpid()}.json").unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def running_servers() -> list[tuple[str, Path]]:
    """(URL, data directory) of every Tessera server this user runs on this host."""
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(servers_dir().glob("*.json")):
            try:
                record = json.loads(entry.read_text())
                pid, url, data = int(record["pid"]), str(record["url"]), str(record["dataDir"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if _alive(pid):
                found.append((url, Path(data)))
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()  # a server that died without removing its record
    return found


def running_server_url(data_dir: Path) -> str | None:
    """The URL of the server serving this data directory, if it is still running."""
    try:
        record = json.loads((data_dir / SERVER_RECORD).read_text())
        pid, url = int(record["pid"]), str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if _alive(pid) else None
