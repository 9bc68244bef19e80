"""HTTP for pods: `/api/v1/namespaces/{namespace}/pods` and `/api/v1/pods`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.responses import PlainTextResponse, Response

from app import workloads
from app.auth.rules import forbidden, require
from app.auth.service import Principal
from app.constants import NODE_LEASE_NAMESPACE, TESSERA_GROUP, TESSERA_VERSION
from app.db.engine import current_resource_version
from app.deps import (
    PrincipalDep,
    Services,
    ServicesDep,
    authorize_namespace,
    json_response,
    respond,
)
from app.errors import (
    STATUS_RESPONSES,
    BadRequest,
    Cause,
    Conflict,
    NotFound,
    ResourceRef,
    TesseraError,
    invalid,
    status_for,
)
from app.inventory.service import GPUShare
from app.kube.bodies import (
    APPLY_PATCH,
    apply_patch,
    decode,
    decode_object,
    patch_body,
    patch_type_of,
    section,
)
from app.kube.listing import list_object
from app.kube.meta import INT64_MAX, now, parse_timestamp
from app.kube.params import (
    DryRunQ,
    FieldManagerQ,
    FieldValidationQ,
    ForceQ,
    GracePeriodQ,
    ListQuery,
    ListQueryDep,
    PrettyQ,
    PropagationPolicyQ,
)
from app.leases import service as leases
from app.namespaces.service import NamespaceInfo
from app.pods import log_store, logs, service
from app.pods.admission import AdmissionError, admit
from app.pods.schemas import (
    MAX_LOG_BODY_BYTES,
    Binding,
    DeleteOptions,
    Eviction,
    Pod,
    PodBatch,
    PodList,
    PodLogBatch,
    ReportedPodStatus,
)
from app.pods.validation import FieldValidation, M, decode_model, pydantic_causes
from app.watch.stream import Alive, follow_response, watch_response

router = APIRouter(tags=["pods"], responses=STATUS_RESPONSES)

POD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Pod"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/Pod"}},
        },
    }
}


def _body(schema: str) -> dict[str, Any]:
    """The OpenAPI request body of a subresource that takes `schema` (in app/openapi.py)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


# What a subresource POST that acts (binding, eviction) answers, as Kubernetes does.
SUCCESS_201 = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}


@router.get(
    "/api/v1/pods",
    responses={200: {"model": PodList}},
    summary="List pods in every namespace the caller may see",
)
async def list_all_pods(
    request: Request, services: ServicesDep, principal: PrincipalDep, query: ListQueryDep
) -> Response:
    require(principal, verb="watch" if query.watch else "list", resource="pods")
    return await _list(request, services, principal, query, None)


@router.get(
    "/api/v1/namespaces/{namespace}/pods",
    responses={200: {"model": PodList}},
    summary="List pods",
)
async def list_pods(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
) -> Response:
    verb = "watch" if query.watch else "list"
    await authorize_namespace(services, principal, namespace, verb=verb, resource="pods")
    return await _list(request, services, principal, query, namespace)


async def _list(
    request: Request,
    services: Services,
    principal: Principal,
    query: ListQuery,
    namespace: str | None,
) -> Response:
    """Pods are listed and paged in SQL (the other kinds in memory, see app/kube/listing.py)."""
    fields = query.fields(service.FIELD_SELECTORS)
    tenant_id = None if principal.sees_every_tenant else principal.tenant_id
    if principal.is_node and not any(
        f.field == "spec.nodeName" and f.value == principal.node_name and not f.negate
        for f in fields
    ):
        raise forbidden(
            principal,
            "watch" if query.watch else "list",
            "pods",
            namespace,
            reason=f'node "{principal.node_name}" may list and watch only the pods bound to it: '
            f"add fieldSelector=spec.nodeName={principal.node_name}",
        )

    def page(session: Session, limit: int | None, token: str | None) -> service.PodPage:
        return service.list_pods(
            session,
            tenant_id=tenant_id,
            namespace=namespace,
            labels=query.labels,
            fields=fields,
            limit=limit,
            continue_token=token,
        )

    if query.watch:

        def initial(session: Session) -> tuple[list[dict[str, Any]], int]:
            everything = page(session, None, None)
            return everything.items, everything.resource_version

        return await watch_response(
            request,
            services,
            principal,
            kind="Pod",
            namespace=namespace,
            labels=query.labels,
            fields=fields,
            resource_version=query.resource_version,
            timeout_seconds=query.timeout_seconds,
            bookmarks=query.bookmarks,
            scoped=not principal.is_node,  # a node's watch is limited by its fieldSelector
            initial=initial,
        )
    result = await services.read(lambda s: page(s, query.limit, query.continue_token))
    return respond(
        request,
        list_object("PodList", "v1", result.items, result.resource_version, result.continue_token),
    )


