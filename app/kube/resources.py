"""The resources Tessera serves, as Kubernetes discovery describes them.

One table of data drives `/api/v1`, `/apis`, `/apis/<group>/v1` (what `kubectl api-resources`
lists), the group-version-kind tags of the OpenAPI documents kubectl reads, and which verbs the
authorization rules (app/auth/rules.py) consider served: every verb listed here has a route.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.constants import (
    AUTHENTICATION_GROUP,
    AUTHORIZATION_GROUP,
    BILLING_GROUP,
    METRICS_GROUP,
    POLICY_GROUP,
    SCHEDULING_GROUP,
    TESSERA_GROUP,
    TESSERA_VERSION,
)
from app.registry.kinds import KINDS

ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Resource:
    name: str  # plural, as in the URL
    singular: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    group: str = ""
    version: str = "v1"
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[tuple[str, str, tuple[str, ...]], ...] = field(default=())
    schema: str = ""  # the OpenAPI schema of the kind when not named as it (two PodGroups)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def api_version(self) -> str:
        return self.group_version


RESOURCES = (
    Resource(
        "pods",
        "pod",
        "Pod",
        True,
        (*ALL_VERBS, "deletecollection"),
        short_names=("po",),
        categories=("all",),
        subresources=(
            ("attach", "PodAttachOptions", ("create", "get")),  # WebSocket (app/sessions)
            ("binding", "Binding", ("create",)),
            ("eviction", "Eviction", ("create",)),
            ("exec", "PodExecOptions", ("create", "get")),
            ("log", "Pod", ("create", "get")),  # create: its node sends it
            ("portforward", "PodPortForwardOptions", ("create", "get")),
            ("resize", "Pod", ("get", "patch", "update")),
            ("status", "Pod", ("get", "patch", "update")),
        ),
    ),
    Resource(
        "namespaces",
        "namespace",
        "Namespace",
        False,
        ALL_VERBS,
        short_names=("ns",),
    ),
    Resource("nodes", "node", "Node", False, ALL_VERBS, short_names=("no",)),
    Resource("events", "event", "Event", True, ("create", "list", "watch"), short_names=("ev",)),
    Resource(  # always empty (app/kube/services.py): evictions are never refused for a budget
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        True,
        ("get", "list"),
        group=POLICY_GROUP,
        short_names=("pdb",),
    ),
    Resource(
        "gpudevices",
        "gpudevice",
        "GPUDevice",
        False,
        ("get", "list", "patch", "watch"),
        group=TESSERA_GROUP,
        version=TESSERA_VERSION,
        short_names=("gpu", "gpus"),
        categories=("tessera",),
        subresources=(
            ("fault", "GPUFault", ("create",)),
            ("repair", "GPUDevice", ("create",)),
        ),
    ),
    Resource(
        "tenants",
        "tenant",
        "Tenant",
        False,
        ("create", "get", "list", "update", "patch"),
        group=TESSERA_GROUP,
        version=TESSERA_VERSION,
        categories=("tessera",),
        subresources=(("tokens", "TenantToken", ("create",)),),
    ),
    Resource(  # a node agent's token: POST only, never stored but as a hash
        "nodetokens",
        "nodetoken",
        "NodeToken",
        False,
        ("create",),
        group=TESSERA_GROUP,
        version=TESSERA_VERSION,
        categories=("tessera",),
    ),
    Resource(  # many pods created in one request, each as POST .../pods (app/pods/router.py)
        "podbatches",
        "podbatch",
        "PodBatch",
        True,
        ("create",),
        group=TESSERA_GROUP,
        version=TESSERA_VERSION,
    ),
    # Billing: the price book (the admin writes, tenants read), a tenant's daily statements,
    # and usage reports (a list of rows, never stored); its commitment plan is a kind of the
    # registry (below).
    Resource(
        "prices",
        "price",
        "Price",
        False,
        ("create", "delete", "get", "list", "patch"),
        group=BILLING_GROUP,
        categories=("billing",),
    ),
    Resource(
        "statements",
        "statement",
        "Statement",
        True,
        ("get", "list"),
        group=BILLING_GROUP,
        categories=("billing",),
    ),
    # `kubectl get usage` (by resource) and `kubectl get usage workload`: a report grouped by
    # what the name says (app/billing_api/router.py)
    Resource("usage", "usage", "Usage", True, ("get", "list"), group=BILLING_GROUP),
    # Questions about the caller, answered and never stored (`kubectl auth can-i`, `whoami`).
    Resource(
        "selfsubjectaccessreviews",
        "",
        "SelfSubjectAccessReview",
        False,
        ("create",),
        group=AUTHORIZATION_GROUP,
    ),
    Resource(
        "selfsubjectrulesreviews",
        "",
        "SelfSubjectRulesReview",
        False,
        ("create",),
        group=AUTHORIZATION_GROUP,
    ),
    Resource(
        "selfsubjectreviews",
        "",
        "SelfSubjectReview",
        False,
        ("create",),
        group=AUTHENTICATION_GROUP,
    ),
    # Resource usage as metrics-server serves it (`kubectl top`; app/resourcemetrics).
    Resource("nodes", "", "NodeMetrics", False, ("get", "list"), METRICS_GROUP, "v1beta1"),
    Resource("pods", "", "PodMetrics", True, ("get", "list"), METRICS_GROUP, "v1beta1"),
    # The kinds the generic registry keeps (app/registry): every verb, as each strategy says.
    *(
        Resource(
            k.resource,
            k.singular,
            k.kind,
            k.namespaced,
            (*ALL_VERBS, "deletecollection"),
            group=k.group,
            version=k.version,
            short_names=k.short_names,
            categories=k.categories,
            subresources=(
                *((("status", k.kind, ("get", "patch", "update")),) if k.has_status else ()),
                *((("scale", "Scale", ("get", "patch", "update")),) if k.scale_path else ()),
                *k.own_subresources,
            ),
            schema=k.model.__name__,
        )
        for k in KINDS
    ),
)


def by_group_version(group_version: str) -> list[Resource]:
    return [r for r in RESOURCES if r.group_version == group_version]


def api_resource_list(group_version: str) -> dict[str, object]:
    resources: list[dict[str, object]] = []
    for r in by_group_version(group_version):
        entry: dict[str, object] = {
            "name": r.name,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        resources.append(entry)
        for sub, kind, verbs in r.subresources:
            sub_entry: dict[str, object] = {
                "name": f"{r.name}/{sub}",
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": list(verbs),
            }
            if kind in SUBRESOURCE_GROUP_VERSIONS:  # a kind of another group, as Eviction
                sub_entry["group"], sub_entry["version"] = SUBRESOURCE_GROUP_VERSIONS[kind]
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


# Subresources whose kind belongs to another API group. kubectl drain evicts (rather than
# deletes) only when the `policy` group is listed and `pods/eviction` names its group-version.
SUBRESOURCE_GROUP_VERSIONS = {"Eviction": (POLICY_GROUP, "v1"), "Scale": ("autoscaling", "v1")}


def api_groups() -> list[str]:
    """The named groups in the order discovery lists them: scheduling.x-k8s.io last, so that
    kubectl resolves a bare `podgroups` (and `pg`) to tessera.io's, as before it was served."""
    return sorted({r.group for r in RESOURCES if r.group}, key=lambda g: (g == SCHEDULING_GROUP, g))


def group_version_of(group: str) -> str:
    """The one version a named group is served at (v1, or v1alpha1 for scheduling.x-k8s.io)."""
    return next(r.version for r in RESOURCES if r.group == group)


def gvk_of_path(path: str) -> tuple[Resource, str] | None:
    """The resource an API path addresses, and whether it names one object ("item") or a
    collection ("list"); None for other paths."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts:
        return None
    if parts[0] == "api":
        group, rest = "", parts[2:]
        version = parts[1] if len(parts) > 1 else ""
    elif parts[0] == "apis" and len(parts) > 2:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return None
    for r in RESOURCES:
        if r.group == group and r.version == version and r.name == rest[0]:
            if len(rest) == 1:
                return r, "list"
            if len(rest) == 2:
                return r, "item"
            return r, rest[2]
    return None
