"""v1 Service and discovery.k8s.io/v1 EndpointSlice: how a tenant's pods find each other by name.

A Service selects pods by label and names their ports. Tessera serves the ClusterIP type: a
headless Service (`clusterIP: None`) whose EndpointSlices list the ready pods' addresses (what a
JobSet's or an indexed Job's pods look each other up by), and a ClusterIP Service, which also
gets a virtual address from `SERVICE_RANGE`, unique in the pool. Tessera runs no proxy: where a
runtime gives pods a network, a pod reaches another by its address; the cluster IP itself is
the object's, for clients that read it. NodePort, LoadBalancer and ExternalName expose nothing
in a serverless pool and are refused in words.

EndpointSlices are kept by the controller manager's endpoint controller
(app/controllers/endpoints.py) from each Service's selector and the pods' readiness, labelled
`kubernetes.io/service-name` and owned by their Service; tenants read them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, ClassVar, Literal

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import StoredObject, table
from app.errors import Cause
from app.kube.meta import Int32, KubeModel, ListMeta, ObjectMeta, validate_labels
from app.kube.tables import Column, age
from app.registry.strategy import Obj, Strategy

# Where cluster IPs come from (Kubernetes' default service range).
SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/12")
MAX_PORTS = 100
MAX_ENDPOINTS = 1000  # per slice, as Kubernetes' API allows
PROTOCOLS = ("TCP", "UDP", "SCTP")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"


class ServicePort(KubeModel):
    name: str | None = Field(default=None, max_length=63)
    protocol: str | None = Field(default=None, description="TCP (default), UDP or SCTP.")
    app_protocol: str | None = Field(default=None, max_length=253)
    port: Int32 = Field(description="The Service's port, 1-65535.")
    target_port: Int32 | str | None = Field(
        default=None, description="The pods' port (a number, or a container port's name)."
    )
    node_port: Int32 | None = Field(default=None, description="Not served (no NodePort).")


class ServiceSpec(KubeModel):
    type: str | None = Field(default=None, description="ClusterIP (the only type served).")
    selector: dict[str, str] | None = Field(
        default=None, description="The pods it sends to, by label."
    )
    ports: list[ServicePort] | None = Field(default=None, max_length=MAX_PORTS)
    cluster_ip: str | None = Field(
        default=None, alias="clusterIP", description='"None" for a headless Service.'
    )
    cluster_ips: list[str] | None = Field(default=None, alias="clusterIPs", max_length=2)
    publish_not_ready_addresses: bool | None = None
    session_affinity: str | None = None
    ip_families: list[str] | None = Field(default=None, max_length=2)
    ip_family_policy: str | None = None
    internal_traffic_policy: str | None = None


class Service(KubeModel):
    """A name for a set of a namespace's pods, and their ports."""

    api_version: Literal["v1"] | None = "v1"
    kind: Literal["Service"] | None = "Service"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ServiceSpec | None = None
    status: dict[str, Any] | None = None


