"""Property-based API testing from the committed OpenAPI document (schemathesis).

Every operation is called with generated valid and invalid input, as a tenant acting in its own
namespace: no answer may be a 5xx, every answer must be documented and match its schema, and
invalid input must be rejected.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks

load_all_checks()
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402 - registered by load_all_checks
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

SCHEMA = schemathesis.openapi.from_path(
    Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
)
# Examples and generated cases; the exhaustive "coverage" phase takes minutes on the Pod schema.
SCHEMA.config.phases.update(phases=["examples", "fuzzing"])
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi(case, server, tenant, database_url) -> None:
    if "namespace" in (case.path_parameters or {}):
        case.path_parameters["namespace"] = tenant.tenant
    if case.query:
        case.query.pop("watch", None)  # streams are covered by the kubectl and client suites
    case.call_and_validate(
        base_url=server.url, headers={"Authorization": f"Bearer {tenant.token}"}, checks=CHECKS
    )
