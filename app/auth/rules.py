"""Who may do what: the one set of rules the API enforces and `kubectl auth can-i` answers from.

`decide` is pure: it takes the caller, the request's attributes (verb, resource, namespace,
name, as Kubernetes' authorizers see them) and what the namespace the request concerns is (its
owner), and returns allowed or not with the reason in words. Every route handler asks it
(through `require` or `app.namespaces.service.authorize`), and so do the access reviews.

- The admin may do everything Tessera serves, except delete a system namespace.
- A tenant may use pods, events, pod groups and callbacks in the namespaces it owns (`<tenant>` and
  `<tenant>-<suffix>`), and list and watch them across all of them; it may read nodes and GPU
  devices; it may create namespaces named `<tenant>` or `<tenant>-<suffix>` and read, change and
  delete its own; it may do nothing with tenants, tokens or bindings.
- A tenant reads the ResourceQuotas of its namespaces (get, list, watch); the admin writes them.
- Billing: a tenant reads the price book, manages its commitment plan and reads its statements
  and usage in its own namespaces; only the admin writes prices.
- A node token (its agent) may act for its node alone: read, register and change its Node and
  GPU devices, hold its Lease in `kube-node-lease`, and use the pods bound to it: read them,
  list and watch them across namespaces only with `fieldSelector=spec.nodeName=<itself>`,
  report their status and remove them once stopped. Which node a pod or GPU is on is for the
  caller to give (`object_node`); unknown, it counts as another node's.
- Anyone may create access reviews and read discovery and the OpenAPI documents.
- Whatever Tessera does not serve (a resource, a subresource or a verb) is refused for everyone.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from app.constants import (
    AUTHENTICATION_GROUP,
    AUTHORIZATION_GROUP,
    BILLING_GROUP,
    COORDINATION_GROUP,
    METRICS_GROUP,
    NODE_LEASE_NAMESPACE,
    POLICY_GROUP,
    SYSTEM_NAMESPACES,
    TESSERA_GROUP,
)
from app.errors import Forbidden, ResourceRef

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.kube.resources import Resource
    from app.namespaces.service import NamespaceInfo

READ = frozenset({"get", "list", "watch"})
CLUSTER_WIDE_READ = frozenset({"list", "watch"})


class Access(enum.Enum):
    """What a tenant may do with one resource."""

    NONE = "nothing"
    READ = "get, list and watch"
    OWN_NAMESPACES = "everything in its own namespaces"
    READ_OWN_NAMESPACES = "get, list and watch in its own namespaces"
    NAMESPACES = "create namespaces with its prefix, and use its own"
    ANYONE = "create (asks about the caller only)"


_TENANT_BASE: dict[tuple[str, str], Access] = {
    ("", "pods"): Access.OWN_NAMESPACES,
    ("", "pods/binding"): Access.NONE,  # the scheduler binds
    ("", "pods/eviction"): Access.OWN_NAMESPACES,
    ("", "pods/log"): Access.OWN_NAMESPACES,
    ("", "pods/exec"): Access.OWN_NAMESPACES,  # kubectl exec, attach, port-forward
    ("", "pods/attach"): Access.OWN_NAMESPACES,
    ("", "pods/portforward"): Access.OWN_NAMESPACES,
    (METRICS_GROUP, "pods"): Access.READ_OWN_NAMESPACES,  # kubectl top pod
    (METRICS_GROUP, "nodes"): Access.READ,  # kubectl top node
    ("", "pods/resize"): Access.OWN_NAMESPACES,
    ("", "events"): Access.OWN_NAMESPACES,
    (POLICY_GROUP, "poddisruptionbudgets"): Access.OWN_NAMESPACES,  # always empty
    ("", "namespaces"): Access.NAMESPACES,
    ("", "nodes"): Access.READ,
    (TESSERA_GROUP, "gpudevices"): Access.READ,
    (TESSERA_GROUP, "gpudevices/fault"): Access.NONE,  # see require_gpu_report
    (TESSERA_GROUP, "gpudevices/repair"): Access.NONE,
    (TESSERA_GROUP, "tenants"): Access.NONE,
    (TESSERA_GROUP, "tenants/tokens"): Access.NONE,
    (TESSERA_GROUP, "nodetokens"): Access.NONE,
    (TESSERA_GROUP, "podbatches"): Access.OWN_NAMESPACES,  # creates pods, as pods' create
    (BILLING_GROUP, "prices"): Access.READ,
    (BILLING_GROUP, "commitments"): Access.OWN_NAMESPACES,
    (BILLING_GROUP, "statements"): Access.OWN_NAMESPACES,  # served read-only
    (BILLING_GROUP, "usage"): Access.OWN_NAMESPACES,  # served read-only
    (COORDINATION_GROUP, "leases"): Access.NONE,  # node agents' and the control plane's
    ("", "pods/status"): Access.NONE,  # the node that runs the pod reports it
    (AUTHORIZATION_GROUP, "selfsubjectaccessreviews"): Access.ANYONE,
    (AUTHORIZATION_GROUP, "selfsubjectrulesreviews"): Access.ANYONE,
    (AUTHENTICATION_GROUP, "selfsubjectreviews"): Access.ANYONE,
}

# Where `kubectl cluster-info` looks for the cluster's Services: anyone reads them (there are
# none, as against a minimal cluster, so it prints the control plane's address).
SERVICES_FOR_ANYONE = "kube-system"

# The controller manager's token (role `controller`, `tessera controllers`): every verb on the
# workload kinds (the registry's kinds whose strategy says `workload`, with their status and
# scale; Services among them: a JobSet's headless Service), pods and events (and reading
# disruption budgets), and tessera.io PodGroups (a JobSet's gang), in every namespace that
# belongs to a tenant (and list and watch them across namespaces); its leader Lease in
# kube-system. Nothing else: not nodes, prices, tenants, tokens, billing, nor any system
# namespace's objects.
_CONTROLLER_BASE: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "pods"),
        ("", "events"),
        ("", "services"),  # a workload kind too: the JobSet controller makes them
        (POLICY_GROUP, "poddisruptionbudgets"),  # read only, as Tessera serves them
        (TESSERA_GROUP, "podgroups"),
        (TESSERA_GROUP, "podbatches"),  # a ReplicaSet's or a Job's pods at once
    }
)


@functools.cache
def _tables() -> tuple[dict[tuple[str, str], Access], frozenset[tuple[str, str]]]:
    """_TENANT_BASE and _CONTROLLER_BASE's resources with the registry's kinds added.

    Built on the first decision, not at import: the kinds and their schemas take a third of a
    second to import, which the CLI's tenant and billing commands, which decide nothing, skip.
    A tenant uses a namespaced kind in its own namespaces and reads a cluster-scoped one; a kind
    whose strategy says tenants only read it (ResourceQuota) is read in its own namespaces."""
    from app.registry.kinds import KINDS

    tenant = dict(_TENANT_BASE)
    controller = set(_CONTROLLER_BASE)
    for kind in KINDS:
        if not kind.namespaced:
            access = Access.READ
        elif kind.tenants_read_only:
            access = Access.READ_OWN_NAMESPACES
        else:
            access = Access.OWN_NAMESPACES
        tenant.setdefault((kind.group, kind.resource), access)
        for sub, *_ in kind.own_subresources:  # a Callback's rotate and deliveries
            tenant.setdefault((kind.group, f"{kind.resource}/{sub}"), access)
        if kind.has_status and kind.tenants_read_only:
            tenant.setdefault((kind.group, f"{kind.resource}/status"), access)
        if kind.scale_path is not None:  # kubectl scale
            tenant.setdefault((kind.group, f"{kind.resource}/scale"), access)
        if kind.has_status and kind.workload:  # its controller writes it; its tenant reads it
            tenant.setdefault((kind.group, f"{kind.resource}/status"), Access.READ_OWN_NAMESPACES)
        if kind.workload and kind.namespaced:
            controller.add((kind.group, kind.resource))
            if kind.has_status:
                controller.add((kind.group, f"{kind.resource}/status"))
            if kind.scale_path is not None:
                controller.add((kind.group, f"{kind.resource}/scale"))
    return tenant, frozenset(controller)


def tenant_access(group: str, resource: str) -> Access:
    """What a tenant may do with a resource (or "resource/subresource")."""
    return _tables()[0].get((group, resource), Access.NONE)


CONTROLLER_LEASE_NAMESPACE = "kube-system"

# Paths outside the resource API that every authenticated caller may GET (Kubernetes' discovery
# role); `*` stands for any rest of the path.
NON_RESOURCE_URLS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
)


@dataclass(frozen=True)
class Attributes:
    """A request as an authorizer sees it (Kubernetes' ResourceAttributes)."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def with_resource(self, resource: str) -> Attributes:
        """`resource` may carry the subresource: "pods/binding"."""
        main, _, sub = resource.partition("/")
        return Attributes(self.verb, main, self.group, sub, self.namespace, self.name)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


def served(group: str, resource: str, subresource: str = "") -> tuple[Resource, tuple[str, ...]]:
    """The resource and the verbs Tessera serves for it (or its subresource); KeyError if none."""
    from app.kube.resources import RESOURCES  # with the kinds: on the first decision (_tables)

    for r in RESOURCES:
        if r.group == group and r.name == resource:
            if not subresource:
                return r, r.verbs
            for sub, _kind, verbs in r.subresources:
                if sub == subresource:
                    return r, verbs
    raise KeyError(resource)


def concerned_namespace(attrs: Attributes) -> str | None:
    """The namespace whose owner decides the request: the request's namespace for a namespaced
    resource, the named namespace for `namespaces`; None when no owner matters."""
    if attrs.group == "" and attrs.resource == "namespaces" and not attrs.subresource:
        return attrs.name or None
    try:
        resource, _ = served(attrs.group, attrs.resource, attrs.subresource)
    except KeyError:
        return None
    return attrs.namespace or None if resource.namespaced else None


def decide(
    principal: Principal,
    attrs: Attributes,
    namespace: NamespaceInfo | None,
    *,
    object_node: str | None = None,
) -> Decision:
    """Allowed or not, and why. `namespace`: the namespace `concerned_namespace(attrs)` names,
    as it exists (None when it does not, or when none is concerned). `object_node`: the node
    the named pod or GPU device is on (asked only for a node's token)."""
    what = _what(attrs)
    try:
        resource, verbs = served(attrs.group, attrs.resource, attrs.subresource)
    except KeyError:
        group = f' in API group "{attrs.group}"' if attrs.group else ""
        return Decision(False, f'Tessera does not serve the resource "{what}"{group}')
    if attrs.verb not in verbs:
        return Decision(
            False, f"Tessera serves {what} for the verbs {', '.join(verbs)}, not {attrs.verb}"
        )
    if (
        what == "namespaces"
        and attrs.verb == "delete"
        and (attrs.name in SYSTEM_NAMESPACES or not attrs.name)
    ):
        target = f'"{attrs.name}"' if attrs.name else "every namespace"
        return Decision(
            False,
            f"a system namespace cannot be deleted ({', '.join(SYSTEM_NAMESPACES)}), so not "
            f"{target}",
        )
    if principal.is_admin:
        return Decision(True, "the admin may do everything Tessera serves")
    if principal.is_node:
        return _node(principal, attrs, object_node)
    if principal.is_controller:
        return _controller(attrs, namespace)
    if (attrs.group, what, attrs.namespace) == ("", "services", SERVICES_FOR_ANYONE) and (
        attrs.verb in READ
    ):
        return Decision(True, f"anyone may {attrs.verb} the Services of {SERVICES_FOR_ANYONE}")
    access = tenant_access(attrs.group, what)
    tenant = principal.tenant_name or ""
    who = f'tenant "{tenant}"'
    if (
        (attrs.group, what) == (TESSERA_GROUP, "tenants")
        and attrs.verb in ("get", "update", "patch")
        and attrs.name
        and attrs.name == tenant
    ):
        # its own Tenant: read it, and set its spec.budget (app/budgets says which fields)
        return Decision(True, f"{who} may get its own Tenant and set its spec.budget")
    if (attrs.group, what) == ("", "pods/log") and attrs.verb not in READ:
        return Decision(
            False, f"{who} may read the logs of its pods; only the node running a pod writes them"
        )
    if (attrs.group, what) == ("", "events") and attrs.verb not in READ:
        return Decision(
            False, f"{who} may read the events of its namespaces; only Tessera writes them"
        )
    if access is Access.ANYONE:
        return Decision(True, f"anyone may {attrs.verb} {what}")
    if access is Access.READ:
        if attrs.verb in READ:
            return Decision(True, f"every tenant may get, list and watch {what}")
        return Decision(False, f"only the admin may {attrs.verb} {what}; tenants may only read")
    if access is Access.READ_OWN_NAMESPACES and attrs.verb not in READ:
        return Decision(
            False,
            f"only the admin may {attrs.verb} {what}; {who} may get, list and watch them in "
            "its own namespaces",
        )
    if access in (Access.OWN_NAMESPACES, Access.READ_OWN_NAMESPACES):
        if not resource.namespaced:  # pragma: no cover - the table lists only namespaced ones
            return Decision(False, f"a tenant may do nothing with {what}")
        if not attrs.namespace:
            if attrs.verb in CLUSTER_WIDE_READ:
                return Decision(
                    True,
                    f"{who} may {attrs.verb} {what} across namespaces and sees only its own",
                )
            return Decision(False, f"{who} may {attrs.verb} {what} only in a namespace it owns")
        if _owns(principal, namespace):
            return Decision(True, f'{who} owns namespace "{attrs.namespace}"')
        return Decision(
            False,
            f'{who} may {attrs.verb} {what} only in namespaces it owns, and "{attrs.namespace}" '
            "is not one of them",
        )
    if access is Access.NAMESPACES:
        return _tenant_namespaces(principal, attrs, namespace)
    return Decision(False, f"only the admin may {attrs.verb} {what}")


NODE_POD_VERBS = frozenset({"get", "list", "watch", "delete"})


def _node(principal: Principal, attrs: Attributes, object_node: str | None) -> Decision:
    """What a node's token may do: only what concerns its own node."""
    node = principal.node_name or ""
    who = f'node "{node}"'
    what = attrs.full_resource
    verb = attrs.verb
    if tenant_access(attrs.group, what) is Access.ANYONE:
        return Decision(True, f"anyone may {verb} {what}")
    if (attrs.group, what) == ("", "nodes"):
        if verb in ("get", "create", "update", "patch") and attrs.name == node:
            return Decision(True, f"{who} may {verb} its own Node")
        return Decision(False, f'{who} may get, create, update and patch only the Node "{node}"')
    if (attrs.group, what) == (TESSERA_GROUP, "gpudevices"):
        if verb in CLUSTER_WIDE_READ:
            return Decision(True, f"{who} may {verb} GPU devices and sees only its own")
        if verb in ("get", "patch") and attrs.name and object_node == node:
            return Decision(True, f'GPU device "{attrs.name}" is on {who}')
        return Decision(False, f"{who} may get and patch only the GPU devices on it")
    if (attrs.group, what) == (TESSERA_GROUP, "gpudevices/fault"):
        if verb == "create" and attrs.name and object_node == node:
            return Decision(True, f'GPU device "{attrs.name}" is on {who}: it may report its fault')
        return Decision(False, f"{who} may report faults of the GPU devices on it only")
    if (attrs.group, what) == (COORDINATION_GROUP, "leases"):
        if attrs.namespace != NODE_LEASE_NAMESPACE or attrs.name != node:
            return Decision(
                False,
                f'{who} may use only its own Lease, "{node}" in namespace "{NODE_LEASE_NAMESPACE}"',
            )
        if verb in ("get", "create", "update", "patch"):
            return Decision(True, f"{who} may {verb} its own Lease")
        return Decision(False, f"{who} may get, create, update and patch its Lease, not {verb}")
    if (attrs.group, what) in (("", "configmaps"), ("", "secrets")):
        if verb == "get" and attrs.name and object_node == node:
            return Decision(True, f'a pod bound to {who} uses {what} "{attrs.name}"')
        return Decision(
            False, f"{who} may get only the {what} that the pods bound to it use, one by one"
        )
    if (attrs.group, what) == ("", "events"):
        if verb == "create" and object_node == node:
            return Decision(True, f"the pod the event is about is bound to {who}")
        return Decision(False, f"{who} may create events only about the pods bound to it")
    if (attrs.group, what) == ("", "pods/log"):
        if verb in ("create", "get") and attrs.name and object_node == node:
            # get: a restarted agent reads where the log it sent ends, to send only the rest
            return Decision(
                True, f'pod "{attrs.name}" is bound to {who}: it may send and read its log'
            )
        return Decision(False, f"{who} may send and read the logs of the pods bound to it only")
    if (attrs.group, what) in (("", "pods"), ("", "pods/status")):
        status = what == "pods/status"
        if not status and verb in CLUSTER_WIDE_READ and not attrs.namespace:
            return Decision(
                True, f"{who} may {verb} pods with fieldSelector spec.nodeName={node} only"
            )
        allowed = ("update", "patch", "get") if status else NODE_POD_VERBS - CLUSTER_WIDE_READ
        if verb in allowed and attrs.name and object_node == node:
            return Decision(True, f'pod "{attrs.name}" is bound to {who}')
        if status:
            return Decision(False, f"{who} may get, update and patch the status of its pods only")
        return Decision(
            False,
            f"{who} may get and delete only the pods bound to it, and list and watch them "
            f"across namespaces with fieldSelector spec.nodeName={node}",
        )
    return Decision(
        False,
        f"{who} may use only its Node, its GPU devices, its Lease and the pods bound to it, "
        f"not {what}",
    )


def _controller(attrs: Attributes, namespace: NamespaceInfo | None) -> Decision:
    """What the controller manager's token may do (_CONTROLLER_BASE and the workload kinds)."""
    who = "the controller manager"
    what = attrs.full_resource
    if tenant_access(attrs.group, what) is Access.ANYONE:
        return Decision(True, f"anyone may {attrs.verb} {what}")
    if (attrs.group, what) == (COORDINATION_GROUP, "leases"):
        if attrs.namespace == CONTROLLER_LEASE_NAMESPACE:
            return Decision(True, f"{who} may use leases in {CONTROLLER_LEASE_NAMESPACE}")
        return Decision(
            False, f"{who} may use leases only in namespace {CONTROLLER_LEASE_NAMESPACE}"
        )
    if (attrs.group, what) not in _tables()[1]:
        return Decision(
            False, f"{who} may use only the workload kinds, pods, events and its lease, not {what}"
        )
    if not attrs.namespace:
        if attrs.verb in CLUSTER_WIDE_READ:
            return Decision(True, f"{who} may {attrs.verb} {what} across namespaces")
        return Decision(False, f"{who} may {attrs.verb} {what} only in a tenant's namespace")
    if namespace is not None and namespace.tenant_id is not None:
        return Decision(True, f'namespace "{attrs.namespace}" belongs to a tenant')
    return Decision(
        False,
        f"{who} may {attrs.verb} {what} only in namespaces that belong to a tenant, and "
        f'"{attrs.namespace}" is not one',
    )


def _tenant_namespaces(
    principal: Principal, attrs: Attributes, namespace: NamespaceInfo | None
) -> Decision:
    tenant = principal.tenant_name or ""
    who = f'tenant "{tenant}"'
    name = attrs.name
    own_name = bool(tenant) and (name == tenant or name.startswith(f"{tenant}-"))
    if attrs.verb in CLUSTER_WIDE_READ:
        return Decision(True, f"{who} may {attrs.verb} namespaces and sees only its own")
    if attrs.verb == "create":
        if own_name:
            return Decision(True, f'{who} may create namespaces named "{tenant}" or "{tenant}-*"')
        return Decision(
            False, f'{who} may create only namespaces named "{tenant}" or "{tenant}-<suffix>"'
        )
    if not name:
        return Decision(False, f"{who} may {attrs.verb} only its own namespaces: name one")
    if _owns(principal, namespace):
        return Decision(True, f'{who} owns namespace "{name}"')
    if namespace is None and own_name:
        return Decision(True, f'{who} may create namespace "{name}" and then use it')
    return Decision(False, f'{who} may {attrs.verb} only its own namespaces; "{name}" is not one')


def _owns(principal: Principal, namespace: NamespaceInfo | None) -> bool:
    return namespace is not None and (
        principal.is_admin
        or (namespace.tenant_id is not None and namespace.tenant_id == principal.tenant_id)
    )


def _what(attrs: Attributes) -> str:
    return attrs.full_resource


# Paths outside the resource API only the admin may GET.
ADMIN_URLS = ("/metrics",)


def decide_path(principal: Principal, verb: str, path: str) -> Decision:
    """A request outside the resource API (Kubernetes' NonResourceAttributes)."""
    if verb == "get" and any(fnmatchcase(path, pattern) for pattern in NON_RESOURCE_URLS):
        return Decision(True, f"anyone may get {path}")
    if verb == "get" and path in ADMIN_URLS:
        if principal.is_admin:
            return Decision(True, f"the admin may get {path}")
        return Decision(False, f"only the admin may get {path}")
    if verb != "get":
        return Decision(False, f"the paths outside the resource API take only get, not {verb}")
    return Decision(False, f"Tessera serves no path {path} outside the resource API")


def forbidden(
    principal: Principal,
    verb: str,
    resource: str,
    namespace: str | None,
    name: str = "",
    group: str = "",
    reason: str = "",
) -> Forbidden:
    """Kubernetes' RBAC wording; identical whether or not the object exists."""
    what = f"{resource}.{group}" if group else resource
    target = f' "{name}"' if name else ""
    scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    because = f": {reason}" if reason else ""
    return Forbidden(
        f'{what}{target} is forbidden: User "{principal.username}" cannot {verb} resource '
        f'"{resource}" in API group "{group}"{scope}{because}',
        ref=ResourceRef(resource, name, group),
    )


def require(
    principal: Principal,
    *,
    verb: str,
    resource: str,
    group: str = "",
    name: str = "",
    namespace: NamespaceInfo | None = None,
    object_node: str | None = None,
) -> None:
    """Raise Forbidden unless `decide` allows a request that needs no namespace owner (a
    cluster-scoped resource, or a list across namespaces)."""
    attrs = Attributes(verb, "", group, name=name).with_resource(resource)
    decision = decide(principal, attrs, namespace, object_node=object_node)
    if not decision.allowed:
        raise forbidden(principal, verb, resource, None, name, group, decision.reason)


def require_gpu_report(
    principal: Principal, *, action: str, gpu: str, gpu_node: str | None
) -> None:
    """Who may report a fault on a GPU (`action` "fault") or its repair ("repair"): the admin,
    and for a fault also the node agent of the GPU's node (`gpu_node`: None when there is no such
    GPU, which answers as for another node's GPU). A repair is the admin's alone."""
    require(
        principal,
        verb="create",
        resource=f"gpudevices/{action}",
        group=TESSERA_GROUP,
        name=gpu,
        object_node=gpu_node,
    )
