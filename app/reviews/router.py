"""HTTP for the access reviews (create only, never stored):

- `/apis/authorization.k8s.io/v1/selfsubjectaccessreviews` (`kubectl auth can-i VERB RESOURCE`)
- `/apis/authorization.k8s.io/v1/selfsubjectrulesreviews` (`kubectl auth can-i --list`)
- `/apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.auth.rules import require
from app.constants import AUTHENTICATION_GROUP, AUTHORIZATION_GROUP
from app.deps import PrincipalDep, ServicesDep, json_response
from app.errors import STATUS_RESPONSES
from app.kube.bodies import decode_object
from app.kube.params import FieldValidationQ, PrettyQ
from app.pods.validation import decode_model
from app.reviews import service
from app.reviews.schemas import SelfSubjectAccessReview, SelfSubjectReview, SelfSubjectRulesReview

router = APIRouter(tags=["reviews"], responses=STATUS_RESPONSES)
AUTHORIZATION = f"/apis/{AUTHORIZATION_GROUP}/v1"
AUTHENTICATION = f"/apis/{AUTHENTICATION_GROUP}/v1"


def _body(model: type[Any]) -> dict[str, Any]:
    name = model.__name__
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema},
                "application/yaml": {"schema": schema},
                "application/vnd.kubernetes.protobuf": {"schema": {"type": "string"}},
            },
        }
    }


def _metadata(review: Any) -> dict[str, Any]:
    meta = review.metadata.model_dump(by_alias=True, exclude_none=True) if review.metadata else {}
    return {**meta, "creationTimestamp": None}


@router.post(
    f"{AUTHORIZATION}/selfsubjectaccessreviews",
    status_code=201,
    responses={201: {"model": SelfSubjectAccessReview}},
    openapi_extra=_body(SelfSubjectAccessReview),
    summary="May I? Answered from the rules the API enforces (kubectl auth can-i)",
)
async def create_access_review(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    pretty: PrettyQ = None,
) -> Response:
    require(
        principal, verb="create", resource="selfsubjectaccessreviews", group=AUTHORIZATION_GROUP
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    review, warnings = decode_model(
        SelfSubjectAccessReview,
        document,
        kind="SelfSubjectAccessReview",
        mode=field_validation or "Warn",
    )
    status = await services.read(
        lambda s: service.access_review(s, principal, review.spec, directory=services.namespaces)
    )
    answer = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": f"{AUTHORIZATION_GROUP}/v1",
        "metadata": _metadata(review),
        "spec": review.spec.model_dump(by_alias=True, exclude_none=True),
        "status": status,
    }
    return json_response(answer, 201, warnings)


@router.post(
    f"{AUTHORIZATION}/selfsubjectrulesreviews",
    status_code=201,
    responses={201: {"model": SelfSubjectRulesReview}},
    openapi_extra=_body(SelfSubjectRulesReview),
    summary="What may I do in a namespace? (kubectl auth can-i --list)",
)
async def create_rules_review(
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    pretty: PrettyQ = None,
) -> Response:
    require(principal, verb="create", resource="selfsubjectrulesreviews", group=AUTHORIZATION_GROUP)
    document = decode_object(await request.body(), request.headers.get("content-type"))
    review, warnings = decode_model(
        SelfSubjectRulesReview,
        document,
        kind="SelfSubjectRulesReview",
        mode=field_validation or "Warn",
    )
    namespace = review.spec.namespace or ""
    status = await services.read(
        lambda s: service.rules_review(s, principal, namespace, directory=services.namespaces)
    )
    answer = {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": f"{AUTHORIZATION_GROUP}/v1",
        "metadata": _metadata(review),
        "spec": review.spec.model_dump(by_alias=True, exclude_none=True),
        "status": status,
    }
    return json_response(answer, 201, warnings)


@router.post(
    f"{AUTHENTICATION}/selfsubjectreviews",
    status_code=201,
    responses={201: {"model": SelfSubjectReview}},
    openapi_extra=_body(SelfSubjectReview),
    summary="Who am I? (kubectl auth whoami)",
)
async def create_self_review(
    request: Request,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    pretty: PrettyQ = None,
) -> Response:
    require(principal, verb="create", resource="selfsubjectreviews", group=AUTHENTICATION_GROUP)
    raw = await request.body()
    warnings: list[str] = []
    review = SelfSubjectReview()
    if raw.strip():
        review, warnings = decode_model(
            SelfSubjectReview,
            decode_object(raw, request.headers.get("content-type")),
            kind="SelfSubjectReview",
            mode=field_validation or "Warn",
        )
    answer = {
        "kind": "SelfSubjectReview",
        "apiVersion": f"{AUTHENTICATION_GROUP}/v1",
        "metadata": _metadata(review),
        "status": {"userInfo": service.user_info(principal)},
    }
    return json_response(answer, 201, warnings)
