"""The endpoint controller: each Service's EndpointSlice, kept from the pods its selector picks.

One slice per Service with a selector, named like the Service, labelled
`kubernetes.io/service-name` and owned by it (the garbage collector removes it with the Service).
An endpoint is a pod of the namespace that matches the selector and has an address
(`status.podIP`; a pod without one is not listed, as in Kubernetes): `ready` when the pod is
Ready and not being deleted (or always, with `publishNotReadyAddresses`), `serving`, and
`terminating` while it stops; with its `hostname` when the pod's `subdomain` is the Service (a
headless Service's pods are found by `<hostname>.<service>`), its node and a reference to it.
The ports are the Service's, with a named target port resolved on each pod's containers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.controllers.base import Controller
from app.controllers.client import PODS, ApiError, Obj, Resource
from app.controllers.informer import text_key

SERVICES = Resource("", "v1", "services")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"


def _selects(selector: dict[str, str], pod: Obj) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _ready(pod: Obj) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _endpoint(service: Obj, pod: Obj) -> Obj:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    terminating = bool(meta.get("deletionTimestamp"))
    ready = _ready(pod)
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    endpoint: Obj = {
        "addresses": [status["podIP"]],
        "conditions": {
            "ready": publish or (ready and not terminating),
            "serving": publish or ready,
            "terminating": terminating,
        },
        "targetRef": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid"),
        },
    }
    if spec.get("nodeName"):
        endpoint["nodeName"] = spec["nodeName"]
    if spec.get("hostname") and spec.get("subdomain") == service["metadata"]["name"]:
        endpoint["hostname"] = spec["hostname"]
    return endpoint


def _ports(service: Obj, pods: list[Obj]) -> list[Obj]:
    ports = []
    for port in (service.get("spec") or {}).get("ports") or []:
        target: Any = port.get("targetPort", port.get("port"))
        if isinstance(target, str):  # a container port's name: the first pod's number for it
            target = next(
                (
                    p.get("containerPort")
                    for pod in pods
                    for c in (pod.get("spec") or {}).get("containers") or []
                    for p in c.get("ports") or []
                    if p.get("name") == target
                ),
                None,
            )
        if target is None:
            continue
        entry: Obj = {"port": int(target), "protocol": port.get("protocol") or "TCP"}
        if port.get("name"):
            entry["name"] = port["name"]
        if port.get("appProtocol"):
            entry["appProtocol"] = port["appProtocol"]
        ports.append(entry)
    return ports


def desired_slice(service: Obj, pods: Iterable[Obj]) -> Obj | None:
    """The EndpointSlice `service` should have given the namespace's `pods` (None: a Service
    without a selector, whose slices are its owner's to write)."""
    selector = (service.get("spec") or {}).get("selector")
    if not selector:
        return None
    meta = service["metadata"]
    chosen = sorted(
        (
            p
            for p in pods
            if _selects(selector, p)
            and (p.get("status") or {}).get("podIP")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ),
        key=lambda p: p["metadata"]["name"],
    )
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {SERVICE_NAME_LABEL: meta["name"], MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": [_endpoint(service, p) for p in chosen],
        "ports": _ports(service, chosen),
    }


class EndpointController(Controller):
    """Keys are Services (`namespace/name`); a pod's change concerns the Services of its
    namespace that select it (before or after the change)."""

    name = "endpoints"
    resources = (SERVICES, PODS, ENDPOINT_SLICES)

    def key_of(self, resource: Resource, obj: Obj) -> Iterable[str]:
        meta = obj.get("metadata") or {}
        if resource == SERVICES:
            return (text_key(obj),)
        if resource == ENDPOINT_SLICES:
            service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
            return (f"{meta.get('namespace')}/{service}",) if service else ()
        namespace = meta.get("namespace") or ""
        return [
            text_key(service)
            for service in self.informers[SERVICES].objects(namespace)
            if (service.get("spec") or {}).get("selector")
            and _selects(service["spec"]["selector"], obj)
        ]

    async def reconcile(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        service = self.informers[SERVICES].get(namespace, name)
        current = self.informers[ENDPOINT_SLICES].get(namespace, name)
        if service is None or (service.get("metadata") or {}).get("deletionTimestamp"):
            return None  # its slice goes with it (the garbage collector)
        desired = desired_slice(service, self.informers[PODS].objects(namespace))
        if desired is None:
            return None
        slices = self.informers[ENDPOINT_SLICES]
        if current is None:
            try:
                # in the shared cache at once: the garbage collector, orphaning the slices of
                # a Service deleted right after, must not find none for want of the watch
                slices.wrote(await self.client.create(ENDPOINT_SLICES, namespace, desired))
            except ApiError as exc:
                if not exc.conflict:  # made meanwhile: the watch brings it, then an update
                    raise
            return None
        same = all(current.get(k) == desired[k] for k in ("endpoints", "ports")) and (
            (current["metadata"].get("labels") or {}) == desired["metadata"]["labels"]
        )
        if not same:
            body = {
                **desired,
                "metadata": {
                    **desired["metadata"],
                    "resourceVersion": current["metadata"].get("resourceVersion"),
                },
            }
            slices.wrote(await self.client.update(ENDPOINT_SLICES, namespace, name, body))
        return None
