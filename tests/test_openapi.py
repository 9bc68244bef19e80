"""openapi/openapi.json is generated from the code and committed; it must not drift."""

import json
from pathlib import Path

from app.openapi import document

COMMITTED = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def test_committed_openapi_matches_the_code() -> None:
    committed = json.loads(COMMITTED.read_text())
    generated = json.loads(json.dumps(document(), sort_keys=True))
    assert committed == generated, "openapi/openapi.json is stale: run `make openapi` and commit it"


def test_every_pod_operation_is_documented_with_kubernetes_errors() -> None:
    paths = document()["paths"]
    pod = paths["/api/v1/namespaces/{namespace}/pods/{name}"]
    assert {"get", "put", "patch", "delete"} <= pod.keys()
    create = paths["/api/v1/namespaces/{namespace}/pods"]["post"]
    assert create["requestBody"]["content"]["application/yaml"]["schema"] == {
        "$ref": "#/components/schemas/Pod"
    }
    assert {"403", "404", "409", "422"} <= create["responses"].keys()


def test_every_read_answer_has_a_schema() -> None:
    """Every object kind a GET returns is described, so the API suite checks answers against it."""
    paths = document()["paths"]
    reads = {
        path: operations["get"]["responses"]["200"]["content"]
        for path, operations in paths.items()
        if path.startswith(("/api/v1/", "/apis/tessera.io/v1/"))
        and "200" in operations.get("get", {}).get("responses", {})
    }
    text = sorted(path for path, content in reads.items() if "application/json" not in content)
    assert text == ["/api/v1/namespaces/{namespace}/pods/{name}/log"]  # a log is plain text
    undocumented = [
        path
        for path, content in reads.items()
        if path not in text and not content["application/json"]["schema"]
    ]
    assert undocumented == []


def test_kubectl_documents_are_openapi_30_with_kinds_tagged(tmp_path: Path) -> None:
    """kubectl parses the per group-version documents with an OpenAPI 3.0 parser: one 3.1-only
    construct and it rejects the whole document (apply then fails, explain finds nothing)."""
    from app.kube.router import kube_openapi
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/openapi.db")
    app = create_app(settings)
    documents = kube_openapi(app)
    app.state.services.db.dispose()
    found: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            for bound in ("exclusiveMinimum", "exclusiveMaximum"):
                if bound in node and not isinstance(node[bound], bool):
                    found.append(f"{where}.{bound}")
            if {"type": "null"} in node.get("anyOf", []):
                found.append(f"{where}.anyOf")
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for key, doc in documents.items():
        walk(doc["components"], key)
    assert found == []
    core = documents["api/v1"]["components"]["schemas"]
    assert core["Pod"]["x-kubernetes-group-version-kind"] == [
        {"group": "", "version": "v1", "kind": "Pod"}
    ]
    tessera = documents["apis/tessera.io/v1"]["components"]["schemas"]
    assert tessera["GPUDeviceList"]["x-kubernetes-group-version-kind"] == [
        {"group": "tessera.io", "version": "v1", "kind": "GPUDeviceList"}
    ]
    assert "x-kubernetes-group-version-kind" not in tessera["Pod"]


def test_every_kind_kubectl_applies_offers_server_side_field_validation(tmp_path: Path) -> None:
    """kubectl apply and create validate a manifest on the server only when the OpenAPI
    document's PATCH operation for its kind (POST for a Namespace) takes `fieldValidation`;
    otherwise they fetch /openapi/v2 to validate it themselves, which Tessera does not serve."""
    from app.kube.resources import RESOURCES
    from app.kube.router import kube_openapi
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/openapi.db")
    app = create_app(settings)
    documents = kube_openapi(app)
    app.state.services.db.dispose()

    def takes_field_validation(operation: dict) -> bool:
        return any(
            p["name"] == "fieldValidation" and p["in"] == "query"
            for p in operation.get("parameters", [])
        )

    offered: dict[str, set[str]] = {}  # kind -> methods whose operation takes fieldValidation
    for doc in documents.values():
        for operations in doc["paths"].values():
            for method, operation in operations.items():
                gvk = operation.get("x-kubernetes-group-version-kind")
                if gvk and method in ("post", "put", "patch") and takes_field_validation(operation):
                    offered.setdefault(gvk["kind"], set()).add(method)
    methods = {"create": "post", "patch": "patch", "update": "put"}
    missing = [
        f"{resource.kind} {method}"
        for resource in RESOURCES
        for verb, method in methods.items()
        if verb in resource.verbs and method not in offered.get(resource.kind, set())
    ]
    assert missing == []
    appliable = [r.kind for r in RESOURCES if {"create", "patch"} <= set(r.verbs)]
    assert appliable == [
        "Pod",
        "Namespace",
        "Node",
        "Tenant",
        "Price",
        "ConfigMap",
        "Secret",
        "ResourceQuota",
        "Service",
        "EndpointSlice",
        "ReplicaSet",
        "Deployment",
        "Job",
        "CronJob",
        "JobSet",
        "Callback",
        # twice: tessera.io's and scheduling.x-k8s.io's
        "PodGroup",
        "PodGroup",
        "Commitment",
        "Lease",  # the registry's, in its order of kinds
    ]
    assert "post" in offered["Namespace"] and all("patch" in offered[k] for k in appliable)
