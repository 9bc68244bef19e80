"""Access reviews as Kubernetes shapes them (`authorization.k8s.io/v1`, `authentication.k8s.io/v1`).

A review is a question about the caller: the request carries `spec`, the answer echoes it and
fills `status`. Nothing is stored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.kube.meta import KubeModel, ObjectMeta


class ResourceAttributes(KubeModel):
    """A request on a resource, as `kubectl auth can-i VERB RESOURCE [NAME]` describes it."""

    namespace: str | None = Field(
        default=None, description='The namespace; "" or absent: all namespaces.'
    )
    verb: str | None = Field(
        default=None, description="get, list, watch, create, update, patch, delete, or *"
    )
    group: str | None = Field(default=None, description='The API group; "" for the core group.')
    version: str | None = None
    resource: str | None = Field(default=None, description="The plural resource name, or *")
    subresource: str | None = None
    name: str | None = Field(default=None, description='The object\'s name; "" or absent: any.')
    field_selector: dict[str, Any] | None = None
    label_selector: dict[str, Any] | None = None


class NonResourceAttributes(KubeModel):
    """A request on a path outside the resource API (`kubectl auth can-i get /version`)."""

    path: str | None = None
    verb: str | None = None


class SelfSubjectAccessReviewSpec(KubeModel):
    """Exactly one of the two is set."""

    resource_attributes: ResourceAttributes | None = None
    non_resource_attributes: NonResourceAttributes | None = None


class SubjectAccessReviewStatus(KubeModel):
    allowed: bool = Field(description="Whether the API would allow the request.")
    denied: bool | None = Field(
        default=None, description="True when refused (Tessera's rules answer every question)."
    )
    reason: str | None = Field(default=None, description="Why, in words.")
    evaluation_error: str | None = None


class SelfSubjectAccessReview(KubeModel):
    """May I do this? `kubectl auth can-i` asks; the answer comes from the rules the API
    enforces."""

    api_version: Literal["authorization.k8s.io/v1"] = "authorization.k8s.io/v1"
    kind: Literal["SelfSubjectAccessReview"] = "SelfSubjectAccessReview"
    metadata: ObjectMeta | None = None
    spec: SelfSubjectAccessReviewSpec
    status: SubjectAccessReviewStatus | None = None


class SelfSubjectRulesReviewSpec(KubeModel):
    namespace: str | None = Field(
        default=None, description="The namespace the rules are evaluated in."
    )


class ResourceRule(KubeModel):
    verbs: list[str]
    api_groups: list[str] | None = None
    resources: list[str] | None = None
    resource_names: list[str] | None = None


class NonResourceRule(KubeModel):
    verbs: list[str]
    non_resource_urls: list[str] | None = Field(default=None, alias="nonResourceURLs")


class SubjectRulesReviewStatus(KubeModel):
    resource_rules: list[ResourceRule]
    non_resource_rules: list[NonResourceRule]
    incomplete: bool = Field(description="True when the rules cannot say all the API allows.")
    evaluation_error: str | None = Field(default=None, description="What the rules leave out.")


class SelfSubjectRulesReview(KubeModel):
    """What may I do in this namespace? `kubectl auth can-i --list` asks."""

    api_version: Literal["authorization.k8s.io/v1"] = "authorization.k8s.io/v1"
    kind: Literal["SelfSubjectRulesReview"] = "SelfSubjectRulesReview"
    metadata: ObjectMeta | None = None
    spec: SelfSubjectRulesReviewSpec
    status: SubjectRulesReviewStatus | None = None


class UserInfo(KubeModel):
    username: str = Field(
        description='"tessera:admin" or "tessera:tenant:<tenant>", as 403 messages name it.'
    )
    uid: str | None = None
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None


class SelfSubjectReviewStatus(KubeModel):
    user_info: UserInfo | None = None


class SelfSubjectReview(KubeModel):
    """Who am I? `kubectl auth whoami` asks."""

    api_version: Literal["authentication.k8s.io/v1"] = "authentication.k8s.io/v1"
    kind: Literal["SelfSubjectReview"] = "SelfSubjectReview"
    metadata: ObjectMeta | None = None
    status: SelfSubjectReviewStatus | None = None
