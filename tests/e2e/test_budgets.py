"""A tenant's budget reached mid-burst, with real processes on both databases: `tessera serve`
(two workers), `tessera scheduler` and `tessera agent` (the node loop, metering every half
second). The tenant creates pods one after another until it is refused: no pod is admitted
after the first refusal, every later create is refused naming the budget, its pods are stopped
(it asked for it), and the day's statement ends at the limit, within the last second of its
pods at the price list's rates."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import orjson
import pytest

from app.kube.quantity import parse_quantity
from tests.api.test_billing_api import BASE, active_price
from tests.conftest import BACKENDS, migrated_database, unique
from tests.e2e.workloads import Stack, start_stack, wait_for
from tests.factories import pod

TENANTS = "/apis/tessera.io/v1/tenants"
MERGE = {"Content-Type": "application/merge-patch+json"}
LIMIT = Decimal("0.30")  # the daily limit: a few seconds of a burst of 1-vCPU pods
MAX_CREATES = 3000  # a bound that only ends a test whose budget is never enforced


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with migrated_database(request.param, tmp_path_factory) as url:
        running = start_stack(
            tmp_path_factory.mktemp("budgets"),
            url,
            unique("zone-"),
            workers=2,
            TESSERA_BUDGET_CHECK_SECONDS="0.5",
        )
        try:
            yield running
        finally:
            running.stop()


def tenant_client(stack: Stack, name: str) -> httpx.Client:
    admin = stack.server.admin()
    return httpx.Client(
        base_url=str(admin.base_url),
        verify=ssl.create_default_context(cafile=str(stack.server.ca)),
        headers={"Authorization": f"Bearer {stack.server.tenant_token(name)}"},
        timeout=30,
    )


def per_second(price: dict, manifest: dict) -> Decimal:
    """What one second of a pod of `manifest` costs at `price`, from the price list."""
    requests = manifest["spec"]["containers"][0]["resources"]["requests"]
    rates = price["spec"]["compute"]["general-purpose"]
    vcpu = Decimal(str(parse_quantity(requests["cpu"])))
    gib = Decimal(str(parse_quantity(requests["memory"]))) / 2**30
    return (vcpu * Decimal(rates["vcpuHour"]) + gib * Decimal(rates["memoryGiBHour"])) / 3600


def test_a_budget_reached_mid_burst_admits_no_pod_past_it_and_bills_up_to_it(stack: Stack) -> None:
    start = datetime.now(UTC)
    if (start + timedelta(minutes=3)).date() != start.date():
        pytest.skip("the burst's minutes would cross midnight UTC")
    name = unique("bud")
    stack.server.create_tenant(name)
    admin = stack.server.admin()
    price = active_price(admin, vcpu="36", memory="3.6")  # 0.01 per vCPU-s, 0.001 per GiB-s
    limits = {"spec": {"spendLimits": {"daily": str(LIMIT)}}}
    set_ = admin.patch(f"{TENANTS}/{name}", content=orjson.dumps(limits), headers=MERGE)
    assert set_.status_code == 200, set_.text
    owner = tenant_client(stack, name)
    asked = {"spec": {"budget": {"stopRunningPods": True}}}
    assert owner.patch(f"{TENANTS}/{name}", content=orjson.dumps(asked), headers=MERGE).is_success

    # one create after another until the first refusal, then a few more
    statuses: list[int] = []
    refusals: list[str] = []
    url = f"/api/v1/namespaces/{name}/pods"
    manifest = pod("b-0", cpu="1", memory="2Gi", terminationGracePeriodSeconds=0)
    for i in range(MAX_CREATES):
        answer = owner.post(url, json={**manifest, "metadata": {"name": f"b-{i}"}})
        statuses.append(answer.status_code)
        if answer.status_code != 201:
            refusals.append(answer.json()["message"])
            if len(refusals) == 5:
                break
    admitted = statuses.count(201)
    assert statuses == [201] * admitted + [403] * 5, statuses
    assert admitted > 1  # the limit was reached by a burst, not by its first pod
    for message in refusals:
        assert f"exceeded budget: tenant {name} daily spend limit {LIMIT} USD reached" in message

    # its pods are stopped (it asked for it); the meter keeps refusing
    wait_for("the tenant's pods to stop", lambda: not owner.get(url).json()["items"], 60)
    late = owner.post(url, json={**manifest, "metadata": {"name": "late"}})
    assert late.status_code == 403, late.text
    spend = owner.get(f"{TENANTS}/{name}").json()["status"]["spend"]
    assert spend["reached"] == ["daily"]

    # the day's statement: the limit, within the last second of the pods it held
    day = datetime.now(UTC).date().isoformat()
    statement = owner.get(f"{BASE}/namespaces/{name}/statements/{day}")
    assert statement.status_code == 200, statement.text
    total = Decimal(statement.json()["status"]["total"])
    last_second = admitted * per_second(price, manifest)
    rounding = Decimal("0.01") * len(statement.json()["status"]["lines"])
    assert LIMIT <= total <= LIMIT + last_second + rounding, (total, last_second, admitted)
    # and it stays there: nothing of the tenant is billed any more
    again = owner.get(f"{BASE}/namespaces/{name}/statements/{day}").json()["status"]["total"]
    assert Decimal(again) == total
    # the ledger agrees with what the nodes did (billing ended early, never late)
    stack.server.cli("billing", "audit", "--tenant", name)
