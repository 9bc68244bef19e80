"""Billing over the API (`billing.tessera.io/v1`) on both databases: the price book, usage
reports in JSON and CSV, daily statements and commitment plans, through a pod's whole life.

Prices are global and a version may not take effect in the past, so each test that needs one
adds a version a second ahead and waits for it: the session's server keeps every version."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select

from app.db.models import CommitmentTerm, PriceVersion, Statement, Tenant, UsageEvent
from app.pods import service as pods
from billing import ledger
from tests.billing.helpers import bound_pod
from tests.conftest import unique

BASE = "/apis/billing.tessera.io/v1"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def price_body(name: str, at: datetime, *, vcpu: str = "0.036", memory: str = "0.0072") -> dict:
    return {
        "apiVersion": "billing.tessera.io/v1",
        "kind": "Price",
        "metadata": {"name": name},
        "spec": {
            "effectiveFrom": stamp(at),
            "bestEffortFraction": "0.2",
            "compute": {
                cls: {"vcpuHour": vcpu, "memoryGiBHour": memory}
                for cls in ("general-purpose", "performance", "gpu")
            },
            "gpus": {"*": {"vramGiBHour": "0.018", "smPercentHour": "0.036"}},
            "commitmentTiers": [
                {"minPerDay": "10", "discount": "0.1"},
                {"minPerDay": "100", "discount": "0.2"},
            ],
        },
    }


def active_price(admin, **rates) -> dict:
    """A new price version in effect from the next second (waited for)."""
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    response = admin.post(f"{BASE}/prices", json=price_body(unique("p-"), at, **rates))
    assert response.status_code == 201, response.text
    time.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.05)
    return response.json()


def prices_in_db(server) -> int:
    db = server.services.db
    return db.read(lambda s: s.scalar(select(func.count()).select_from(PriceVersion)))


def test_the_price_book_is_written_by_the_admin_and_read_by_tenants(server, admin, tenant) -> None:
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(days=400)
    name = unique("future-")
    created = admin.post(f"{BASE}/prices", json=price_body(name, later))
    assert created.status_code == 201, created.text
    assert created.json()["status"]["phase"] == "Scheduled"
    assert created.json()["spec"]["compute"]["gpu"] == {
        "vcpuHour": "0.036",
        "memoryGiBHour": "0.0072",
    }
    # tenants read the book, as a list and a kubectl table, and cannot write it
    listed = tenant.get(f"{BASE}/prices").json()
    assert listed["kind"] == "PriceList" and name in [
        p["metadata"]["name"] for p in listed["items"]
    ]
    assert tenant.get(f"{BASE}/prices/{name}").json()["spec"]["effectiveFrom"] == stamp(later)
    table = tenant.get(f"{BASE}/prices/{name}", headers=TABLE).json()
    assert [c["name"] for c in table["columnDefinitions"]][:3] == ["Name", "Effective", "Phase"]
    assert table["rows"][0]["cells"][:3] == [name, stamp(later), "Scheduled"]
    refused = tenant.post(f"{BASE}/prices", json=price_body(unique("t-"), later))
    assert refused.status_code == 403
    assert tenant.delete(f"{BASE}/prices/{name}").status_code == 403

    # a version is immutable: the same name again is refused, as is the same instant
    again = admin.post(f"{BASE}/prices", json=price_body(name, later + timedelta(days=1)))
    assert again.status_code == 409 and "never changes" in again.json()["message"]
    twin = admin.post(f"{BASE}/prices", json=price_body(unique("twin-"), later))
    assert twin.status_code == 422
    assert twin.json()["details"]["causes"][0]["field"] == "spec.effectiveFrom"
    # a version not in effect yet may be withdrawn
    assert admin.delete(f"{BASE}/prices/{name}").status_code == 200
    assert admin.get(f"{BASE}/prices/{name}").status_code == 404


def test_the_example_price_list_is_accepted_any_day_from_the_moment_it_is_created(
    server, admin
) -> None:
    """examples/demo-price.yaml names no effectiveFrom: it takes effect when it is created, so
    it is never refused for a date that has passed (it was, once 2026-01-01 had)."""
    import yaml

    example = yaml.safe_load((Path(__file__).parents[2] / "examples/demo-price.yaml").read_text())
    assert "effectiveFrom" not in example["spec"]
    before = prices_in_db(server)
    sent = datetime.now(UTC).replace(microsecond=0)
    tried = admin.post(f"{BASE}/prices", params={"dryRun": "All"}, json=example)
    assert tried.status_code == 201, tried.text
    effective = datetime.fromisoformat(tried.json()["spec"]["effectiveFrom"])
    assert sent <= effective <= datetime.now(UTC)
    assert prices_in_db(server) == before  # a dry run writes nothing


def test_a_refused_price_says_what_is_wrong_and_writes_nothing(server, admin) -> None:
    before = prices_in_db(server)
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    response = admin.post(f"{BASE}/prices", json=price_body(unique("past-"), past))
    assert response.status_code == 422
    (cause,) = response.json()["details"]["causes"]
    assert cause["field"] == "spec.effectiveFrom" and "in the past" in cause["message"]

    body = price_body(unique("bad-"), past + timedelta(days=2), vcpu="-1")
    body["spec"]["gpus"] = {"H200": {"vramGiBHour": "x", "smPercentHour": "0.01"}}
    body["spec"]["commitmentTiers"] = [{"minPerDay": "10", "discount": "1.5"}]
    body["spec"]["currency"] = "EUR"
    response = admin.post(f"{BASE}/prices", json=body)
    assert response.status_code == 422
    fields = {c["field"] for c in response.json()["details"]["causes"]}
    assert {
        "spec.compute.general-purpose.vcpuHour",
        "spec.gpus",  # no "*" for the other models
        "spec.gpus.H200.vramGiBHour",
        "spec.commitmentTiers[0].discount",
        "spec.currency",
    } <= fields
    assert prices_in_db(server) == before


def test_a_dry_run_writes_nothing_and_a_free_or_jumping_rate_is_warned_of(server, admin) -> None:
    """A rate of 0, or more than 10x the version before: 201 all the same, with a Warning
    header per rate and the warnings in status (and in `kubectl get prices`). A dry run answers
    the same and writes nothing."""
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(days=700)
    before = prices_in_db(server)
    free = price_body(unique("free-"), base)
    free["spec"]["compute"]["gpu"]["vcpuHour"] = "0"
    tried = admin.post(f"{BASE}/prices", params={"dryRun": "All"}, json=free)
    assert tried.status_code == 201, tried.text
    assert "spec.compute.gpu.vcpuHour is 0" in tried.headers["Warning"]
    assert tried.json()["status"]["warnings"] == [
        "spec.compute.gpu.vcpuHour is 0: usage of it is free"
    ]
    assert prices_in_db(server) == before
    assert admin.get(f"{BASE}/prices/{free['metadata']['name']}").status_code == 404

    plain = admin.post(f"{BASE}/prices", json=price_body(unique("plain-"), base))
    assert plain.status_code == 201 and "Warning" not in plain.headers
    jump = price_body(unique("jump-"), base + timedelta(days=1), vcpu="1000000")
    jumped = admin.post(f"{BASE}/prices", json=jump)
    assert jumped.status_code == 201, jumped.text
    warned = jumped.json()["status"]["warnings"]
    assert len(warned) == 3 and all("more than a 10x change" in w for w in warned), warned
    assert plain.json()["metadata"]["name"] in warned[0]
    assert jumped.headers["Warning"].count("299 -") == 3
    table = admin.get(f"{BASE}/prices", headers=TABLE).json()
    columns = [c["name"] for c in table["columnDefinitions"]]
    cells = {row["cells"][0]: row["cells"] for row in table["rows"]}
    assert "10x" in cells[jump["metadata"]["name"]][columns.index("Warnings")]
    assert cells[plain.json()["metadata"]["name"]][columns.index("Warnings")] == "<none>"
    for name in (jump["metadata"]["name"], plain.json()["metadata"]["name"]):
        assert admin.delete(f"{BASE}/prices/{name}").status_code == 200


def test_a_price_in_effect_stays(server, admin) -> None:
    price = active_price(admin)
    name = price["metadata"]["name"]
    assert admin.get(f"{BASE}/prices/{name}").json()["status"]["phase"] == "Active"
    response = admin.delete(f"{BASE}/prices/{name}")
    assert response.status_code == 409 and "create a new version" in response.json()["message"]


def test_a_price_patch_changes_labels_never_rates(server, admin, tenant) -> None:
    """PATCH (what `kubectl apply` sends for an existing version): labels and annotations
    change; the rates never do, in any patch format; a dry run, a stale resourceVersion and a
    tenant change nothing."""
    name = unique("patched-")
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    created = admin.post(f"{BASE}/prices", json=price_body(name, later)).json()
    url = f"{BASE}/prices/{name}"

    def stored() -> dict:
        return admin.get(url).json()

    dry = admin.patch(
        url, params={"dryRun": "All"}, headers=MERGE, json={"metadata": {"labels": {"a": "b"}}}
    )
    assert dry.status_code == 200 and dry.json()["metadata"]["labels"] == {"a": "b"}
    assert stored() == created | {"status": stored()["status"]}  # nothing written
    stale = admin.patch(
        url,
        headers=MERGE,
        json={"metadata": {"labels": {"a": "b"}, "resourceVersion": "1"}},
    )
    assert stale.status_code == 409
    assert (
        tenant.patch(url, headers=MERGE, json={"metadata": {"labels": {"a": "b"}}}).status_code
        == 403
    )
    labelled = admin.patch(url, headers=MERGE, json={"metadata": {"labels": {"a": "b"}}})
    assert labelled.status_code == 200, labelled.text
    assert stored()["metadata"]["labels"] == {"a": "b"}
    assert int(stored()["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    # the same rates written another way change nothing; other rates are refused, in words
    same = admin.patch(
        url,
        headers=MERGE,
        json={"spec": {"compute": {"performance": {"vcpuHour": "0.0360"}}}},
    )
    assert same.status_code == 200, same.text
    for patch_headers, patch in (
        (MERGE, {"spec": {"bestEffortFraction": "0.3"}}),
        (
            {"Content-Type": "application/json-patch+json"},
            [{"op": "replace", "path": "/spec/bestEffortFraction", "value": "0.3"}],
        ),
    ):
        refused = admin.patch(url, headers=patch_headers, json=patch)
        assert refused.status_code == 422, refused.text
        assert "a price version never changes" in refused.json()["message"]
    assert stored()["spec"] == created["spec"]
    assert admin.delete(url).status_code == 200


def report(api, path: str, **params) -> dict:
    response = api.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_usage_of_a_pod_through_its_whole_life(server, admin, make_tenant) -> None:
    owner, other = make_tenant("bu"), make_tenant("bx")
    db = server.services.db
    active_price(admin, vcpu="3.6", memory="0.36")  # 0.001 per vCPU-s, 0.0001 per GiB-s
    start = datetime.now(UTC).replace(microsecond=0)
    pod = bound_pod(owner, admin, "train", cpu="2", memory="4Gi")
    ns = owner.tenant
    path = f"{BASE}/namespaces/{ns}/usage"
    time.sleep(2.2)

    # while it runs: per-second rows of 2 vCPU and 4 GiB, rated at the price in effect
    params = {"from": stamp(start), "granularity": "second", "groupBy": "pod,resource"}
    running = report(owner, path, **params)
    assert running["kind"] == "UsageList" and running["groupBy"] == ["pod", "resource"]
    vcpu_rows = [r for r in running["items"] if r["resource"] == "vcpu"]
    assert len(vcpu_rows) >= 2
    assert {r["pod"] for r in running["items"]} == {f"{ns}/train"}
    assert all(r["quantities"] == {"vcpu": "2"} and r["amount"] == "0.002000" for r in vcpu_rows)
    memory_rows = [r for r in running["items"] if r["resource"] == "memory"]
    assert all(
        r["quantities"] == {"memory": "4"} and r["amount"] == "0.000400" for r in memory_rows
    )

    # a label on the running pod changes nothing billed
    patched = owner.patch(
        f"/api/v1/namespaces/{ns}/pods/train",
        json={"metadata": {"labels": {"a": "b"}}},
        headers=MERGE,
    )
    assert patched.status_code == 200, patched.text

    # deleted and stopped: the usage ends there and no longer grows
    assert owner.delete(f"/api/v1/namespaces/{ns}/pods/train").status_code == 200
    assert db.write(lambda s: pods.finalize(s, uid=pod["metadata"]["uid"])) is True
    params["to"] = stamp(datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2))
    params["granularity"] = "hour"
    params["groupBy"] = "resource"
    final = report(owner, path, **params)
    time.sleep(1.1)
    assert report(owner, path, **params)["total"] == final["total"]
    seconds = Decimal(final["total"]["quantities"]["vcpu"]) / 2
    assert seconds >= 2
    assert Decimal(final["total"]["quantities"]["memory"]) == seconds * 4
    assert Decimal(final["total"]["amount"]) == seconds * Decimal("0.0024")
    audit = db.read(lambda s: ledger.audit(s, at=datetime.now(UTC), tenant_id=tenant_id(db, ns)))
    assert audit.ok and audit.billed_seconds == audit.held_seconds == int(seconds)

    # CSV has the same rows as JSON
    per_second = {**params, "granularity": "second", "groupBy": "resource"}
    as_json = report(owner, path, **per_second)["items"]
    as_csv = owner.get(path, params=per_second, headers={"Accept": "text/csv"})
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert len(rows) == len(as_json) > 0
    for row, item in zip(rows, as_json, strict=True):
        (resource, quantity) = next(iter(item["quantities"].items()))
        unit = "vCPU-s" if resource == "vcpu" else "GiB-s"
        assert (row["start"], row["resource"], row["amount"]) == (
            item["start"],
            item["resource"],
            item["amount"],
        )
        assert row[f"{resource} ({unit})"] == quantity

    # the tenant-wide report sees it; another tenant sees none of it, here or anywhere
    assert report(owner, f"{BASE}/usage", **params)["total"] == final["total"]
    assert report(other, f"{BASE}/usage", **params)["items"] == []
    assert other.get(path, params=params).status_code == 403
    assert report(admin, f"{BASE}/usage", tenant=ns, **params)["total"] == final["total"]
    assert other.get(f"{BASE}/usage", params={"tenant": ns}).status_code == 400


def tenant_id(db, name: str) -> int:
    return db.read(lambda s: s.scalar(select(Tenant.id).where(Tenant.name == name)))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"granularity": "week"}, "granularity"),
        ({"groupBy": "pod,colour"}, "groupBy"),
        ({"groupBy": "pod,pod"}, "groupBy"),
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-01-01T00:00:00"}, "from"),
        ({"from": "2026-01-01"}, "from"),  # a date is not an RFC 3339 time
        ({"from": "1-01-01T00:00:00Z"}, "from"),  # four-digit years
        ({"to": "20260101T000000Z"}, "to"),
        ({"groupBy": ",,,"}, "groupBy"),  # no empty terms
        ({"groupBy": "pod,,resource"}, "groupBy"),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
        ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
        (
            {"from": "2026-01-01T00:00:00Z", "to": "2026-01-09T00:00:00Z", "granularity": "second"},
            "to",
        ),
    ],
)
def test_a_bad_report_query_names_the_parameter(tenant, params, field) -> None:
    response = tenant.get(f"{BASE}/namespaces/{tenant.tenant}/usage", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["details"]["causes"][0]["field"] == field


def test_a_named_report_is_grouped_by_its_name(tenant) -> None:
    """`kubectl get usage workload` asks for .../usage/workload: the name is the grouping."""
    path = f"{BASE}/namespaces/{tenant.tenant}/usage"
    window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}
    assert report(tenant, f"{path}/workload", **window)["groupBy"] == ["workload"]
    assert report(tenant, f"{path}/pod+resource", **window)["groupBy"] == ["pod", "resource"]
    assert report(tenant, f"{BASE}/usage/namespace", **window)["groupBy"] == ["namespace"]
    agreed = report(tenant, f"{path}/workload", groupBy="workload", **window)
    assert agreed["groupBy"] == ["workload"]
    unknown = tenant.get(f"{path}/colour", params=window)
    assert unknown.status_code == 400
    assert unknown.json()["details"]["causes"][0]["field"] == "groupBy"
    assert "workload" in unknown.json()["message"]  # what is accepted
    disagree = tenant.get(f"{path}/workload", params={**window, "groupBy": "pod"})
    assert disagree.status_code == 400 and "disagree" in disagree.json()["message"]
    assert tenant.get(f"{path}/{'w' * 129}", params=window).status_code in (400, 422)


def test_a_report_of_year_one_echoes_four_digit_years(tenant) -> None:
    params = {"from": "0001-01-01T00:00:00Z", "to": "0001-01-02T00:00:00Z", "groupBy": ""}
    got = report(tenant, f"{BASE}/namespaces/{tenant.tenant}/usage", **params)
    assert (got["from"], got["to"]) == ("0001-01-01T00:00:00Z", "0001-01-02T00:00:00Z")
    assert got["items"] == [] and got["groupBy"] == []


@pytest.mark.parametrize(
    ("accept", "status", "media"),
    [
        ("text/csv;q=0", 406, None),  # q=0: not acceptable
        ("text/csv;q=0, application/json", 200, "application/json"),
        ("application/json;q=0.5, text/csv", 200, "text/csv"),
        ("text/*", 200, "text/csv"),
        ("image/png", 406, None),
        ("*/*", 200, "application/json"),
    ],
)
def test_a_report_is_written_as_the_client_accepts(tenant, accept, status, media) -> None:
    response = tenant.get(f"{BASE}/namespaces/{tenant.tenant}/usage", headers={"Accept": accept})
    assert response.status_code == status, response.text
    if media is not None:
        assert response.headers["content-type"].startswith(media)
    else:
        assert response.json()["reason"] == "NotAcceptable"


def test_statements_of_a_tenant_open_and_closed(server, admin, make_tenant) -> None:
    owner, other = make_tenant("bs"), make_tenant("bz")
    db = server.services.db
    active_price(admin, vcpu="36", memory="3.6")  # 0.01 per vCPU-s, 0.001 per GiB-s
    pod = bound_pod(owner, admin, "web", cpu="1", memory="2Gi")
    ns = owner.tenant
    time.sleep(1.5)
    today = datetime.now(UTC).date()
    path = f"{BASE}/namespaces/{ns}/statements"

    listed = owner.get(path).json()
    assert listed["kind"] == "StatementList"
    (open_day,) = [s for s in listed["items"] if s["metadata"]["name"] == today.isoformat()]
    assert open_day["status"]["phase"] == "Provisional"
    lines = open_day["status"]["lines"]
    assert {(line["kind"], line["resource"]) for line in lines} == {
        ("usage", "vcpu"),
        ("usage", "memory"),
    }
    owed = sum(Decimal(line["amount"]) for line in lines if line["owed"])
    assert Decimal(open_day["status"]["total"]) == owed > 0
    table = owner.get(path, headers=TABLE).json()
    assert table["rows"][0]["cells"][1] == "Provisional"
    # across namespaces: the same statements, for the tenant and for the admin
    across = owner.get(f"{BASE}/statements").json()["items"]
    assert [s["metadata"]["name"] for s in across] == [
        s["metadata"]["name"] for s in listed["items"]
    ]
    assert open_day["metadata"]["name"] in {
        s["metadata"]["name"]
        for s in admin.get(f"{BASE}/statements").json()["items"]
        if s["metadata"]["namespace"] == ns
    }
    assert all(
        s["metadata"]["namespace"] == other.tenant
        for s in other.get(f"{BASE}/statements").json()["items"]
    )
    # statements are the tenant's: another tenant is refused, its own namespaces have none
    assert other.get(path).status_code == 403
    assert other.get(f"{path}/{today.isoformat()}").status_code == 403
    assert other.get(f"{BASE}/namespaces/{other.tenant}/statements").json()["items"] == []
    assert owner.get(f"{path}/not-a-day").status_code == 404
    assert owner.get(f"{path}/{(today + timedelta(days=3)).isoformat()}").status_code == 404

    # the day is over (closed as housekeeping does after midnight): the statement is final
    tid = tenant_id(db, ns)
    closing = datetime.combine(today + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    db.write(
        lambda s: ledger.close_day(
            s, tenant_id=tid, day=today, at=closing, currency="USD", minor_digits=2
        )
    )
    closed = owner.get(f"{path}/{today.isoformat()}").json()
    assert closed["status"]["phase"] == "Closed" and closed["metadata"]["uid"]
    assert Decimal(closed["status"]["total"]) >= Decimal(open_day["status"]["total"])
    # more usage of that day, recorded after it closed, never changes the closed statement
    assert owner.delete(f"/api/v1/namespaces/{ns}/pods/web").status_code == 200
    assert db.write(lambda s: pods.finalize(s, uid=pod["metadata"]["uid"])) is True
    assert owner.get(f"{path}/{today.isoformat()}").json() == closed
    assert any(
        s["metadata"]["name"] == today.isoformat()
        for s in admin.get(f"{BASE}/statements").json()["items"]
    )
    assert all(
        s["metadata"]["namespace"] == ns for s in owner.get(f"{BASE}/statements").json()["items"]
    )
    closed_count = db.read(
        lambda s: s.scalar(
            select(func.count()).select_from(Statement).where(Statement.tenant_id == tid)
        )
    )
    assert closed_count == 1


def test_a_commitment_plan_starts_tomorrow_rises_today_and_lowers_tomorrow(
    server, admin, make_tenant
) -> None:
    owner, other = make_tenant("bc"), make_tenant("by")
    db = server.services.db
    ns = owner.tenant
    path = f"{BASE}/namespaces/{ns}/commitments"
    today = datetime.now(UTC).date()
    tomorrow = (today + timedelta(days=1)).isoformat()
    body = {"metadata": {"name": "daily"}, "spec": {"amountPerDay": "100.00"}}

    created = owner.post(path, json=body)
    assert created.status_code == 201, created.text
    status = created.json()["status"]
    assert status["activeAmountPerDay"] == "0.00"  # a new plan starts at the next day boundary
    assert status["nextChange"] == {"day": tomorrow, "amountPerDay": "100.00"}
    again = owner.post(path, json={**body, "metadata": {"name": "second"}})
    assert again.status_code == 409 and "already has" in again.json()["message"]

    # a lowering counts from tomorrow too; the later change of a day wins
    lowered = owner.patch(f"{path}/daily", json={"spec": {"amountPerDay": "40"}}, headers=MERGE)
    assert lowered.status_code == 200, lowered.text
    assert lowered.json()["spec"]["amountPerDay"] == "40.00"
    assert lowered.json()["status"]["nextChange"] == {"day": tomorrow, "amountPerDay": "40.00"}

    # bad amounts are refused and write nothing
    terms = db.read(lambda s: s.scalar(select(func.count()).select_from(CommitmentTerm)))
    for amount in ("-5", "0", "1e12", "abc", "1.234", True):
        bad = owner.patch(f"{path}/daily", json={"spec": {"amountPerDay": amount}}, headers=MERGE)
        # a value of the wrong type is a 400, as for every kind; a bad amount a 422
        assert bad.status_code == (400 if amount is True else 422), (amount, bad.text)
        assert bad.json()["details"]["causes"][0]["field"] == "spec.amountPerDay"
    assert db.read(lambda s: s.scalar(select(func.count()).select_from(CommitmentTerm))) == terms

    # a plan active today may be raised today (the raise counts for the whole day)
    tid = tenant_id(db, ns)
    db.write(
        lambda s: s.execute(
            CommitmentTerm.__table__.insert().values(
                tenant_id=tid, effective_day=today, amount_minor=2000, recorded_at=datetime.now(UTC)
            )
        )
    )
    raised = owner.patch(f"{path}/daily", json={"spec": {"amountPerDay": "150"}}, headers=MERGE)
    assert raised.json()["status"]["activeAmountPerDay"] == "150.00"
    assert raised.json()["status"].get("nextChange") is None

    # tenants see and change only their own
    assert other.get(path).status_code == 403
    assert other.get(f"{BASE}/commitments").json()["items"] == []
    assert [c["metadata"]["name"] for c in owner.get(f"{BASE}/commitments").json()["items"]] == [
        "daily"
    ]
    table = owner.get(f"{path}/daily", headers=TABLE).json()
    assert table["rows"][0]["cells"][:3] == ["daily", "150.00 USD", "150.00"]

    # ending it: today's commitment is still owed, nothing from tomorrow
    ended = owner.delete(f"{path}/daily")
    assert ended.status_code == 200
    assert ended.json()["status"]["nextChange"] == {"day": tomorrow, "amountPerDay": "0.00"}
    assert owner.get(f"{path}/daily").status_code == 404
    day = date.fromisoformat(tomorrow)
    terms_now = db.read(lambda s: ledger.commitment_terms(s, tid))
    from billing.commitments import amount_on

    assert amount_on(today, terms_now) == 15000 and amount_on(day, terms_now) == 0


def tessera(server, tmp_path, *args: str):
    """`tessera ARGS` on the server's database, in this process."""
    from typer.testing import CliRunner

    from app.cli import cli

    url = server.services.db.url.render_as_string(hide_password=False)
    return CliRunner().invoke(
        cli, list(args), env={"TESSERA_DATA_DIR": str(tmp_path), "TESSERA_DATABASE_URL": url}
    )