@router.post(
    "/api/v1/namespaces/{namespace}/pods",
    status_code=201,
    responses={201: {"model": Pod}},
    openapi_extra=POD_BODY,
    summary="Create a pod",
)
async def create_pod(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    pretty: PrettyQ = None,
) -> Response:
    ns = await authorize_namespace(services, principal, namespace, verb="create", resource="pods")
    document = decode_object(await request.body(), request.headers.get("content-type"))
    obj, warnings = await _create_one(services, ns, document, field_validation, dry_run)
    return json_response(obj, 201, warnings)


async def _create_one(
    services: Services,
    ns: NamespaceInfo,
    document: dict[str, Any],
    field_validation: FieldValidationQ,
    dry_run: DryRunQ,
) -> tuple[dict[str, Any], list[str]]:
    """A pod created from `document` in `ns` (authorized already): decoded, validated, admitted
    and written, or an error raised; the created pod and the warnings."""
    namespace = ns.name
    _check_kind(document, "Pod")
    body_ns = section(document, "metadata").get("namespace")
    if body_ns not in (None, "", namespace):
        raise BadRequest(
            f'the namespace of the provided object ("{body_ns}") does not match the namespace sent '
            f'on the request ("{namespace}")'
        )
    pod, warnings = decode_model(Pod, document, kind="Pod", mode=field_validation or "Warn")
    label = pod.metadata.name or pod.metadata.generate_name or ""
    context = await services.admission_now()
    try:
        admitted = admit(
            pod, specs=context.specs, pool=context.pool, default_spec=context.default_spec
        )
    except AdmissionError as exc:
        raise invalid("Pod", label, exc.causes) from exc
    # Its workload: known to this process's cache, or read by the write (`insert`), in the
    # writer's transaction: a read of its own would wait for a thread of the read pool.
    owner = workloads.controller_of(service.owner_references(pod))
    key = (ns.name, *workloads.key(owner)) if owner is not None else None
    known, workload = services.workloads.get(ns.tenant_id, key) if key else (True, None)
    # Worked out here, so that the write transaction only numbers and queues it; `insert`
    # raises only before it writes anything: no savepoint needed in a shared batch. A name
    # made from generateName that was taken is made again.
    for _ in range(service.GENERATE_NAME_ATTEMPTS):
        new = service.prepare(
            namespace=ns,
            pod=pod,
            admitted=admitted,
            workload=workload,
            owner=None if known else owner,
        )
        work = partial(service.insert, new=new)
        try:
            obj = await (services.dry_run(work) if dry_run else services.write(work, clean=True))
        except service.GeneratedNameTaken:
            continue
        if key is not None and not known:
            services.workloads.put(ns.tenant_id, key, new.values["workload"])
        return obj, warnings
    raise service.generate_name_exhausted(pod.metadata.generate_name or "")


MAX_BATCH = 500  # pods in one PodBatch


