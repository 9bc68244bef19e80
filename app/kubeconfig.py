"""Kubeconfig files that point kubectl and the Kubernetes clients at Tessera."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import yaml


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
    """Write with owner-only permissions: a kubeconfig holds a token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed before with wider permissions
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path


# A running server records where it listens, so that a kubeconfig made in another terminal (where
# TESSERA_PORT may not be set) points at the server that is actually running.
SERVER_RECORD = "server.json"


def record_server(data_dir: Path, url: str) -> Path:
    path = data_dir / SERVER_RECORD
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    temporary.replace(path)
    return path


def forget_server(data_dir: Path) -> None:
    """Remove this process's record (not one a later server wrote)."""
    path = data_dir / SERVER_RECORD
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def running_server_url(data_dir: Path) -> str | None:
    """The URL of the server serving this data directory, if it is still running."""
    try:
        record = json.loads((data_dir / SERVER_RECORD).read_text())
        pid, url = int(record["pid"]), str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return url
