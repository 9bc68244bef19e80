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
- Billing: a tenant reads the price book, manages its commitment plan and reads its statements
  and usage in its own namespaces; only the admin writes prices.
- Anyone may create access reviews and read discovery and the OpenAPI documents.
- Whatever Tessera does not serve (a resource, a subresource or a verb) is refused for everyone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from app.constants import (
    AUTHENTICATION_GROUP,
    AUTHORIZATION_GROUP,
    BILLING_GROUP,
    POLICY_GROUP,
    SCHEDULING_GROUP,
    SYSTEM_NAMESPACES,
    TESSERA_GROUP,
)
from app.errors import Forbidden, ResourceRef
from app.kube.resources import RESOURCES, Resource

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.namespaces.service import NamespaceInfo

READ = frozenset({"get", "list", "watch"})
CLUSTER_WIDE_READ = frozenset({"list", "watch"})


class Access(enum.Enum):
    """What a tenant may do with one resource."""

    NONE = "nothing"
    READ = "get, list and watch"
    OWN_NAMESPACES = "everything in its own namespaces"
    NAMESPACES = "create namespaces with its prefix, and use its own"
    ANYONE = "create (asks about the caller only)"


TENANT_ACCESS: dict[tuple[str, str], Access] = {
    ("", "pods"): Access.OWN_NAMESPACES,
    ("", "pods/binding"): Access.NONE,  # the scheduler binds
    ("", "pods/eviction"): Access.OWN_NAMESPACES,
    ("", "pods/log"): Access.OWN_NAMESPACES,
    ("", "pods/resize"): Access.OWN_NAMESPACES,
    ("", "events"): Access.OWN_NAMESPACES,
    ("", "services"): Access.OWN_NAMESPACES,  # always empty (and kube-system's, for anyone)
    (POLICY_GROUP, "poddisruptionbudgets"): Access.OWN_NAMESPACES,  # always empty
    ("", "namespaces"): Access.NAMESPACES,
    ("", "nodes"): Access.READ,
    (TESSERA_GROUP, "gpudevices"): Access.READ,
    (TESSERA_GROUP, "gpudevices/fault"): Access.NONE,  # see require_gpu_report
    (TESSERA_GROUP, "gpudevices/repair"): Access.NONE,
    (TESSERA_GROUP, "podgroups"): Access.OWN_NAMESPACES,
    (SCHEDULING_GROUP, "podgroups"): Access.OWN_NAMESPACES,
    (TESSERA_GROUP, "callbacks"): Access.OWN_NAMESPACES,
    (TESSERA_GROUP, "callbacks/rotate"): Access.OWN_NAMESPACES,
    (TESSERA_GROUP, "callbacks/deliveries"): Access.OWN_NAMESPACES,
    (TESSERA_GROUP, "tenants"): Access.NONE,
    (TESSERA_GROUP, "tenants/tokens"): Access.NONE,
    (BILLING_GROUP, "prices"): Access.READ,
    (BILLING_GROUP, "commitments"): Access.OWN_NAMESPACES,
    (BILLING_GROUP, "statements"): Access.OWN_NAMESPACES,  # served read-only
    (BILLING_GROUP, "usage"): Access.OWN_NAMESPACES,  # served read-only
    (AUTHORIZATION_GROUP, "selfsubjectaccessreviews"): Access.ANYONE,
    (AUTHORIZATION_GROUP, "selfsubjectrulesreviews"): Access.ANYONE,
    (AUTHENTICATION_GROUP, "selfsubjectreviews"): Access.ANYONE,
}

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


def decide(principal: Principal, attrs: Attributes, namespace: NamespaceInfo | None) -> Decision:
    """Allowed or not, and why. `namespace`: the namespace `concerned_namespace(attrs)` names,
    as it exists (None when it does not, or when none is concerned)."""
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
    access = TENANT_ACCESS.get((attrs.group, what), Access.NONE)
    tenant = principal.tenant_name or ""
    who = f'tenant "{tenant}"'
    if access is Access.ANYONE:
        return Decision(True, f"anyone may {attrs.verb} {what}")
    if access is Access.READ:
        if attrs.verb in READ:
            return Decision(True, f"every tenant may get, list and watch {what}")
        return Decision(False, f"only the admin may {attrs.verb} {what}; tenants may only read")
    if access is Access.OWN_NAMESPACES:
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
) -> None:
    """Raise Forbidden unless `decide` allows a request that needs no namespace owner (a
    cluster-scoped resource, or a list across namespaces)."""
    attrs = Attributes(verb, "", group, name=name).with_resource(resource)
    decision = decide(principal, attrs, namespace)
    if not decision.allowed:
        raise forbidden(principal, verb, resource, None, name, group, decision.reason)


def require_gpu_report(
    principal: Principal, *, action: str, gpu: str, gpu_node: str | None
) -> None:
    """Who may report a fault on a GPU (`action` "fault") or its repair ("repair"): the admin.

    THE ONE PLACE for node agents: a `node` token may report for the GPUs of its own node.
    When that role exists, allow it here, before the admin check, e.g.
        if principal.role == "node" and gpu_node is not None and principal.node == gpu_node:
            return
    (`gpu_node` is the node the GPU is in, None when there is no such GPU; the answer for a GPU
    that does not exist must stay the same as for one of another node's)."""
    require(
        principal, verb="create", resource=f"gpudevices/{action}", group=TESSERA_GROUP, name=gpu
    )