@router.post(
    f"/apis/{TESSERA_GROUP}/{TESSERA_VERSION}/namespaces/{{namespace}}/podbatches",
    status_code=200,
    responses={200: {"model": PodBatch}},
    openapi_extra=_body("PodBatch"),
    summary="Create many pods in one request (Tessera's)",
)
async def create_pod_batch(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    """`items`: up to 500 pods, each created as its own `POST .../pods` would create it (the
    same admission, validation, quotas and budgets; the same answer); the answer's `items` are
    those answers in order: the pod created, or the Status of its refusal. Each pod stands
    alone: one refused leaves the others created. A tenant's rate limit counts each pod as a
    request. The controller manager makes a ReplicaSet's or a Job's pods with it."""
    ns = await authorize_namespace(services, principal, namespace, verb="create", resource="pods")
    document = decode_object(await request.body(), request.headers.get("content-type"))
    _check_kind(document, "PodBatch", f"{TESSERA_GROUP}/{TESSERA_VERSION}")
    items = document.get("items")
    if not isinstance(items, list) or not items:
        raise BadRequest("items must be a list of one or more pods")
    if len(items) > MAX_BATCH:
        raise BadRequest(f"a PodBatch holds at most {MAX_BATCH} pods, got {len(items)}")
    if len(items) > 1:
        await services.limiter.check(principal, cost=len(items) - 1)

    async def one(item: Any, earlier: asyncio.Task[dict[str, Any]] | None) -> dict[str, Any]:
        if earlier is not None:  # an earlier item of the same name is created (or not) first
            await asyncio.wait([earlier])
        try:
            if not isinstance(item, dict):
                raise BadRequest(f"each item must be a Pod object, got {type(item).__name__}")
            obj, _ = await _create_one(services, ns, item, field_validation, dry_run)
            return obj
        except TesseraError as exc:
            return status_for(exc).to_dict()

    # The items are created at once, except that of two items of one name the first in the
    # list goes first, so that it is the one made and the other the one refused.
    tasks: list[asyncio.Task[dict[str, Any]]] = []
    last_of: dict[str, asyncio.Task[dict[str, Any]]] = {}
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        earlier = last_of.get(name) if isinstance(name, str) else None
        task = asyncio.create_task(one(item, earlier))
        if isinstance(name, str):
            last_of[name] = task
        tasks.append(task)
    results = await asyncio.gather(*tasks)
    return json_response(
        {"apiVersion": f"{TESSERA_GROUP}/{TESSERA_VERSION}", "kind": "PodBatch", "items": results}
    )


@router.get(
    "/api/v1/namespaces/{namespace}/pods/{name}",
    responses={200: {"model": Pod}},
    summary="Read a pod",
)
async def get_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="get", resource="pods", name=name
    )
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


@router.patch(
    "/api/v1/namespaces/{namespace}/pods/{name}",
    responses={200: {"model": Pod}},
    openapi_extra=patch_body(),
    summary="Change a pod's labels, annotations or deadline",
)
async def patch_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    force: ForceQ = None,
    pretty: PrettyQ = None,
) -> Response:
    ns = await authorize_namespace(
        services, principal, namespace, verb="patch", resource="pods", name=name
    )
    patch_type = patch_type_of(request.headers.get("content-type"))
    if patch_type == APPLY_PATCH:
        return await _apply(request, services, ns, name, field_manager, field_validation, dry_run)
    body = decode(await request.body(), patch_type)

    def work(session: Any) -> dict[str, Any]:
        return service.patch(
            session,
            namespace=namespace,
            name=name,
            body=body,
            patch_type=patch_type,
            context=services.admission(session),
        )

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))


async def _apply(
    request: Request,
    services: Services,
    ns: NamespaceInfo,
    name: str,
    manager: str | None,
    field_validation: str | None,
    dry_run: str | None,
) -> Response:
    """Server-side apply: creates the pod when it does not exist."""
    if not manager:
        raise BadRequest(
            "fieldManager is required for apply requests (kubectl sends it; curl: add ?fieldManager=NAME)"
        )
    document = decode_object(await request.body(), APPLY_PATCH)
    _check_kind(document, "Pod")
    if section(document, "metadata").get("name") not in (None, name):
        raise BadRequest(f'the name in the body must match the URL ("{name}")')
    document.setdefault("metadata", {})["name"] = name
    pod, warnings = decode_model(Pod, document, kind="Pod", mode=field_validation or "Strict")  # type: ignore[arg-type]

    def work(session: Any) -> tuple[dict[str, Any], bool]:
        return service.server_side_apply(
            session,
            namespace=ns,
            name=name,
            pod=pod,
            manager=manager,
            context=services.admission(session),
        )

    obj, created = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 201 if created else 200, warnings)


@router.put(
    "/api/v1/namespaces/{namespace}/pods/{name}",
    responses={200: {"model": Pod}},
    openapi_extra=POD_BODY,
    summary="Replace a pod (only labels, annotations and the deadline may change)",
)
async def replace_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="update", resource="pods", name=name
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    _check_kind(document, "Pod")
    pod, warnings = decode_model(Pod, document, kind="Pod", mode=field_validation or "Warn")
    body = pod.model_dump(by_alias=True, exclude_none=True)

    def work(session: Any) -> dict[str, Any]:
        return service.replace(
            session, namespace=namespace, name=name, body=body, context=services.admission(session)
        )

    return json_response(
        await (services.dry_run(work) if dry_run else services.write(work)), 200, warnings
    )