def test_the_usage_statement_and_audit_commands_agree_with_the_api(
    server, admin, make_tenant, tmp_path
) -> None:
    owner = make_tenant("bc")
    db = server.services.db
    ns = owner.tenant
    active_price(admin, vcpu="3.6", memory="0.36")
    start = datetime.now(UTC).replace(microsecond=0)
    pod = bound_pod(owner, admin, "etl", cpu="1", memory="2Gi")
    time.sleep(1.2)
    assert owner.delete(f"/api/v1/namespaces/{ns}/pods/etl").status_code == 200
    assert db.write(lambda s: pods.finalize(s, uid=pod["metadata"]["uid"])) is True
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    window = ["--from", stamp(start), "--to", stamp(end), "--tenant", ns]
    params = {
        "from": stamp(start),
        "to": stamp(end),
        "granularity": "second",
        "groupBy": "resource",
    }
    api = report(owner, f"{BASE}/usage", **params)

    # CSV and JSON from the command: the API's rows and total
    as_csv = tessera(server, tmp_path, "usage", *window, "--granularity", "second", "-o", "csv")
    assert as_csv.exit_code == 0, as_csv.output
    api_csv = owner.get(f"{BASE}/usage", params=params, headers={"Accept": "text/csv"}).text
    assert as_csv.stdout == api_csv
    as_json = tessera(server, tmp_path, "usage", *window, "--granularity", "second", "-o", "json")
    document = json.loads(as_json.stdout)
    assert (
        document["items"] == api["items"] and document["total"]["amount"] == api["total"]["amount"]
    )

    # the table and the plot: spend per hour by resource, a real PNG
    plot = tmp_path / "spend.png"
    table = tessera(server, tmp_path, "usage", *window, "--group-by", "pod", "--plot", str(plot))
    assert table.exit_code == 0, table.output
    assert f"{ns}/etl" in table.stdout and api["total"]["amount"] in table.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000

    # one pod's usage, by name
    one = tessera(
        server, tmp_path, "usage", *window, "--namespace", ns, "--pod", "etl", "-o", "json"
    )
    assert json.loads(one.stdout)["total"] == document["total"]
    none = tessera(
        server, tmp_path, "usage", *window, "--namespace", ns, "--pod", "other", "-o", "json"
    )
    assert json.loads(none.stdout)["items"] == []
    assert "--namespace" in tessera(server, tmp_path, "usage", "--pod", "etl").stderr

    # a bad query or an unknown tenant: one line that names it, exit code 1
    bad = tessera(server, tmp_path, "usage", "--granularity", "week")
    assert bad.exit_code == 1 and "granularity" in bad.stderr
    unknown = tessera(server, tmp_path, "statement", "no-such-tenant")
    assert unknown.exit_code == 1 and "no-such-tenant" in unknown.stderr

    # today's statement, provisional, with the API's total
    api_statement = owner.get(f"{BASE}/namespaces/{ns}/statements/{start.date()}").json()
    shown = tessera(server, tmp_path, "statement", ns, start.date().isoformat())
    assert shown.exit_code == 0, shown.output
    assert "Provisional" in shown.stdout and api_statement["status"]["total"] in shown.stdout
    listed = json.loads(tessera(server, tmp_path, "statement", ns, "-o", "json").stdout)
    assert api_statement in listed

    # the audit: complete, until a usage event goes missing
    audit = tessera(server, tmp_path, "billing", "audit", "--tenant", ns)
    assert audit.exit_code == 0 and "complete" in audit.stdout, audit.output
    uid = pod["metadata"]["uid"]
    db.write(
        lambda s: s.execute(
            delete(UsageEvent).where(UsageEvent.pod_uid == uid, UsageEvent.kind == "stop")
        )
    )
    broken = tessera(server, tmp_path, "billing", "audit", "--tenant", ns)
    assert broken.exit_code == 1 and "problem" in broken.stderr, broken.output