class ServiceList(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["ServiceList"] = "ServiceList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Service]


def _port_text(port: dict[str, Any]) -> str:
    return f"{port.get('port')}/{port.get('protocol') or 'TCP'}"


class ServiceStrategy(Strategy):
    kind = "Service"
    resource = "services"
    singular = "service"
    model = Service
    list_model = ServiceList
    short_names = ("svc",)
    categories = ("all",)
    summary = "a name for a set of pods and their ports (ClusterIP, headless or not)"
    workload = True  # the endpoint controller reads them
    has_dependents = True  # its EndpointSlice
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the Service.", 0),
        ("Type", "string", "Its type (ClusterIP).", 0),
        ("Cluster-IP", "string", 'Its virtual address, or "None" (headless).', 0),
        ("External-IP", "string", "None in Tessera.", 0),
        ("Port(s)", "string", "Its ports.", 0),
        ("Age", "string", "Time since creation.", 0),
        ("Selector", "string", "The pods it selects.", 1),
    ]

    def row(self, obj: Obj) -> list[Any]:
        spec = obj.get("spec") or {}
        ports = ",".join(_port_text(p) for p in spec.get("ports") or []) or "<none>"
        selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items())
        return [
            obj["metadata"]["name"],
            spec.get("type") or "ClusterIP",
            spec.get("clusterIP") or "<none>",
            "<none>",
            ports,
            age(obj["metadata"].get("creationTimestamp")),
            selector or "<none>",
        ]

    def prepare_create(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        obj["status"] = {"loadBalancer": {}}

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        spec, before = obj.setdefault("spec", {}), old.get("spec") or {}
        for key in ("clusterIP", "clusterIPs", "type", "sessionAffinity", "internalTrafficPolicy"):
            if key not in spec and key in before:
                spec[key] = before[key]
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        obj["status"] = old.get("status") or {"loadBalancer": {}}

    def validate(self, obj: Obj) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        kind = spec.get("type") or "ClusterIP"
        if kind != "ClusterIP":
            causes.append(
                Cause(
                    "spec.type",
                    f'Unsupported value: "{str(kind)[:32]}": Tessera serves ClusterIP Services '
                    "only (a serverless pool has no nodes to open ports on, nor load balancers): "
                    'leave type out, or set clusterIP: "None" for a headless Service',
                    "FieldValueNotSupported",
                )
            )
        causes += validate_labels(spec.get("selector") or {}, "spec.selector")
        ports = spec.get("ports") or []
        if not ports and spec.get("clusterIP") != "None":
            causes.append(
                Cause("spec.ports", "Required value: a ClusterIP Service needs at least one port")
            )
        names: set[str] = set()
        for i, port in enumerate(ports):
            causes += _port_causes(port, f"spec.ports[{i}]", named=len(ports) > 1, names=names)
        ip = spec.get("clusterIP")
        if ip not in (None, "", "None"):
            try:
                address = ipaddress.ip_address(str(ip))
            except ValueError:
                address = None
            if address is None or address not in SERVICE_RANGE:
                causes.append(
                    Cause(
                        "spec.clusterIP",
                        f'Invalid value: "{str(ip)[:45]}": give an address in {SERVICE_RANGE}, '
                        '"None" for a headless Service, or leave it out to have one given',
                    )
                )
        cluster_ips = spec.get("clusterIPs") or []
        if cluster_ips and cluster_ips[0] != ip:
            causes.append(
                Cause("spec.clusterIPs", "Invalid value: its first entry must be spec.clusterIP")
            )
        return causes

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        before = (old.get("spec") or {}).get("clusterIP")
        after = (obj.get("spec") or {}).get("clusterIP")
        if before and after != before:
            return [
                Cause(
                    "spec.clusterIP",
                    f'Invalid value: "{str(after)[:45]}": field is immutable (it is {before}): '
                    "delete the Service and create it again to change it",
                )
            ]
        return []

    def allocate(self, session: Session, obj: Obj) -> list[Cause]:
        """A cluster IP from SERVICE_RANGE no other Service holds (the one asked for, if free)."""
        spec = obj.setdefault("spec", {})
        asked = spec.get("clusterIP")
        if asked == "None":
            spec["clusterIPs"] = ["None"]
            return []
        held = _held_addresses(session)
        if asked:
            if asked in held:
                return [
                    Cause(
                        "spec.clusterIP",
                        f'Invalid value: "{asked}": provided IP is already allocated',
                    )
                ]
            spec["clusterIPs"] = [asked]
            return []
        size = SERVICE_RANGE.num_addresses - 2
        start = int(obj["metadata"]["uid"].replace("-", "")[:8], 16) % size
        for step in range(size):
            candidate = str(SERVICE_RANGE.network_address + 1 + (start + step) % size)
            if candidate not in held:
                spec["clusterIP"], spec["clusterIPs"] = candidate, [candidate]
                return []
        return [Cause("spec.clusterIP", f"Invalid value: every address of {SERVICE_RANGE} is held")]


def _held_addresses(session: Session) -> set[str]:
    objects = table(StoredObject)
    bodies = session.execute(
        select(objects.c.body).where(objects.c.api_group == "", objects.c.resource == "services")
    ).scalars()
    return {str((body.get("spec") or {}).get("clusterIP")) for body in bodies}


def _port_causes(port: dict[str, Any], path: str, *, named: bool, names: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    name = port.get("name")
    if named and not name:
        causes.append(
            Cause(f"{path}.name", "Required value: a Service of several ports names each")
        )
    if name:
        if not _PORT_NAME.fullmatch(name):
            causes.append(Cause(f"{path}.name", f'Invalid value: "{name}": a lowercase DNS label'))
        elif name in names:
            causes.append(Cause(f"{path}.name", f'Duplicate value: "{name}"'))
        names.add(name)
    if not 1 <= int(port.get("port") or 0) <= 65535:
        causes.append(Cause(f"{path}.port", "Invalid value: must be between 1 and 65535"))
    if (port.get("protocol") or "TCP") not in PROTOCOLS:
        causes.append(
            Cause(
                f"{path}.protocol",
                f'Unsupported value: "{str(port.get("protocol"))[:16]}": TCP, UDP or SCTP',
                "FieldValueNotSupported",
            )
        )
    target = port.get("targetPort")
    if isinstance(target, int) and not 1 <= target <= 65535:
        causes.append(Cause(f"{path}.targetPort", "Invalid value: must be between 1 and 65535"))
    if isinstance(target, str) and not _IANA_SVC_NAME.fullmatch(target):
        causes.append(
            Cause(
                f"{path}.targetPort",
                f'Invalid value: "{target[:32]}": a number or a container port\'s name '
                "(at most 15 lowercase letters, digits and dashes)",
            )
        )
    if port.get("nodePort"):
        causes.append(
            Cause(f"{path}.nodePort", "Forbidden: Tessera has no nodes to open a port on")
        )
    return causes


# --- EndpointSlice ------------------------------------------------------------------------------


class EndpointSlice(KubeModel):
    """The ready (and not ready) addresses of a Service's pods, kept by the endpoint
    controller."""

    api_version: Literal["discovery.k8s.io/v1"] | None = "discovery.k8s.io/v1"
    kind: Literal["EndpointSlice"] | None = "EndpointSlice"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    address_type: str | None = Field(default=None, description="IPv4 (the only one served).")
    endpoints: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_ENDPOINTS)
    ports: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_PORTS)