@router.delete(
    "/api/v1/namespaces/{namespace}/pods/{name}",
    responses={200: {"model": Pod}},
    summary="Delete a pod",
)
async def delete_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    grace_period_seconds: GracePeriodQ = None,
    propagation_policy: PropagationPolicyQ = None,
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="delete", resource="pods", name=name
    )
    raw = await request.body()
    options = DeleteOptions()
    if raw.strip():
        options, _ = decode_model(
            DeleteOptions,
            decode_object(raw, request.headers.get("content-type")),
            kind="DeleteOptions",
            mode="Ignore",
        )
    grace = (
        grace_period_seconds if grace_period_seconds is not None else options.grace_period_seconds
    )
    preconditions = options.preconditions or {}

    def work(session: Any) -> dict[str, Any]:
        if principal.is_node:
            _node_may_remove(session, principal, namespace, name, grace)
        return service.delete(
            session,
            namespace=namespace,
            name=name,
            grace_seconds=grace,
            precondition_uid=preconditions.get("uid"),
            precondition_rv=preconditions.get("resourceVersion"),
        )

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 200, _deletion_warnings(obj))


def _node_may_remove(
    session: Session, principal: Principal, namespace: str, name: str, grace: int | None
) -> None:
    """A node removes a pod (grace 0) only once it has stopped: it ended, or it is being
    deleted and the node has stopped its containers."""
    pod = service.get(session, namespace=namespace, name=name)
    stopped = (
        pod["status"]["phase"] in service.TERMINAL_PHASES or "deletionTimestamp" in pod["metadata"]
    )
    if grace != 0 or not stopped:
        raise forbidden(
            principal,
            "delete",
            "pods",
            namespace,
            name,
            reason=f'node "{principal.node_name}" removes a pod only with gracePeriodSeconds=0 '
            "once it has ended or is being deleted; its owner deletes a running pod",
        )


@router.get(
    "/api/v1/namespaces/{namespace}/pods/{name}/status",
    responses={200: {"model": Pod}},
    summary="Read a pod's status (the whole pod, as Kubernetes answers)",
)
async def get_pod_status(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="get", resource="pods/status", name=name
    )
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


@router.put(
    "/api/v1/namespaces/{namespace}/pods/{name}/status",
    responses={200: {"model": Pod}},
    openapi_extra=POD_BODY,
    summary="Report a pod's status (its node, or the admin): Running, Succeeded or Failed",
)
async def replace_pod_status(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,  # the status is read as a node reports it
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="update", resource="pods/status", name=name
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    _check_kind(document, "Pod")
    status = _reported(name, document)
    node = principal.node_name if principal.is_node else None

    def work(session: Any) -> dict[str, Any]:
        return service.report_status(
            session, namespace=namespace, name=name, status=status, node=node
        )

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))


@router.patch(
    "/api/v1/namespaces/{namespace}/pods/{name}/status",
    responses={200: {"model": Pod}},
    openapi_extra=patch_body(),
    summary="Change a pod's status (its node, or the admin): merge, strategic or JSON patch",
)
async def patch_pod_status(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,  # the status is read as a node reports it
    dry_run: DryRunQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="patch", resource="pods/status", name=name
    )
    patch_type = patch_type_of(request.headers.get("content-type"))
    if patch_type == APPLY_PATCH:
        raise BadRequest("server-side apply is not offered for pods/status: use a merge patch")
    patch = decode(await request.body(), patch_type)
    node = principal.node_name if principal.is_node else None

    def work(session: Any) -> dict[str, Any]:
        current = service.get(session, namespace=namespace, name=name)
        status = _reported(name, apply_patch(current, patch, patch_type))
        return service.report_status(
            session, namespace=namespace, name=name, status=status, node=node
        )

    return json_response(await (services.dry_run(work) if dry_run else services.write(work)))


def _reported(name: str, document: dict[str, Any]) -> ReportedPodStatus:
    try:
        return ReportedPodStatus.model_validate(section(document, "status"))
    except ValidationError as exc:
        causes = [Cause(f"status.{c.field}", c.message) for c in pydantic_causes(exc)]
        raise invalid("Pod", name, causes) from exc


