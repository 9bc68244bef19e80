"""Discovery and OpenAPI as kubectl and the Kubernetes clients read them.

- `/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/v1` (tessera.io and the access
  review groups authorization.k8s.io and authentication.k8s.io): what exists (kubectl
  api-resources, short names such as `gpu`).
- `/openapi/v3` and `/openapi/v3/{group-version}`: per group-version documents in which every
  operation carries `x-kubernetes-group-version-kind`; kubectl reads them to learn that the server
  validates fields itself (`fieldValidation` on PATCH), so `kubectl apply` with its default
  validation sends `fieldValidation=Strict` and the server names any unknown field.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import PlainTextResponse, Response

from app.deps import PrincipalDep, json_response
from app.errors import STATUS_RESPONSES, NotFound
from app.kube.resources import (
    RESOURCES,
    api_groups,
    api_resource_list,
    by_group_version,
    group_version_of,
    gvk_of_path,
)

router = APIRouter(tags=["discovery"], responses=STATUS_RESPONSES)

ACTIONS = {"get": "get", "put": "put", "patch": "patch", "delete": "delete", "post": "post"}


@router.get("/api", summary="Core API versions")
async def core_versions(request: Request, principal: PrincipalDep) -> Response:
    host = request.headers.get("host", "127.0.0.1")
    return json_response(
        {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    )


@router.get("/api/v1", summary="Core v1 resources")
async def core_resources(principal: PrincipalDep) -> Response:
    return json_response(api_resource_list("v1"))


def _group(name: str) -> dict[str, Any]:
    served = group_version_of(name)
    version = {"groupVersion": f"{name}/{served}", "version": served}
    return {"name": name, "versions": [version], "preferredVersion": version}


@router.get("/apis", summary="API groups")
async def groups(principal: PrincipalDep) -> Response:
    return json_response(
        {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in api_groups()]}
    )


def _serve_group(name: str) -> None:
    """`/apis/<group>` and `/apis/<group>/v1` for one group of the resource table."""

    async def group(principal: PrincipalDep) -> Response:
        return json_response({"kind": "APIGroup", "apiVersion": "v1", **_group(name)})

    version = group_version_of(name)

    async def resources(principal: PrincipalDep) -> Response:
        return json_response(api_resource_list(f"{name}/{version}"))

    router.add_api_route(f"/apis/{name}", group, methods=["GET"], summary=f"The {name} group")
    router.add_api_route(
        f"/apis/{name}/{version}",
        resources,
        methods=["GET"],
        summary=f"{name}/{version} resources",
    )


for _name in api_groups():
    _serve_group(_name)


@router.get("/openapi/v3", summary="Index of the per group-version OpenAPI documents")
async def openapi_v3_index(request: Request, principal: PrincipalDep) -> Response:
    documents = kube_openapi(request.app)
    paths = {
        key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_hash(doc)}"}
        for key, doc in documents.items()
    }
    return json_response({"paths": paths})


@router.get("/openapi/v3/{group_version:path}", summary="The OpenAPI document of one group-version")
async def openapi_v3(group_version: str, request: Request, principal: PrincipalDep) -> Response:
    document = kube_openapi(request.app).get(group_version)
    if document is None:
        raise NotFound(f"no OpenAPI document for {group_version}")
    return Response(orjson.dumps(document), media_type="application/json")


@router.get("/openapi/v2", include_in_schema=False)
async def openapi_v2(principal: PrincipalDep) -> Response:
    """kubectl asks for /openapi/v2 only when /openapi/v3 has no document for a manifest's
    group-version, that is for a kind Tessera does not serve. client-go shows the text of a
    plain-text 5xx (and only of that; a 404's is replaced by a generic message), so the answer is
    `501 Not Implemented` in words: kubectl apply prints which kinds Tessera serves."""
    return PlainTextResponse(
        "OpenAPI v2 is not served; kubectl asks for it when the kind being validated is not "
        f"one Tessera serves (it serves {served_kinds()}) or takes no server-side field "
        "validation (then apply with --validate=false)",
        status_code=501,
    )


def served_kinds() -> str:
    """In words, the kinds a manifest may hold: `Pod (v1), ..., PodGroup (tessera.io/v1)`."""
    return ", ".join(f"{r.kind} ({r.group_version})" for r in RESOURCES if "create" in r.verbs)


def kube_openapi(app: FastAPI) -> dict[str, dict[str, Any]]:
    """The application's OpenAPI split per group-version, with Kubernetes' vendor extensions."""
    return _split(id(app), app)


@cache
def _split(_key: int, app: FastAPI) -> dict[str, dict[str, Any]]:
    spec = app.openapi()
    out: dict[str, dict[str, Any]] = {}
    keys = ["api/v1", *(f"apis/{g}/{group_version_of(g)}" for g in api_groups())]
    for key in keys:
        prefix = f"/{key}/"
        paths: dict[str, Any] = {}
        for path, operations in spec["paths"].items():
            if not path.startswith(prefix):
                continue
            found = gvk_of_path(path)
            tagged = {}
            for method, operation in operations.items():
                operation = dict(operation)
                if found is not None:
                    resource, scope = found
                    kind = resource.kind
                    for sub, sub_kind, _ in resource.subresources:
                        if scope == sub:
                            kind = sub_kind
                    operation["x-kubernetes-group-version-kind"] = {
                        "group": resource.group,
                        "version": resource.version,
                        "kind": kind,
                    }
                    action = ACTIONS.get(method, method)
                    if method == "get" and scope == "list":
                        action = "list"
                    operation["x-kubernetes-action"] = action
                tagged[method] = operation
            paths[path] = tagged
        group_version = key.removeprefix("apis/").removeprefix("api/")
        out[key] = {
            "openapi": "3.0.0",
            "info": {"title": "Tessera", "version": spec["info"]["version"]},
            "paths": paths,
            "components": _tag_kinds(spec.get("components", {}), group_version),
        }
    return out


def _tag_kinds(components: dict[str, Any], group_version: str) -> dict[str, Any]:
    """Mark the schemas of this group-version's kinds (and their lists) with
    `x-kubernetes-group-version-kind`, which `kubectl explain` looks the kinds up by."""
    schemas = {name: _openapi30(schema) for name, schema in components.get("schemas", {}).items()}
    for resource in by_group_version(group_version):
        named = resource.schema or resource.kind
        kinds = [(named, resource.kind), (f"{named}List", f"{resource.kind}List")]
        kinds += [(kind, kind) for _, kind, _ in resource.subresources]
        for schema, kind in kinds:
            if schema in schemas:
                gvk = {"group": resource.group, "version": resource.version, "kind": kind}
                schemas[schema] = {**schemas[schema], "x-kubernetes-group-version-kind": [gvk]}
    return {**components, "schemas": schemas}


def _hash(document: dict[str, Any]) -> str:
    return (
        hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32].upper()
    )


def _openapi30(node: Any) -> Any:
    """Rewrite OpenAPI 3.1 schema idioms (as FastAPI writes them) the OpenAPI 3.0 way that
    kubectl's parser expects: numeric `exclusiveMinimum` becomes `minimum` plus a flag (kubectl
    rejects the whole document otherwise, and `apply` falls back to a schema it cannot fetch),
    and an optional field's `anyOf: [X, {type: null}]` becomes X itself, a reference wrapped in
    `allOf` so the field keeps its description; `kubectl explain` then shows such fields with
    their type and lets one drill into them (`kubectl explain pods.spec.containers.resources`)."""
    if isinstance(node, list):
        return [_openapi30(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _openapi30(value) for key, value in node.items()}
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[inclusive], out[bound] = out[bound], True  # 3.1's number is 3.0's flag
    options = out.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if o != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(options):
            del out["anyOf"]
            (only,) = kept
            out.update({"allOf": [only]} if "$ref" in only else only)
        elif sorted(str(o.get("type")) for o in kept) == ["integer", "string"]:
            del out["anyOf"]  # a port or a percentage: Kubernetes' IntOrString
            out["x-kubernetes-int-or-string"] = True
        elif len(kept) < len(options):
            out["anyOf"], out["nullable"] = kept, True
    return out
