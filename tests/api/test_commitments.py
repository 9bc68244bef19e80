"""billing.tessera.io Commitments on the generic registry, through real HTTP on both databases:
every verb of the store (a tenant has one plan, so the registry's matrix, which makes several
objects of a kind, leaves them to this module), and what each does to the plan's terms, which
billing rates with: a dry run of every write writes none, a namespace's deletion ends the plan
and every watcher sees DELETED, a finalizer keeps the plan until it goes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import func, select

from app.db.models import CommitmentTerm
from billing import ledger
from billing.commitments import amount_on
from tests.api.test_billing_api import tenant_id
from tests.api.test_registry import APPLY, JSON_MERGE, JSON_PATCH, STRATEGIC, TABLE, events

BILLING = "/apis/billing.tessera.io/v1"


def plan(name: str = "plan", amount: Any = "25", labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "billing.tessera.io/v1",
        "kind": "Commitment",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"amountPerDay": amount},
    }


def terms(db: Any) -> int:
    return db.read(lambda s: s.scalar(select(func.count()).select_from(CommitmentTerm)))


def tomorrow() -> str:
    return (datetime.now(UTC).date() + timedelta(days=1)).isoformat()


def test_every_verb_of_the_store(server, tenant) -> None:
    url = f"{BILLING}/namespaces/{tenant.tenant}/commitments"
    start = tenant.get(url).json()["metadata"]["resourceVersion"]
    created = tenant.post(url, json=plan(amount=25, labels={"tier": "a"}))  # a whole number too
    assert created.status_code == 201, created.text
    made = created.json()
    assert made["spec"] == {"amountPerDay": "25.00"}
    assert made["status"]["nextChange"] == {"day": tomorrow(), "amountPerDay": "25.00"}
    second = tenant.post(url, json=plan("second"))
    assert second.status_code == 409 and "already has the plan" in second.json()["message"]
    assert f"{tenant.tenant}/plan" in second.json()["message"]

    got = tenant.get(f"{url}/plan").json()
    assert got["metadata"]["uid"] == made["metadata"]["uid"] and got["status"] == made["status"]
    listed = tenant.get(url, params={"labelSelector": "tier=a", "limit": 1}).json()
    assert [o["metadata"]["name"] for o in listed["items"]] == ["plan"]
    by_field = tenant.get(url, params={"fieldSelector": "metadata.name=other"}).json()
    assert by_field["items"] == []
    table = tenant.get(url, headers=TABLE).json()
    assert table["rows"][0]["cells"][:2] == ["plan", "25.00 USD"]

    # the four patch formats, and PUT (new: conditional on resourceVersion)
    merged = tenant.patch(f"{url}/plan", json={"spec": {"amountPerDay": "30"}}, headers=JSON_MERGE)
    assert merged.status_code == 200 and merged.json()["spec"]["amountPerDay"] == "30.00"
    same = tenant.patch(f"{url}/plan", json={"spec": {"amountPerDay": "30.0"}}, headers=JSON_MERGE)
    assert (
        same.json()["metadata"]["resourceVersion"] == merged.json()["metadata"]["resourceVersion"]
    )
    strategic = tenant.patch(
        f"{url}/plan", json={"metadata": {"labels": {"b": "c"}}}, headers=STRATEGIC
    )
    assert strategic.json()["metadata"]["labels"] == {"tier": "a", "b": "c"}
    jsonpatch = tenant.patch(
        f"{url}/plan",
        json=[{"op": "replace", "path": "/spec/amountPerDay", "value": "35"}],
        headers=JSON_PATCH,
    )
    assert jsonpatch.status_code == 200 and jsonpatch.json()["spec"]["amountPerDay"] == "35.00"
    applied = tenant.patch(
        f"{url}/plan?fieldManager=kubectl",
        content=orjson.dumps(plan(amount="40")).decode(),
        headers=APPLY,
    )
    assert applied.status_code == 200, applied.text
    assert applied.json()["spec"]["amountPerDay"] == "40.00"
    assert applied.json()["status"]["nextChange"]["amountPerDay"] == "40.00"
    current = tenant.get(f"{url}/plan").json()
    replaced = tenant.put(f"{url}/plan", json={**current, "spec": {"amountPerDay": "45"}})
    assert replaced.status_code == 200 and replaced.json()["spec"]["amountPerDay"] == "45.00"
    stale = tenant.put(f"{url}/plan", json={**current, "spec": {"amountPerDay": "50"}})
    assert stale.status_code == 409 and "has been modified" in stale.json()["message"]
    bad = tenant.put(f"{url}/plan", json={**replaced.json(), "spec": {"amountPerDay": "1.234"}})
    assert bad.status_code == 422
    assert bad.json()["details"]["causes"][0]["field"] == "spec.amountPerDay"

    # a new plan starts tomorrow, and the latest change of a day wins
    tid = tenant_id(server.services.db, tenant.tenant)
    day = datetime.now(UTC).date() + timedelta(days=1)
    owed = server.services.db.read(lambda s: ledger.commitment_terms(s, tid))
    assert amount_on(day, owed) == 4500 and amount_on(day - timedelta(days=1), owed) == 0

    gone = tenant.delete(f"{url}/plan")
    assert gone.status_code == 200
    # the answer's status shows the end: the plan due tomorrow is no longer due
    assert "nextChange" not in gone.json()["status"]
    assert tenant.get(f"{url}/plan").status_code == 404
    seen = events(tenant, url, start)
    assert seen[0] == ("ADDED", "plan") and seen[-1] == ("DELETED", "plan")
    assert seen.count(("MODIFIED", "plan")) == 5  # the same amount again changed nothing

    # deletecollection by label: a new plan can be made once the old one is gone
    assert tenant.post(url, json=plan("again", labels={"x": "y"})).status_code == 201
    kept = tenant.delete(url, params={"labelSelector": "x=z"}).json()["items"]
    assert kept == [] and tenant.get(f"{url}/again").status_code == 200
    removed = tenant.delete(url, params={"labelSelector": "x=y"}).json()["items"]
    assert [o["metadata"]["name"] for o in removed] == ["again"]


def test_dry_run_of_every_write_writes_nothing(server, tenant) -> None:
    db = server.services.db
    url = f"{BILLING}/namespaces/{tenant.tenant}/commitments"
    before = terms(db)
    assert tenant.post(f"{url}?dryRun=All", json=plan()).status_code == 201
    assert tenant.get(f"{url}/plan").status_code == 404 and terms(db) == before
    applied_new = tenant.patch(
        f"{url}/plan?dryRun=All&fieldManager=m",
        content=orjson.dumps(plan()).decode(),
        headers=APPLY,
    )
    assert applied_new.status_code == 201 and terms(db) == before
    assert tenant.get(f"{url}/plan").status_code == 404

    kept = tenant.post(url, json=plan()).json()
    start, before = kept["metadata"]["resourceVersion"], terms(db)
    for answer in (
        tenant.patch(
            f"{url}/plan?dryRun=All", json={"spec": {"amountPerDay": "99"}}, headers=JSON_MERGE
        ),
        tenant.patch(
            f"{url}/plan?dryRun=All&fieldManager=m",
            content=orjson.dumps(plan(amount="98")).decode(),
            headers=APPLY,
        ),
        tenant.put(f"{url}/plan?dryRun=All", json={**kept, "spec": {"amountPerDay": "97"}}),
        tenant.delete(f"{url}/plan?dryRun=All"),
        tenant.request("DELETE", f"{url}/plan", json={"dryRun": ["All"]}),
        tenant.delete(f"{url}?dryRun=All"),
    ):
        assert answer.status_code == 200, answer.text
    now = tenant.get(f"{url}/plan").json()
    assert now["spec"] == kept["spec"] and now["metadata"] == kept["metadata"]
    assert terms(db) == before
    assert events(tenant, url, start) == []


def test_a_finalizer_keeps_the_plan_until_it_goes(server, tenant) -> None:
    db = server.services.db
    url = f"{BILLING}/namespaces/{tenant.tenant}/commitments"
    made = tenant.post(url, json=plan()).json()
    wrong = tenant.request("DELETE", f"{url}/plan", json={"preconditions": {"uid": "other"}})
    assert wrong.status_code == 409 and "Precondition failed" in wrong.json()["message"]
    tenant.patch(
        f"{url}/plan", json={"metadata": {"finalizers": ["example.com/hold"]}}, headers=JSON_MERGE
    )
    before = terms(db)
    marked = tenant.request(
        "DELETE", f"{url}/plan", json={"preconditions": {"uid": made["metadata"]["uid"]}}
    )
    assert marked.status_code == 200 and marked.json()["metadata"]["deletionTimestamp"]
    assert terms(db) == before  # still the plan: it has not gone
    released = tenant.patch(
        f"{url}/plan", json={"metadata": {"finalizers": None}}, headers=JSON_MERGE
    )
    assert released.status_code == 200
    assert tenant.get(f"{url}/plan").status_code == 404
    tid = tenant_id(db, tenant.tenant)
    day = datetime.now(UTC).date() + timedelta(days=1)
    assert amount_on(day, db.read(lambda s: ledger.commitment_terms(s, tid))) == 0


def test_a_namespace_deletion_ends_the_plan_and_watchers_see_it(server, tenant, admin) -> None:
    """Before, the namespace's database cascade removed the plan's row: no watcher saw it go,
    and its terms went on (the tenant owed the plan with no plan to change)."""
    db = server.services.db
    ns = f"{tenant.tenant}-plan"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    start = tenant.get(f"{BILLING}/commitments").json()["metadata"]["resourceVersion"]
    url = f"{BILLING}/namespaces/{ns}/commitments"
    assert tenant.post(url, json=plan()).status_code == 201
    assert tenant.delete(f"/api/v1/namespaces/{ns}").status_code == 200
    for api in (tenant, admin):
        seen = events(api, f"{BILLING}/commitments", start)
        assert seen == [("ADDED", "plan"), ("DELETED", "plan")], seen
    tid = tenant_id(db, tenant.tenant)
    day = datetime.now(UTC).date() + timedelta(days=1)
    assert amount_on(day, db.read(lambda s: ledger.commitment_terms(s, tid))) == 0
    # and the tenant may make a plan again, in its own namespace
    again = tenant.post(f"{BILLING}/namespaces/{tenant.tenant}/commitments", json=plan())
    assert again.status_code == 201, again.text


def test_a_plan_belongs_to_a_tenant_and_validation_names_the_field(tenant, admin) -> None:
    outside = admin.post(f"{BILLING}/namespaces/default/commitments", json=plan())
    assert outside.status_code == 422 and "belongs to a tenant" in outside.text
    url = f"{BILLING}/namespaces/{tenant.tenant}/commitments"
    strict = tenant.post(f"{url}?fieldValidation=Strict", json={**plan(), "surprise": 1})
    assert strict.status_code == 400 and 'unknown field "surprise"' in strict.json()["message"]
    for amount in ("-5", "0", "1e12", "abc", "1.234"):
        bad = tenant.post(url, json=plan(amount=amount))
        assert bad.status_code == 422, (amount, bad.text)
        assert bad.json()["details"]["causes"][0]["field"] == "spec.amountPerDay"
    status = tenant.post(url, json={**plan(), "status": {"activeAmountPerDay": "1000"}}).json()
    assert status["status"]["activeAmountPerDay"] == "0.00"  # the server's, not the client's