@router.delete(
    "/api/v1/namespaces/{namespace}/pods",
    responses={200: {"model": PodList}},
    summary="Delete the pods that labelSelector and fieldSelector match (all without them)",
)
async def delete_pods(
    namespace: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    query: ListQueryDep,
    grace_period_seconds: GracePeriodQ = None,
    propagation_policy: PropagationPolicyQ = None,
    dry_run: DryRunQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="deletecollection", resource="pods"
    )
    fields = query.fields(service.FIELD_SELECTORS)

    def work(session: Any) -> dict[str, Any]:
        deleted = service.delete_collection(
            session,
            namespace=namespace,
            labels=query.labels,
            fields=fields,
            grace_seconds=grace_period_seconds,
        )
        return list_object("PodList", "v1", deleted, current_resource_version(session), None)

    result = await (services.dry_run(work) if dry_run else services.write(work))
    warnings = [w for obj in result["items"] for w in _deletion_warnings(obj)]
    return json_response(result, 200, warnings)


def _deletion_warnings(obj: dict[str, Any]) -> list[str]:
    """Say why a deleted pod is still there when finalizers hold it (kubectl prints it)."""
    meta = obj["metadata"]
    finalizers = meta.get("finalizers")
    if not finalizers or "deletionTimestamp" not in meta:
        return []
    return [
        f'pods "{meta["name"]}" has finalizers {", ".join(finalizers)}: it is marked for deletion '
        "and is removed (releasing its capacity) once they are removed, e.g. "
        f"kubectl patch pod {meta['name']} --type=json "
        """-p '[{"op": "remove", "path": "/metadata/finalizers"}]'"""
    ]


@router.post(
    "/api/v1/namespaces/{namespace}/pods/{name}/binding",
    status_code=201,
    openapi_extra=_body("Binding"),
    summary="Bind a pod to a node and GPU fragments (scheduler only)",
)
async def bind_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
) -> Response:
    binding = await _subresource_body(
        request, services, principal, namespace, name, "binding", Binding, mode="Strict"
    )
    shares = _gpu_shares(
        name, (binding.metadata.annotations or {}).get("tessera.io/gpu-allocation")
    )
    node = binding.target.name or ""

    def work(session: Any) -> dict[str, Any]:
        return service.bind(session, namespace=namespace, name=name, node_name=node, gpus=shares)

    await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(SUCCESS_201, 201)


@router.post(
    "/api/v1/namespaces/{namespace}/pods/{name}/eviction",
    status_code=201,
    openapi_extra=_body("Eviction"),
    summary="Evict a pod: stop it gracefully, as kubectl drain asks (policy/v1 Eviction)",
)
async def evict_pod(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    dry_run: DryRunQ = None,
) -> Response:
    eviction = await _subresource_body(
        request, services, principal, namespace, name, "eviction", Eviction, mode="Ignore"
    )
    for field, value, want in (
        ("metadata.name", eviction.metadata.name, name),
        ("metadata.namespace", eviction.metadata.namespace, namespace),
    ):
        if value not in (None, want):
            raise BadRequest(
                f'the Eviction\'s {field} is "{value}", but the URL names "{want}": they must match'
            )
    options = eviction.delete_options or DeleteOptions()
    preconditions = options.preconditions or {}

    def work(session: Any) -> dict[str, Any]:
        return service.delete(
            session,
            namespace=namespace,
            name=name,
            grace_seconds=options.grace_period_seconds,
            precondition_uid=preconditions.get("uid"),
            precondition_rv=preconditions.get("resourceVersion"),
            disruption=service.EVICTED,
        )

    dry = dry_run or "All" in (options.dry_run or [])
    await (services.dry_run(work) if dry else services.write(work))
    return json_response(SUCCESS_201, 201)


@router.get(
    "/api/v1/namespaces/{namespace}/pods/{name}/resize",
    responses={200: {"model": Pod}},
    summary="Read a pod through its resize subresource (what kubectl patch --subresource resize reads)",
)
async def get_pod_resize(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="get", resource="pods/resize", name=name
    )
    return respond(
        request, await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    )