def test_one_pods_usage_by_name(server, admin, make_tenant) -> None:
    owner = make_tenant("bp")
    ns = owner.tenant
    active_price(admin, vcpu="3.6", memory="0.36")
    start = datetime.now(UTC).replace(microsecond=0)
    bound_pod(owner, admin, "small", cpu="1", memory="2Gi")
    bound_pod(owner, admin, "large", cpu="4", memory="8Gi")
    time.sleep(1.2)
    path = f"{BASE}/namespaces/{ns}/usage"
    params = {"from": stamp(start), "granularity": "second", "groupBy": "pod,resource"}
    both = report(owner, path, **params)
    assert {r["pod"] for r in both["items"]} == {f"{ns}/small", f"{ns}/large"}
    small = report(owner, path, pod="small", **params)
    assert small["items"] and {r["pod"] for r in small["items"]} == {f"{ns}/small"}
    assert all(r["quantities"] in ({"vcpu": "1"}, {"memory": "2"}) for r in small["items"]), small[
        "items"
    ]
    assert report(owner, path, pod="never-ran", **params)["items"] == []
    long_name = owner.get(path, params={"pod": "x" * 300})
    assert long_name.status_code == 400, long_name.text
    assert long_name.json()["details"]["causes"][0]["field"] == "pod"
