"""Kubeconfig files that point kubectl and the Kubernetes clients at Tessera."""

from __future__ import annotations

import base64
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