@router.patch(
    "/api/v1/namespaces/{namespace}/pods/{name}/resize",
    responses={200: {"model": Pod}},
    openapi_extra=patch_body(),
    summary="Resize a pod's CPU and memory in place (its containers' resources only)",
)
async def patch_pod_resize(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    force: ForceQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="patch", resource="pods/resize", name=name
    )
    patch_type = patch_type_of(request.headers.get("content-type"))
    if patch_type == APPLY_PATCH:
        raise BadRequest(
            "server-side apply is not offered on pods/resize: send a strategic merge, merge or "
            "JSON patch (kubectl patch pod NAME --subresource resize --patch ...)"
        )
    body = decode(await request.body(), patch_type)
    return await _resize(services, namespace, name, body, patch_type, dry_run)


@router.put(
    "/api/v1/namespaces/{namespace}/pods/{name}/resize",
    responses={200: {"model": Pod}},
    openapi_extra=POD_BODY,
    summary="Resize a pod's CPU and memory in place, sending the whole pod",
)
async def replace_pod_resize(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    field_validation: FieldValidationQ = None,
    dry_run: DryRunQ = None,
    field_manager: FieldManagerQ = None,
    pretty: PrettyQ = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="update", resource="pods/resize", name=name
    )
    document = decode_object(await request.body(), request.headers.get("content-type"))
    _check_kind(document, "Pod")
    pod, warnings = decode_model(Pod, document, kind="Pod", mode=field_validation or "Warn")
    body = pod.model_dump(by_alias=True, exclude_none=True)
    return await _resize(services, namespace, name, body, None, dry_run, warnings)


async def _resize(
    services: Services,
    namespace: str,
    name: str,
    body: Any,
    patch_type: str | None,
    dry_run: str | None,
    warnings: list[str] | None = None,
) -> Response:
    def work(session: Any) -> dict[str, Any]:
        return service.resize(
            session,
            namespace=namespace,
            name=name,
            body=body,
            patch_type=patch_type,
            context=services.admission(session),
        )

    obj = await (services.dry_run(work) if dry_run else services.write(work))
    return json_response(obj, 200, warnings or [])


async def _subresource_body(
    request: Request,
    services: Services,
    principal: Principal,
    namespace: str,
    name: str,
    subresource: str,
    model: type[M],
    *,
    mode: FieldValidation,
) -> M:
    """Authorize `create pods/<subresource>` on the pod, then decode the body as `model`."""
    await authorize_namespace(
        services, principal, namespace, verb="create", resource=f"pods/{subresource}", name=name
    )
    body = decode_object(await request.body(), request.headers.get("content-type"))
    decoded, _ = decode_model(model, body, kind=model.__name__, mode=mode)
    return decoded


def _gpu_shares(pod: str, raw: str | None) -> list[GPUShare]:
    if not raw:
        return []
    try:
        items = orjson.loads(raw)
        return [GPUShare(str(i["gpu"]), int(i["memoryMiB"]), int(i["corePercent"])) for i in items]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise invalid(
            "Binding",
            pod,
            [
                Cause(
                    "metadata.annotations.tessera.io/gpu-allocation",
                    'Invalid value: expected a JSON list like [{"gpu": "node-gpu0", "memoryMiB": 20480, "corePercent": 25}]',
                )
            ],
        ) from exc


def _check_kind(document: dict[str, Any], kind: str, api_version: str = "v1") -> None:
    if document.get("kind") not in (None, kind):
        raise BadRequest(f"the object is a {document.get('kind')}, this endpoint takes a {kind}")
    if document.get("apiVersion") not in (None, api_version):
        raise BadRequest(
            f'apiVersion must be "{api_version}" for a {kind}, got "{document.get("apiVersion")}"'
        )


# The log is plain text; its refusals are Statuses (JSON) like every other answer's.
LOG_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {
        **answer,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/StatusModel"}}},
    }
    for code, answer in STATUS_RESPONSES.items()
}


