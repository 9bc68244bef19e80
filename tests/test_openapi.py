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
