"""`/apis/metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics: `kubectl top`) and the agents'
usage reports (`POST /api/v1/nodes/{node}/usage`, a Tessera extension, with the node's token)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.responses import Response

from app.auth.rules import require
from app.constants import METRICS_GROUP
from app.deps import PrincipalDep, ServicesDep, authorize_namespace, json_response
from app.errors import STATUS_RESPONSES, Forbidden, invalid
from app.kube.bodies import decode_object
from app.kube.meta import now
from app.pods.router import pydantic_causes_of
from app.resourcemetrics import service
from app.resourcemetrics.service import UsageReport

router = APIRouter(tags=["metrics"], responses=STATUS_RESPONSES)
PREFIX = f"/apis/{METRICS_GROUP}/v1beta1"


@router.post(
    "/api/v1/nodes/{node}/usage",
    status_code=201,
    summary="A node agent reports its usage and its pods' (Tessera extension)",
)
async def report_usage(
    node: str, request: Request, services: ServicesDep, principal: PrincipalDep
) -> Response:
    if not (principal.is_node and principal.node_name == node):
        raise Forbidden(
            f'forbidden: User "{principal.username}" cannot create nodes/usage "{node}": only '
            "the agent of that node reports its usage"
        )
    raw = await request.body()
    try:
        report = UsageReport.model_validate(decode_object(raw, request.headers.get("content-type")))
    except ValidationError as exc:
        raise invalid("UsageReport", node, pydantic_causes_of(exc)) from exc

    def work(session: Session) -> None:
        service.record(session, node=node, report=report, at=now())

    await services.write(work)
    return json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"}, 201)


@router.get(f"{PREFIX}/nodes", summary="NodeMetrics of every node (kubectl top node)")
async def list_node_metrics(services: ServicesDep, principal: PrincipalDep) -> Response:
    await _may(services, principal, "list", "nodes")
    items = await services.read(lambda s: service.node_metrics(s, at=now()))
    return json_response(service.metrics_list("NodeMetrics", items))


@router.get(f"{PREFIX}/nodes/{{name}}", summary="NodeMetrics of one node")
async def get_node_metrics(name: str, services: ServicesDep, principal: PrincipalDep) -> Response:
    await _may(services, principal, "get", "nodes")
    items = await services.read(lambda s: service.node_metrics(s, at=now(), name=name))
    return json_response(items[0])


@router.get(f"{PREFIX}/pods", summary="PodMetrics across namespaces (kubectl top pod -A)")
async def list_all_pod_metrics(services: ServicesDep, principal: PrincipalDep) -> Response:
    require(principal, verb="list", resource="pods", group=METRICS_GROUP)  # as can-i answers
    items = await services.read(lambda s: service.pod_metrics(s, at=now(), namespaces=None))
    if not principal.is_admin:
        allowed: dict[str, bool] = {}
        for namespace in {i["metadata"]["namespace"] for i in items}:
            try:
                await authorize_namespace(
                    services,
                    principal,
                    namespace,
                    verb="list",
                    resource="pods",
                    group=METRICS_GROUP,
                )
                allowed[namespace] = True
            except Forbidden:
                allowed[namespace] = False
        items = [i for i in items if allowed[i["metadata"]["namespace"]]]
    return json_response(service.metrics_list("PodMetrics", items))


@router.get(f"{PREFIX}/namespaces/{{namespace}}/pods", summary="PodMetrics of a namespace")
async def list_pod_metrics(
    namespace: str, services: ServicesDep, principal: PrincipalDep
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="list", resource="pods", group=METRICS_GROUP
    )
    items = await services.read(lambda s: service.pod_metrics(s, at=now(), namespaces={namespace}))
    return json_response(service.metrics_list("PodMetrics", items))


@router.get(f"{PREFIX}/namespaces/{{namespace}}/pods/{{name}}", summary="PodMetrics of a pod")
async def get_pod_metrics(
    namespace: str, name: str, services: ServicesDep, principal: PrincipalDep
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="get", resource="pods", name=name, group=METRICS_GROUP
    )
    items = await services.read(
        lambda s: service.pod_metrics(s, at=now(), namespaces={namespace}, name=name)
    )
    return json_response(items[0])


async def _may(services: ServicesDep, principal: PrincipalDep, verb: str, resource: str) -> None:
    from app.auth import rules

    decision = rules.decide(principal, rules.Attributes(verb, resource, METRICS_GROUP), None)
    if not decision.allowed:
        raise Forbidden(
            f'forbidden: User "{principal.username}" cannot {verb} resource "{resource}" in API '
            f'group "{METRICS_GROUP}" at the cluster scope: {decision.reason}'
        )