@router.get(
    "/api/v1/namespaces/{namespace}/pods/{name}/log",
    response_class=PlainTextResponse,
    responses=LOG_ERRORS,
    summary="A container's log, as its node agent sent it (kubectl logs)",
)
async def read_log(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    container: Annotated[str | None, Query(max_length=63)] = None,
    follow: bool = False,
    previous: bool = False,
    timestamps: bool = False,
    tail_lines: Annotated[int | None, Query(alias="tailLines", ge=0, le=INT64_MAX)] = None,
    since_seconds: Annotated[int | None, Query(alias="sinceSeconds", ge=1, le=INT64_MAX)] = None,
    since_time: Annotated[str | None, Query(alias="sinceTime", max_length=64)] = None,
    limit_bytes: Annotated[int | None, Query(alias="limitBytes", ge=1, le=INT64_MAX)] = None,
    insecure_skip_tls_verify_backend: Annotated[
        bool | None, Query(alias="insecureSkipTLSVerifyBackend")
    ] = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="get", resource="pods/log", name=name
    )
    if since_time is not None and since_seconds is not None:
        raise BadRequest("at most one of sinceTime or sinceSeconds may be specified")
    since = _since_time(since_time)
    pod = await services.read(lambda s: service.get(s, namespace=namespace, name=name))
    spec = logs.container_of(pod, container)
    cname, uid = spec["name"], pod["metadata"]["uid"]
    restarts = logs.restarts_of(pod, cname)

    def stored(s: Session) -> tuple[int | None, list[log_store.Stored], bool]:
        runs = log_store.runs(s, pod_uid=uid, container=cname)
        managed = _agent_managed(s, pod)
        run = runs[-1] if runs else None
        if previous:  # the last run before the current one (the status may be ahead)
            current = max(restarts, run or 0)
            run = max((r for r in runs if r < current), default=None)
        found = [] if run is None else log_store.read(s, pod_uid=uid, container=cname, run=run)
        return run, found, managed

    run, found, managed = await services.read(stored)
    budget = limit_bytes

    def text(batch: list[logs.Line]) -> bytes:
        nonlocal budget
        data = "".join(line.render(timestamps=timestamps) for line in batch).encode()
        if budget is not None:
            data, budget = data[:budget], max(budget - len(data), 0)
        return data

    def chosen(batch: list[logs.Line]) -> list[logs.Line]:
        return logs.select(
            batch, now=now(), tail=tail_lines, since_seconds=since_seconds, since_time=since
        )

    if previous and run is None:
        raise BadRequest(f'previous terminated container "{cname}" in pod "{name}" not found')
    if run is None and not managed:  # no agent: the lines derived from the pod's status
        return _derived_log(
            request,
            services,
            principal,
            pod,
            spec,
            follow=follow,
            chosen=chosen,
            text=text,
            spent=lambda: budget == 0,
        )
    if run is None:
        logs.lines(pod, spec)  # 400 saying why when it has not started
        raise BadRequest(
            f'container "{cname}" in pod "{name}" has started on node '
            f'"{pod["spec"].get("nodeName", "")}", whose agent has not sent its log yet; '
            "try again in a moment"
        )
    first = chosen([f.line for f in found])
    if previous or not follow or logs.run_over(pod, cname, run):
        return Response(text(first), media_type="text/plain")
    last_id = found[-1].id if found else 0
    deadline = asyncio.get_running_loop().time() + services.settings.watch_min_timeout_seconds
    poll = min(services.settings.watch_poll_seconds, 0.5)

    async def stream(alive: Alive) -> AsyncIterator[bytes]:
        nonlocal last_id
        yield text(first)
        over = False
        while not over and asyncio.get_running_loop().time() < deadline:
            if budget == 0 or services.notifier.stopping or await request.is_disconnected():
                return
            if not await alive():
                return  # its token was revoked
            await asyncio.sleep(poll)
            try:
                current = await services.read(
                    lambda s: service.get(s, namespace=namespace, name=name)
                )
            except NotFound:
                return  # the pod is gone: so is its log
            over = logs.run_over(current, cname, run)  # read before the lines: none missed
            fresh = await services.read(
                functools.partial(
                    log_store.read, pod_uid=uid, container=cname, run=run, after=last_id
                )
            )
            if fresh:
                last_id = fresh[-1].id
                yield text([f.line for f in fresh])

    return follow_response(request, services, principal, stream)


def _agent_managed(session: Session, pod: dict[str, Any]) -> bool:
    """The pod's node has an agent (a Lease in kube-node-lease): its logs come from there."""
    node = pod["spec"].get("nodeName")
    if not node:
        return False
    try:
        leases.get_row(session, NODE_LEASE_NAMESPACE, node)
    except NotFound:
        return False
    return True


