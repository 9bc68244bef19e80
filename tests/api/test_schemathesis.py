"""Property-based API testing from the committed OpenAPI document (schemathesis), on SQLite
and on PostgreSQL.

Every operation is called with generated valid and invalid input, as a tenant acting in its own
namespace: no answer may be a 5xx, every answer must be documented and match its schema, and
invalid input must be rejected. Bodies are sent with `fieldValidation=Strict`, as kubectl sends
them: by default an unknown field is dropped with a warning, as in Kubernetes, and the request
succeeds. The stateful test chains calls along the links schemathesis infers
from the document (create a pod, then read, patch, replace and delete what was created).
"""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks

from tests.conftest import unique
from tests.factories import pod

load_all_checks()
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402 - registered by load_all_checks
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

DOCUMENT = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
SCHEMA = schemathesis.openapi.from_path(DOCUMENT)
STATEFUL = schemathesis.openapi.from_path(DOCUMENT)  # links are inferred when it runs
# Examples and generated cases; the exhaustive "coverage" phase takes minutes on the Pod schema.
SCHEMA.config.phases.update(phases=["examples", "fuzzing"])
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi(case, server, tenant, database_url) -> None:
    if "namespace" in (case.path_parameters or {}):
        case.path_parameters["namespace"] = tenant.tenant
    if case.query:
        case.query.pop("watch", None)  # streams are covered by the kubectl and client suites
    if case.body is not None and case.method in ("POST", "PUT", "PATCH"):
        case.query = {**(case.query or {}), "fieldValidation": "Strict"}
    case.call_and_validate(
        base_url=server.url, headers={"Authorization": f"Bearer {tenant.token}"}, checks=CHECKS
    )


def test_call_sequences_conform_to_the_openapi(server, make_tenant, database_url) -> None:
    """Generated pods almost never pass admission (a sold spec, a known GPU model), so every other
    pod create sends a valid pod instead: the chains then read, patch, replace and delete objects
    that exist, with generated bodies and parameters.

    Each scenario acts as a fresh tenant, so that the same generated calls get the same answers
    when Hypothesis replays them (a pod left over from an earlier scenario would turn a 201 into
    a 409 and the replay into a different scenario)."""

    class AsTenant(STATEFUL.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            self.acting = make_tenant("seq")
            self.creates = 0

        def before_call(self, case) -> None:
            if "namespace" in (case.path_parameters or {}):
                case.path_parameters["namespace"] = self.acting.tenant
            if case.query:
                case.query.pop("watch", None)
            if case.method == "POST" and case.path.endswith("/pods"):
                self.creates += 1
                if self.creates % 2:
                    case.body = pod(unique("seq"), cpu="1", memory="2Gi")
                    case.media_type = "application/json"

        def get_call_kwargs(self, case) -> dict:
            return {
                "base_url": server.url,
                "headers": {"Authorization": f"Bearer {self.acting.token}"},
            }

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            case.validate_response(
                response,
                checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
            )

    AsTenant.run(
        settings=settings(
            max_examples=40,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )
