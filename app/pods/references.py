"""The ConfigMaps and Secrets a pod's spec names: what its node may read (as Kubernetes' node
authorizer allows a kubelet to read only those of the pods bound to it)."""

from __future__ import annotations

from typing import Any

CONFIGMAPS = "configmaps"
SECRETS = "secrets"


def referenced(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(resource, name) of every ConfigMap and Secret the pod uses: its containers' env and
    envFrom, its volumes (configMap, secret, projected) and its imagePullSecrets."""
    out: set[tuple[str, str]] = set()

    def add(resource: str, name: Any) -> None:
        if isinstance(name, str) and name:
            out.add((resource, name))

    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        for item in container.get("env") or []:
            source = item.get("valueFrom") or {}
            add(CONFIGMAPS, (source.get("configMapKeyRef") or {}).get("name"))
            add(SECRETS, (source.get("secretKeyRef") or {}).get("name"))
        for source in container.get("envFrom") or []:
            add(CONFIGMAPS, (source.get("configMapRef") or {}).get("name"))
            add(SECRETS, (source.get("secretRef") or {}).get("name"))
    for volume in spec.get("volumes") or []:
        add(CONFIGMAPS, (volume.get("configMap") or {}).get("name"))
        add(SECRETS, (volume.get("secret") or {}).get("secretName"))
        for source in (volume.get("projected") or {}).get("sources") or []:
            add(CONFIGMAPS, (source.get("configMap") or {}).get("name"))
            add(SECRETS, (source.get("secret") or {}).get("name"))
    for secret in spec.get("imagePullSecrets") or []:
        add(SECRETS, secret.get("name"))
    return out