def _derived_log(
    request: Request,
    services: Services,
    principal: Principal,
    pod: dict[str, Any],
    spec: dict[str, Any],
    *,
    follow: bool,
    chosen: Any,
    text: Any,
    spent: Any,
) -> Response:
    """The log of a pod on a node no agent manages: derived from its status (app/pods/logs.py)."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    first = chosen(logs.lines(pod, spec))
    if not follow or logs.finished(pod):
        return Response(text(first), media_type="text/plain")
    seen = {line.text for line in logs.lines(pod, spec)}
    deadline = asyncio.get_running_loop().time() + services.settings.watch_min_timeout_seconds

    async def stream(alive: Alive) -> AsyncIterator[bytes]:
        yield text(first)
        current = pod
        while not logs.finished(current) and asyncio.get_running_loop().time() < deadline:
            # spent(): limitBytes reached
            if spent() or services.notifier.stopping or await request.is_disconnected():
                return
            if not await alive():
                return  # its token was revoked
            await asyncio.sleep(0.5)
            try:
                current = await services.read(
                    lambda s: service.get(s, namespace=namespace, name=name)
                )
            except NotFound:
                return  # the pod is gone: so is its log
            fresh = [line for line in logs.lines(current, spec) if line.text not in seen]
            seen.update(line.text for line in fresh)
            if fresh:
                yield text(fresh)

    return follow_response(request, services, principal, stream)


@router.post(
    "/api/v1/namespaces/{namespace}/pods/{name}/log",
    status_code=201,
    openapi_extra=_body("PodLogBatch"),
    summary="Send lines of a container's log (Tessera extension: the pod's node agent only)",
)
async def send_log(
    namespace: str,
    name: str,
    request: Request,
    services: ServicesDep,
    principal: PrincipalDep,
    container: Annotated[str | None, Query(max_length=63)] = None,
) -> Response:
    await authorize_namespace(
        services, principal, namespace, verb="create", resource="pods/log", name=name
    )
    raw = await request.body()
    if len(raw) > MAX_LOG_BODY_BYTES:
        raise BadRequest(
            f"the log batch is {len(raw)} bytes; send at most {MAX_LOG_BODY_BYTES} bytes a "
            "request (split the lines over several)"
        )
    try:
        batch = PodLogBatch.model_validate(decode_object(raw, request.headers.get("content-type")))
    except ValidationError as exc:
        raise invalid("PodLogBatch", name, pydantic_causes_of(exc)) from exc
    entries = []
    for i, entry in enumerate(batch.lines):
        try:
            at = parse_timestamp(entry.time)
        except ValueError:
            raise invalid(
                "PodLogBatch",
                name,
                [Cause(f"lines[{i}].time", "Invalid value: write it like 2026-12-03T10:00:00Z")],
            ) from None
        entries.append(logs.Line(at, entry.text.replace("\n", " ").rstrip("\r")))
    settings = services.settings

    def work(session: Session) -> dict[str, Any]:
        pod = service.get(session, namespace=namespace, name=name)
        spec = logs.container_of(pod, container)
        restarts = logs.restarts_of(pod, spec["name"])
        if not restarts - 1 <= batch.restart_count <= restarts + 1:
            raise Conflict(
                f"restartCount {batch.restart_count} is not a run of container "
                f'"{spec["name"]}", which has restarted {restarts} time(s): send the lines of '
                "its current run (or the previous or next one), reporting a restart in the "
                "pod's status first",
                ref=ResourceRef("pods", name),
            )
        log_store.append(
            session,
            pod_uid=pod["metadata"]["uid"],
            container=spec["name"],
            run=batch.restart_count,
            batch=entries,
            max_lines=settings.pod_log_max_lines,
            max_bytes=settings.pod_log_max_bytes,
        )
        return {**SUCCESS_201, "details": {"name": name, "kind": "pods"}}

    return json_response(await services.write(work, clean=True), status_code=201)


def pydantic_causes_of(exc: ValidationError) -> list[Cause]:
    return [Cause(c.field, c.message) for c in pydantic_causes(exc)]


def _since_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_timestamp(value)
    except ValueError:
        raise BadRequest(
            f'sinceTime "{value}" is not an RFC 3339 time: write it like 2026-12-03T10:00:00Z'
        ) from None
