"""A tenant's own limits over real HTTP, on SQLite and on PostgreSQL: the tenant-wide quota the
admin sets on the Tenant object (across all its namespaces, exact under concurrency), and spend
limits (the admin's ceilings, the tenant's lower budget, thresholds told once each by an Event
and a callback, new pods refused at 100 % even mid-burst, running pods stopped BestEffort first
when asked), metered by the ledger's own rating."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pytest

from app import agent
from app.budgets import service as budgets
from app.db.models import Tenant
from app.pods import service as pods
from billing import ledger
from tests.api.test_billing_api import active_price
from tests.api.test_callbacks import create_callback
from tests.billing.helpers import bound_pod
from tests.conftest import Api
from tests.factories import pod
from tests.receiver import Receiver

TENANTS = "/apis/tessera.io/v1/tenants"
MERGE = {"Content-Type": "application/merge-patch+json"}


def patch_tenant(api: Api, name: str, body: dict[str, Any], **params: str) -> httpx.Response:
    return api.patch(f"{TENANTS}/{name}", content=orjson.dumps(body), headers=MERGE, params=params)


def pods_url(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def burst(api: Api, ns: str, names: list[str], **manifest: Any) -> list[int]:
    """Create `names` at once (threads released together); their status codes."""
    results: list[int] = []
    start = threading.Barrier(len(names))

    def create(name: str) -> None:
        with httpx.Client(
            base_url=str(api.http.base_url), headers=dict(api.http.headers), timeout=60
        ) as http:
            start.wait()
            answer = http.post(pods_url(ns), json=pod(name, **manifest))
            results.append(answer.status_code)

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# --- the tenant-wide quota --------------------------------------------------------------------


def test_a_tenant_quota_spans_its_namespaces_and_only_the_admin_sets_it(admin, make_tenant):
    owner, other = make_tenant(), make_tenant()
    name = owner.tenant
    second = f"{name}-b"
    made = owner.post("/api/v1/namespaces", json={"metadata": {"name": second}})
    assert made.status_code == 201, made.text
    # a dry run is checked and writes nothing
    dry = patch_tenant(
        admin, name, {"spec": {"quota": {"hard": {"count/pods": "3"}}}}, dryRun="All"
    )
    assert dry.status_code == 200, dry.text
    assert dry.json()["spec"]["quota"]["hard"] == {"count/pods": "3"}
    assert admin.get(f"{TENANTS}/{name}").json()["spec"] == {"weight": 1}  # nothing written
    hard = {"count/pods": "3", "requests.cpu": "100", "count/configmaps": "1"}
    set_ = patch_tenant(admin, name, {"spec": {"quota": {"hard": hard}}})
    assert set_.status_code == 200, set_.text
    # the tenant reads its own Tenant (not another's), and cannot raise its quota
    mine = owner.get(f"{TENANTS}/{name}")
    assert mine.status_code == 200 and mine.json()["spec"]["quota"]["hard"] == hard
    assert owner.get(f"{TENANTS}/{other.tenant}").status_code == 403
    assert owner.get(TENANTS).status_code == 403
    raised = patch_tenant(owner, name, {"spec": {"quota": {"hard": {"count/pods": "100"}}}})
    assert raised.status_code == 403, raised.text
    assert "only the admin sets spec.quota" in raised.json()["message"]
    assert (
        patch_tenant(owner, other.tenant, {"spec": {"budget": {"daily": "1"}}}).status_code == 403
    )
    for target, allowed in ((name, True), (other.tenant, False)):
        review = owner.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "group": "tessera.io",
                        "resource": "tenants",
                        "verb": "patch",
                        "name": target,
                    }
                },
            },
        )
        assert review.status_code == 201, review.text
        assert review.json()["status"]["allowed"] is allowed

    assert owner.post(pods_url(name), json=pod("a")).status_code == 201
    assert owner.post(pods_url(second), json=pod("b")).status_code == 201
    assert owner.post(pods_url(second), json=pod("c")).status_code == 201
    # more namespaces do not make more room
    refused = owner.post(pods_url(name), json=pod("d"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["message"] == (
        f'pods "d" is forbidden: exceeded quota: tenant/{name}, requested: count/pods=1, '
        "used: count/pods=3, limited: count/pods=3"
    )
    # count/<kind> across namespaces too
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
    assert owner.post(f"/api/v1/namespaces/{name}/configmaps", json=cm).status_code == 201
    second_cm = owner.post(f"/api/v1/namespaces/{second}/configmaps", json=cm)
    assert second_cm.status_code == 403
    assert (
        f"exceeded quota: tenant/{name}, requested: count/configmaps=1"
        in (second_cm.json()["message"])
    )
    status = owner.get(f"{TENANTS}/{name}").json()["status"]["quota"]
    assert status == {
        "hard": hard,
        "used": {"count/pods": "3", "requests.cpu": "6", "count/configmaps": "1"},
    }
    # the admin may raise it (a merge patch: the other limits stay)
    raised = patch_tenant(admin, name, {"spec": {"quota": {"hard": {"count/pods": "4"}}}})
    assert raised.json()["spec"]["quota"]["hard"] == {**hard, "count/pods": "4"}
    assert owner.post(pods_url(name), json=pod("d")).status_code == 201


def test_the_weight_is_the_admins_and_lives_beside_the_limits(admin, make_tenant):
    """spec.weight (fair share) is one more admin field: the tenant may not change it, a
    weight out of range is 422, and setting it keeps the other fields of the spec."""
    owner = make_tenant()
    name = str(owner.tenant)
    budget = patch_tenant(owner, name, {"spec": {"budget": {"daily": "5"}}})
    assert budget.status_code == 200, budget.text
    refused = patch_tenant(owner, name, {"spec": {"weight": 5}})
    assert refused.status_code == 403 and "spec.weight" in refused.json()["message"]
    for bad in (0, 1001, "2", True):
        answer = patch_tenant(admin, name, {"spec": {"weight": bad}})
        assert answer.status_code in (400, 422), (bad, answer.text)
    set_ = patch_tenant(admin, name, {"spec": {"weight": 3}})
    assert set_.status_code == 200, set_.text
    assert admin.get(f"{TENANTS}/{name}").json()["spec"] == {
        "weight": 3,
        "budget": {"daily": "5"},
    }


def test_concurrent_creates_in_two_namespaces_admit_exactly_the_tenant_room(admin, make_tenant):
    owner = make_tenant()
    name = owner.tenant
    second = f"{name}-b"
    assert owner.post("/api/v1/namespaces", json={"metadata": {"name": second}}).status_code == 201
    assert (
        patch_tenant(admin, name, {"spec": {"quota": {"hard": {"pods": "10"}}}}).status_code == 200
    )
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda ns=ns, i=i: results.extend(
                burst(owner, ns, [f"p{i}-{j}" for j in range(15)])
            )
        )
        for i, ns in enumerate((name, second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [201] * 10 + [403] * 20
    count = sum(len(owner.get(pods_url(ns)).json()["items"]) for ns in (name, second))
    assert count == 10


# --- spend limits ---------------------------------------------------------------------------


def test_spend_limits_are_validated_and_a_tenant_cannot_raise_the_ceiling(admin, make_tenant):
    owner = make_tenant()
    name = owner.tenant
    for spec, expected in (
        ({"spendLimits": {"daily": "-1"}}, "spec.spendLimits.daily: Invalid value"),
        ({"spendLimits": {"daily": "ten"}}, "not a decimal amount"),
        ({"spendLimits": {"daily": "1.001"}}, "at most 2 decimals"),
        ({"budget": {"thresholds": [50, 150]}}, "whole percentages from 1 to 100"),
        ({"budget": {"thresholds": [50, 50]}}, "distinct"),
        ({"quota": {"hard": {"gpus": "1"}}}, 'spec.quota.hard[gpus]: Unsupported value: "gpus"'),
    ):
        answer = patch_tenant(admin, name, {"spec": spec})
        assert answer.status_code == 422, (spec, answer.text)
        assert expected in answer.json()["message"], answer.json()["message"]
    unknown = admin.put(
        f"{TENANTS}/{name}",
        json={"metadata": {"name": name}, "spec": {"budget": {"stopPods": True}}},
    )
    assert unknown.status_code == 400 and "stopPods" in unknown.json()["message"]
    weekly = patch_tenant(admin, name, {"spec": {"spendLimits": {"weekly": "1"}}})
    assert weekly.status_code == 400
    assert 'unknown field "spec.spendLimits.weekly"' in weekly.json()["message"]
    assert admin.get(f"{TENANTS}/{name}").json()["spec"] == {"weight": 1}  # nothing written

    ceiling = {"spendLimits": {"daily": "10", "monthly": "100"}}
    assert patch_tenant(admin, name, {"spec": ceiling}).status_code == 200
    over = patch_tenant(owner, name, {"spec": {"budget": {"daily": "11"}}})
    assert over.status_code == 403, over.text
    assert (
        "spec.budget.daily 11 is above the admin's ceiling spec.spendLimits.daily 10"
        in (over.json()["message"])
    )
    raised = patch_tenant(owner, name, {"spec": {"spendLimits": {"daily": "1000"}}})
    assert raised.status_code == 403 and "only the admin sets spec.spendLimits" in raised.text
    lower = patch_tenant(
        owner, name, {"spec": {"budget": {"daily": "4.50", "thresholds": [50, 80]}}}
    )
    assert lower.status_code == 200, lower.text
    assert lower.json()["status"]["spend"]["limits"] == {"daily": "4.50", "monthly": "100"}
    # the admin lowering the ceiling under the budget: the lower one is in force
    patch_tenant(admin, name, {"spec": {"spendLimits": {"daily": "3"}}})
    assert owner.get(f"{TENANTS}/{name}").json()["status"]["spend"]["limits"]["daily"] == "3"
    # a tenant's dry run writes nothing
    dry = patch_tenant(owner, name, {"spec": {"budget": {"daily": "1"}}}, dryRun="All")
    assert dry.status_code == 200
    assert owner.get(f"{TENANTS}/{name}").json()["spec"]["budget"]["daily"] == "4.50"


def test_a_budget_reached_mid_burst_admits_no_pod_past_it(server, admin, make_tenant):
    start = datetime.now(UTC)
    if (start + timedelta(minutes=3)).date() != start.date():
        pytest.skip("the test's metered minutes would cross midnight UTC")
    owner = make_tenant()
    name = owner.tenant
    db = server.services.db
    settings = server.services.settings
    with Receiver() as receiver:
        hook = create_callback(owner, receiver.url(), events=["BudgetThreshold"])["metadata"]
        active_price(admin, vcpu="36", memory="3.6")  # 0.01 per vCPU-s, 0.001 per GiB-s
        patch_tenant(admin, name, {"spec": {"spendLimits": {"daily": "1000"}}})
        patch_tenant(owner, name, {"spec": {"budget": {"thresholds": [50, 80, 100]}}})
        running = bound_pod(owner, admin, "running", cpu="1", memory="2Gi")
        assert db.write(lambda s: pods.start(s, uid=running["metadata"]["uid"]))
        first = datetime.now(UTC) + timedelta(seconds=5)
        (metered,) = [
            m for m in agent.check_budgets(db, settings=settings, at=first) if m.tenant == name
        ]
        assert metered.crossed == [] and metered.day_minor > 0
        # the meter is the ledger's rating: the statement of the day, to the cent
        tenant_id = db.read(lambda s: s.query(Tenant.id).filter(Tenant.name == name).scalar())
        statement = db.read(
            lambda s: ledger.compute_day(
                s,
                tenant_id=tenant_id,
                day=first.date(),
                now=first,
                book=ledger.price_book(s, currency=settings.billing_currency),
                minor_digits=settings.billing_minor_digits,
            )
        )
        assert metered.day_minor == statement.total_minor
        # a budget the spend so far is 60 % of: the 50 % threshold, once
        spent = Decimal(metered.day_minor) / 100
        limit = (spent / Decimal("0.6")).quantize(Decimal("0.01"))
        budget = patch_tenant(owner, name, {"spec": {"budget": {"daily": str(limit)}}})
        assert budget.status_code == 200, budget.text
        for _ in range(2):
            again = [
                m for m in agent.check_budgets(db, settings=settings, at=first) if m.tenant == name
            ]
            assert again[0].crossed == ([("daily", 50)] if _ == 0 else [])
        shown = owner.get(f"{TENANTS}/{name}").json()["status"]["spend"]
        assert shown["today"] == format(spent, "f") and "reached" not in shown

        # the first wave fits; the meter then reads 100 %; the second wave is refused whole
        wave = burst(owner, name, [f"one-{i}" for i in range(6)])
        assert wave == [201] * 6
        later = first + timedelta(seconds=90)
        (metered,) = [
            m for m in agent.check_budgets(db, settings=settings, at=later) if m.tenant == name
        ]
        assert metered.crossed == [("daily", 80), ("daily", 100)]
        assert metered.stopped == []  # not asked for
        wave = burst(owner, name, [f"two-{i}" for i in range(6)])
        assert wave == [403] * 6
        refused = owner.post(pods_url(name), json=pod("late"))
        assert refused.status_code == 403
        message = refused.json()["message"]
        assert message.startswith(
            f'pods "late" is forbidden: exceeded budget: tenant {name} daily spend limit {limit} USD'
        ), message
        assert len(owner.get(pods_url(name)).json()["items"]) == 7
        assert owner.get(f"{TENANTS}/{name}").json()["status"]["spend"]["reached"] == ["daily"]

        # each threshold told once: three Events and three callbacks
        listed = owner.get(f"/api/v1/namespaces/{name}/events").json()["items"]
        told = sorted(
            e["message"].split("%")[0]
            for e in listed
            if e["reason"] in ("BudgetThreshold", "BudgetExceeded")
        )
        assert told == ["100", "50", "80"]
        got = receiver.wait_for(3)
        data = sorted(orjson.loads(r.body)["data"]["threshold"] for r in got)
        assert data == [50, 80, 100]
        assert all(orjson.loads(r.body)["type"] == "io.tessera.budget.threshold" for r in got)
        assert hook["name"]

        # raising the budget lifts the refusal at once (the last reading, the new limit)
        assert patch_tenant(owner, name, {"spec": {"budget": {"daily": "1000"}}}).status_code == 200
        assert owner.post(pods_url(name), json=pod("after-raise")).status_code == 201
        assert owner.delete(f"{pods_url(name)}/after-raise").status_code == 200


def test_a_spent_budget_stops_running_pods_best_effort_first_when_asked(server, admin, make_tenant):
    owner = make_tenant()
    name = owner.tenant
    db = server.services.db
    settings = server.services.settings
    active_price(admin, vcpu="36", memory="3.6")
    regular = bound_pod(owner, admin, "regular", cpu="1", memory="2Gi")
    spare = bound_pod(
        owner,
        admin,
        "spare",
        cpu="1",
        memory="2Gi",
        labels={"tessera.io/compute-qos": "best-effort"},
    )
    for made in (regular, spare):
        assert db.write(lambda s, uid=made["metadata"]["uid"]: pods.start(s, uid=uid))
    patch_tenant(admin, name, {"spec": {"spendLimits": {"monthly": "0.01"}}})
    patch_tenant(owner, name, {"spec": {"budget": {"stopRunningPods": True}}})
    at = datetime.now(UTC) + timedelta(seconds=30)
    (metered,) = [m for m in agent.check_budgets(db, settings=settings, at=at) if m.tenant == name]
    assert metered.crossed == [("monthly", 100)]
    assert metered.stopped == [f"{name}/spare", f"{name}/regular"]
    for pod_name in ("spare", "regular"):
        shown = owner.get(f"{pods_url(name)}/{pod_name}").json()
        assert shown["metadata"].get("deletionTimestamp"), shown
        (condition,) = [c for c in shown["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert condition["reason"] == "BudgetExceeded"
    # once stopped, a later reading stops nothing more and tells nothing again
    (again,) = [m for m in agent.check_budgets(db, settings=settings, at=at) if m.tenant == name]
    assert again.crossed == [] and again.stopped == []
    assert budgets.limits_of({"spendLimits": {"monthly": "0.01"}}) == {"monthly": Decimal("0.01")}


def test_a_pod_stopped_for_its_budget_is_billed_up_to_the_second_the_limit_was_reached(
    server, admin, make_tenant
):
    """The meter notices a spent budget only at its next reading; the pods it stops are billed
    up to the second the limit was reached, not to the reading (nor through their grace
    period): the day's statement is the limit within one pod's last second."""
    start = datetime.now(UTC)
    if (start + timedelta(minutes=3)).date() != start.date():
        pytest.skip("the test's metered minutes would cross midnight UTC")
    owner = make_tenant()
    name = owner.tenant
    db = server.services.db
    settings = server.services.settings
    price = active_price(admin, vcpu="36", memory="3.6")
    running = bound_pod(owner, admin, "running", cpu="1", memory="2Gi")
    assert db.write(lambda s: pods.start(s, uid=running["metadata"]["uid"]))
    patch_tenant(owner, name, {"spec": {"budget": {"stopRunningPods": True}}})
    rates = price["spec"]["compute"]["general-purpose"]
    per_second = (Decimal(rates["vcpuHour"]) + 2 * Decimal(rates["memoryGiBHour"])) / 3600
    limit = (per_second * 30).quantize(Decimal("0.01"))  # reached about 30 s after the bind
    assert patch_tenant(admin, name, {"spec": {"spendLimits": {"daily": str(limit)}}}).is_success
    first = start + timedelta(seconds=5)
    (metered,) = [
        m for m in agent.check_budgets(db, settings=settings, at=first) if m.tenant == name
    ]
    assert metered.stopped == []
    later = start + timedelta(seconds=90)  # a reading long after the limit was reached
    (metered,) = [
        m for m in agent.check_budgets(db, settings=settings, at=later) if m.tenant == name
    ]
    assert metered.stopped == [f"{name}/running"]
    uid = running["metadata"]["uid"]
    (usage,) = db.read(lambda s: ledger.usage(s, pod_uid=uid)).values()
    assert usage.stop_reason == "budget" and usage.stopped is not None
    assert usage.stopped < later.replace(microsecond=0)
    tenant_id = db.read(lambda s: s.query(Tenant.id).filter(Tenant.name == name).scalar())
    statement = db.read(
        lambda s: ledger.compute_day(
            s,
            tenant_id=tenant_id,
            day=start.date(),
            now=later + timedelta(seconds=60),
            book=ledger.price_book(s, currency=settings.billing_currency),
            minor_digits=settings.billing_minor_digits,
        )
    )
    total = Decimal(statement.total_minor) / 100
    assert limit <= total <= limit + per_second + Decimal("0.01") * len(statement.lines), total