class EndpointSliceList(KubeModel):
    api_version: Literal["discovery.k8s.io/v1"] = "discovery.k8s.io/v1"
    kind: Literal["EndpointSliceList"] = "EndpointSliceList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[EndpointSlice]


class EndpointSliceStrategy(Strategy):
    kind = "EndpointSlice"
    resource = "endpointslices"
    singular = "endpointslice"
    group = "discovery.k8s.io"
    model = EndpointSlice
    list_model = EndpointSliceList
    summary = "the addresses of a Service's pods (kept by the endpoint controller)"
    tenants_read_only = True  # the endpoint controller writes them
    workload = True
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the slice.", 0),
        ("AddressType", "string", "IPv4.", 0),
        ("Ports", "string", "Its ports.", 0),
        ("Endpoints", "string", "Its addresses (the first three).", 0),
        ("Age", "string", "Time since creation.", 0),
    ]

    def row(self, obj: Obj) -> list[Any]:
        ports = ",".join(str(p.get("port")) for p in obj.get("ports") or []) or "<unset>"
        addresses = [a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []]
        shown = ",".join(addresses[:3]) + (
            f" + {len(addresses) - 3} more..." if len(addresses) > 3 else ""
        )
        return [
            obj["metadata"]["name"],
            obj.get("addressType") or "IPv4",
            ports,
            shown or "<unset>",
            age(obj["metadata"].get("creationTimestamp")),
        ]

    def prepare_create(self, obj: Obj) -> None:
        obj.setdefault("addressType", "IPv4")

    def validate(self, obj: Obj) -> list[Cause]:
        if obj.get("addressType") not in ("IPv4", "IPv6", "FQDN"):
            return [
                Cause(
                    "addressType",
                    f'Unsupported value: "{str(obj.get("addressType"))[:16]}": IPv4, IPv6 or FQDN',
                    "FieldValueNotSupported",
                )
            ]
        return []

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        if obj.get("addressType") != old.get("addressType"):
            return [Cause("addressType", "Invalid value: field is immutable")]
        return []
