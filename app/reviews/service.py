"""Answers to the access reviews, from the rules the API enforces (app/auth/rules.py).

Every answer is `rules.decide` asked about the caller: a wildcard (`*` verb, resource or group)
is allowed when every request it stands for is; the rules review lists, per served resource and
verb, what `decide` allows in the namespace asked about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from app.auth import rules
from app.auth.rules import Attributes, Decision
from app.constants import AUTHORIZATION_GROUP, SYSTEM_NAMESPACES, TESSERA_GROUP
from app.errors import Cause, invalid
from app.inventory.service import gpu_node
from app.kube.resources import RESOURCES
from app.namespaces import service as namespaces
from app.pods.repository import node_of
from app.reviews.schemas import SelfSubjectAccessReviewSpec

if TYPE_CHECKING:
    from app.auth.service import Principal
    from app.namespaces.service import NamespaceDirectory

WILDCARD = "*"


def served_pairs() -> list[tuple[str, str, tuple[str, ...]]]:
    """(group, resource or resource/subresource, verbs) of everything Tessera serves."""
    out = []
    for r in RESOURCES:
        out.append((r.group, r.name, r.verbs))
        out.extend((r.group, f"{r.name}/{sub}", verbs) for sub, _kind, verbs in r.subresources)
    return out


def access_review(
    session: Session,
    principal: Principal,
    spec: SelfSubjectAccessReviewSpec,
    *,
    directory: NamespaceDirectory,
) -> dict[str, Any]:
    """The `status` of a SelfSubjectAccessReview."""
    resource, path = spec.resource_attributes, spec.non_resource_attributes
    if (resource is None) == (path is None):
        raise invalid(
            "SelfSubjectAccessReview",
            "",
            [
                Cause(
                    "spec.resourceAttributes",
                    "Invalid value: exactly one of nonResourceAttributes or resourceAttributes "
                    "must be specified",
                )
            ],
            group=AUTHORIZATION_GROUP,
        )
    if path is not None:
        return _status(rules.decide_path(principal, path.verb or "", path.path or ""))
    assert resource is not None
    asked = Attributes(
        verb=resource.verb or "",
        resource=resource.resource or "",
        group=resource.group or "",
        subresource=resource.subresource or "",
        namespace=resource.namespace or "",
        name=resource.name or "",
    )
    decisions = [_decide(session, principal, attrs, directory) for attrs in _expand(asked)] or [
        rules.decide(principal, asked, None)
    ]
    refused = next((d for d in decisions if not d.allowed), None)
    if refused is not None:
        return _status(refused)
    if len(decisions) == 1:
        return _status(decisions[0])
    return _status(
        Decision(True, f"allowed for each of the {len(decisions)} requests * stands for")
    )


def _expand(asked: Attributes) -> list[Attributes]:
    """The requests a wildcard stands for (just the one asked when there is none)."""
    wild = WILDCARD in (asked.verb, asked.resource, asked.group)
    if not wild:
        return [asked]
    out = []
    for group, full, verbs in served_pairs():
        resource, _, sub = full.partition("/")
        if asked.group not in (WILDCARD, group) and not (
            asked.resource == WILDCARD and asked.group == ""
        ):
            continue
        if asked.resource != WILDCARD and (resource, sub) != (asked.resource, asked.subresource):
            continue
        for verb in verbs if asked.verb == WILDCARD else (asked.verb,):
            out.append(Attributes(verb, resource, group, sub, asked.namespace, asked.name))
    return out


def _decide(
    session: Session, principal: Principal, attrs: Attributes, directory: NamespaceDirectory
) -> Decision:
    name = rules.concerned_namespace(attrs)
    info = directory.lookup(session, name) if name else None
    return rules.decide(principal, attrs, info, object_node=object_node(session, principal, attrs))


def object_node(session: Session, principal: Principal, attrs: Attributes) -> str | None:
    """For a node's token: the node the named pod or GPU device is on, as the API looks it up
    before it answers the same request."""
    if not principal.is_node or not attrs.name:
        return None
    if (attrs.group, attrs.resource) == ("", "pods"):
        return node_of(session, namespace=attrs.namespace, name=attrs.name)
    if (attrs.group, attrs.resource) == (TESSERA_GROUP, "gpudevices"):
        return gpu_node(session, attrs.name)
    return None


def _status(decision: Decision) -> dict[str, Any]:
    status: dict[str, Any] = {"allowed": decision.allowed, "reason": decision.reason}
    if not decision.allowed:
        status["denied"] = True
    return status


def rules_review(
    session: Session, principal: Principal, namespace: str, *, directory: NamespaceDirectory
) -> dict[str, Any]:
    """The `status` of a SelfSubjectRulesReview: what `decide` allows in `namespace`.

    A rule names objects only by exact name, so what the rules allow by name prefix (a tenant
    creating `<tenant>-<suffix>`) or for all names but a few (the admin deleting any namespace
    but the system ones) is left out, and the answer says so (`incomplete`)."""
    info = directory.lookup(session, namespace) if namespace else None
    if principal.is_admin:
        candidates: list[str] = []
        left_out = "the admin may also delete every namespace except " + ", ".join(
            SYSTEM_NAMESPACES
        )
    elif principal.is_node:
        candidates = []
        left_out = (
            f'node "{principal.node_name}" may also use its Node, its GPU devices, its Lease in '
            "kube-node-lease and the pods bound to it, each by name"
        )
    else:
        tenant = principal.tenant_name or ""
        owned = [row.name for row in namespaces.list_visible(session, principal)]
        candidates = sorted({tenant, *owned})
        left_out = f'tenant "{tenant}" may also create namespaces named "{tenant}-<suffix>"'
    found: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for group, full, verbs in served_pairs():
        resource, _, sub = full.partition("/")
        for verb in verbs:
            attrs = Attributes(verb, resource, group, sub, namespace)
            target = info if rules.concerned_namespace(attrs) else None
            if rules.decide(principal, attrs, target).allowed:
                found.setdefault((group, full, ()), []).append(verb)
                continue
            if (group, full) != ("", "namespaces"):
                continue
            names = tuple(
                n
                for n in candidates
                if rules.decide(
                    principal,
                    Attributes(verb, resource, group, sub, namespace, n),
                    directory.lookup(session, n),
                ).allowed
            )
            if names:
                found.setdefault((group, full, names), []).append(verb)
    resource_rules: list[dict[str, Any]] = []
    for (group, full, only), allowed in found.items():
        rule: dict[str, Any] = {"verbs": allowed, "apiGroups": [group], "resources": [full]}
        if only:
            rule["resourceNames"] = list(only)
        resource_rules.append(rule)
    return {
        "resourceRules": resource_rules,
        "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": list(rules.NON_RESOURCE_URLS)}],
        "incomplete": True,
        "evaluationError": f"rules name objects only by exact name: {left_out}",
    }


def user_info(principal: Principal) -> dict[str, Any]:
    """The `status.userInfo` of a SelfSubjectReview."""
    return {
        "username": principal.username,
        "groups": list(principal.groups),
        "extra": {"tessera.io/token-key-id": [principal.key_id]},
    }
