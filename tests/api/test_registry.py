"""The generic registry (app/registry): the same verbs with the same semantics for every kind
it keeps, through real HTTP on both databases.

One table names, for each registered kind, an object to create and a change to make; every test
of the verb matrix runs over each row. A kind added to the registry without a row here (or a
module of its own, `OWN_TESTS`) fails `test_every_registered_kind_is_in_the_matrix`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from sqlalchemy import text

from app.registry.kinds import KINDS
from app.registry.strategy import Strategy

JSON_MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}


@dataclass(frozen=True)
class Row:
    """One kind of the matrix: how to make an object, and a change to its content (`read` shows
    the content a change touches, as the API answers it)."""

    make: Callable[[str, dict[str, str]], dict[str, Any]]
    change: dict[str, Any]  # a merge patch
    read: Callable[[dict[str, Any]], Any]
    admin_writes: bool = False  # tenants only read it (a ResourceQuota): the admin writes
    # tenants may not even read it (a Lease: node agents' and the control plane's): the admin
    # reads and writes it, and a tenant is refused in its own namespaces too
    admin_only: bool = False
    # The object as reads show it, from the create's answer (which may hold what it alone
    # shows: a Callback's signing secret).
    as_read: Callable[[dict[str, Any]], dict[str, Any]] = lambda obj: obj


def writer(kind: Strategy, tenant: Any, admin: Any) -> Any:
    """Who writes the kind's objects in the tenant's namespace in these tests."""
    row = MATRIX[(kind.group, kind.resource)]
    return admin if row.admin_writes or row.admin_only else tenant


def reader(kind: Strategy, tenant: Any, admin: Any) -> Any:
    """Who reads and watches the kind's objects in the tenant's namespace in these tests."""
    return admin if MATRIX[(kind.group, kind.resource)].admin_only else tenant


def without_secret(obj: dict[str, Any]) -> dict[str, Any]:
    status = {k: v for k, v in obj["status"].items() if k != "signingSecret"}
    return {**obj, "status": status}


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def workload(kind: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A ReplicaSet or Deployment of one pod (no controller runs beside these tests' server)."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"run": name}},
            "template": {
                "metadata": {"labels": {"run": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }


MATRIX: dict[tuple[str, str], Row] = {
    ("", "configmaps"): Row(
        make=lambda name, labels: {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels},
            "data": {"mode": "fast"},
        },
        change={"data": {"mode": "slow"}},
        read=lambda obj: obj.get("data"),
    ),
    ("", "secrets"): Row(
        make=lambda name, labels: {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": labels},
            "data": {"token": _b64("first")},
        },
        change={"data": {"token": _b64("second")}},
        read=lambda obj: obj.get("data"),
    ),
    ("", "resourcequotas"): Row(
        make=lambda name, labels: {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name, "labels": labels},
            "spec": {"hard": {"pods": "5", "requests.cpu": "4"}},
        },
        change={"spec": {"hard": {"pods": "6"}}},
        read=lambda obj: obj["spec"]["hard"]["pods"],
        admin_writes=True,
    ),
    ("", "services"): Row(
        make=lambda name, labels: {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "labels": labels},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        change={"spec": {"selector": {"app": "other"}}},
        read=lambda obj: obj["spec"]["selector"],
    ),
    ("discovery.k8s.io", "endpointslices"): Row(
        make=lambda name, labels: {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": labels},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": True}}],
            "ports": [{"port": 8080, "protocol": "TCP"}],
        },
        change={"endpoints": [{"addresses": ["10.1.0.2"], "conditions": {"ready": True}}]},
        read=lambda obj: obj["endpoints"],
        admin_writes=True,
    ),
    ("batch", "jobs"): Row(
        make=lambda name, labels: {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "suspend": True,  # no controller makes its pods in these tests
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            },
        },
        change={"spec": {"parallelism": 2}},
        read=lambda obj: obj["spec"]["parallelism"],
    ),
    ("batch", "cronjobs"): Row(
        make=lambda name, labels: {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "schedule": "0 3 * * *",
                "suspend": True,
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "OnFailure",
                                "containers": [{"name": "main", "image": "busybox"}],
                            }
                        }
                    }
                },
            },
        },
        change={"spec": {"schedule": "*/5 * * * *"}},
        read=lambda obj: obj["spec"]["schedule"],
    ),
    ("jobset.x-k8s.io", "jobsets"): Row(
        make=lambda name, labels: {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "suspend": True,
                "replicatedJobs": [
                    {
                        "name": "workers",
                        "replicas": 2,
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "main", "image": "busybox"}],
                                    }
                                }
                            }
                        },
                    }
                ],
            },
        },
        change={"spec": {"suspend": False}},
        read=lambda obj: obj["spec"]["suspend"],
    ),
    ("apps", "replicasets"): Row(
        make=lambda name, labels: workload("ReplicaSet", name, labels),
        change={"spec": {"replicas": 2}},
        read=lambda obj: obj["spec"]["replicas"],
    ),
    ("apps", "deployments"): Row(
        make=lambda name, labels: workload("Deployment", name, labels),
        change={"spec": {"replicas": 2}},
        read=lambda obj: obj["spec"]["replicas"],
    ),
    ("tessera.io", "callbacks"): Row(
        make=lambda name, labels: {
            "apiVersion": "tessera.io/v1",
            "kind": "Callback",
            "metadata": {"name": name, "labels": labels},
            "spec": {"url": "https://hooks.example.com/tessera", "events": ["PodFinished"]},
        },
        change={"spec": {"events": ["PodFinished", "GPUFault"]}},
        read=lambda obj: obj["spec"]["events"],
        as_read=without_secret,
    ),
    ("tessera.io", "podgroups"): Row(
        make=lambda name, labels: {
            "apiVersion": "tessera.io/v1",
            "kind": "PodGroup",
            "metadata": {"name": name, "labels": labels},
            "spec": {"minMember": 2, "topology": {"required": "node"}},
        },
        change={"spec": {"minMember": 3}},
        read=lambda obj: obj["spec"]["minMember"],
    ),
    ("scheduling.x-k8s.io", "podgroups"): Row(
        make=lambda name, labels: {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "labels": labels},
            "spec": {"minMember": 2, "scheduleTimeoutSeconds": 30},
        },
        change={"spec": {"minMember": 3}},
        read=lambda obj: obj["spec"]["minMember"],
    ),
    ("coordination.k8s.io", "leases"): Row(
        make=lambda name, labels: {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": "2026-12-04T10:00:00.000000Z",
            },
        },
        change={"spec": {"holderIdentity": "another"}},
        read=lambda obj: obj["spec"]["holderIdentity"],
        admin_only=True,
    ),
}

# Kinds whose objects the matrix cannot make several of, each tested by a module of its own
# over the same verbs: a tenant has one Commitment.
OWN_TESTS = {("billing.tessera.io", "commitments"): "tests/api/test_commitments.py"}
MATRIX_KINDS = [k for k in KINDS if (k.group, k.resource) not in OWN_TESTS]
KIND_IDS = [f"{k.resource}.{k.group}" if k.group else k.resource for k in MATRIX_KINDS]


def base(kind: Strategy, namespace: str) -> str:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else "/api/v1"
    return f"{prefix}/namespaces/{namespace}/{kind.resource}"


def everywhere(kind: Strategy) -> str:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else "/api/v1"
    return f"{prefix}/{kind.resource}"


def events(api: Any, url: str, since: str) -> list[tuple[str, str]]:
    """The (type, name) of every event a watch from `since` sees before it times out."""
    sep = "&" if "?" in url else "?"
    answer = api.get(f"{url}{sep}watch=true&resourceVersion={since}&timeoutSeconds=1")
    assert answer.status_code == 200, answer.text
    lines = [orjson.loads(line) for line in answer.text.splitlines() if line.strip()]
    return [(e["type"], e["object"]["metadata"]["name"]) for e in lines]


def test_every_registered_kind_is_in_the_matrix() -> None:
    assert {(k.group, k.resource) for k in KINDS} == set(MATRIX) | set(OWN_TESTS)


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_create_get_list_watch_patch_delete(kind: Strategy, tenant, admin) -> None:
    row = MATRIX[(kind.group, kind.resource)]
    url = base(kind, tenant.tenant)
    api = writer(kind, tenant, admin)
    see = reader(kind, tenant, admin)
    start = see.get(url).json()["metadata"]["resourceVersion"]

    created = api.post(url, json=row.make("one", {"app": "web"}))
    assert created.status_code == 201, created.text
    obj = row.as_read(created.json())
    assert obj["kind"] == kind.kind and obj["metadata"]["namespace"] == tenant.tenant
    assert obj["metadata"]["uid"] and obj["metadata"]["resourceVersion"]
    again = api.post(url, json=row.make("one", {}))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    assert api.post(url, json=row.make("two", {"app": "db"})).status_code == 201

    got = see.get(f"{url}/one")
    assert got.status_code == 200 and got.json() == obj
    missing = see.get(f"{url}/ghost")
    assert missing.status_code == 404 and "ghost" in missing.json()["message"]

    # list: label and field selectors, pages of one with a continue token
    assert [
        o["metadata"]["name"]
        for o in see.get(url, params={"labelSelector": "app=db"}).json()["items"]
    ] == ["two"]
    by_name = see.get(url, params={"fieldSelector": "metadata.name=one"}).json()["items"]
    assert [o["metadata"]["name"] for o in by_name] == ["one"]
    bad_field = see.get(url, params={"fieldSelector": "spec.nothing=1"})
    assert bad_field.status_code == 400
    first = see.get(url, params={"limit": 1}).json()
    assert [o["metadata"]["name"] for o in first["items"]] == ["one"]
    second = see.get(url, params={"limit": 1, "continue": first["metadata"]["continue"]}).json()
    assert [o["metadata"]["name"] for o in second["items"]] == ["two"]
    assert "continue" not in second["metadata"]
    assert second["kind"] == f"{kind.kind}List"
    table = see.get(url, headers=TABLE).json()
    assert table["kind"] == "Table" and [r["cells"][0] for r in table["rows"]] == ["one", "two"]
    assert [c["name"] for c in table["columnDefinitions"]] == [c[0] for c in kind.columns]

    # the four patch formats
    merged = api.patch(f"{url}/one", json=row.change, headers=JSON_MERGE)
    assert merged.status_code == 200, merged.text
    assert row.read(merged.json()) == row.read({**obj, **row.change})
    assert int(merged.json()["metadata"]["resourceVersion"]) > int(
        obj["metadata"]["resourceVersion"]
    )
    strategic = api.patch(
        f"{url}/one", json={"metadata": {"labels": {"tier": "a"}}}, headers=STRATEGIC
    )
    assert strategic.json()["metadata"]["labels"] == {"app": "web", "tier": "a"}
    jsonpatch = api.patch(
        f"{url}/one",
        json=[{"op": "remove", "path": "/metadata/labels/tier"}],
        headers=JSON_PATCH,
    )
    assert jsonpatch.json()["metadata"]["labels"] == {"app": "web"}
    applied = orjson.dumps({**row.make("one", {"app": "web", "applied": "yes"})}).decode()
    ssa = api.patch(f"{url}/one?fieldManager=tester", content=applied, headers=APPLY)
    assert ssa.status_code == 200, ssa.text
    assert ssa.json()["metadata"]["labels"]["applied"] == "yes"
    assert [m["manager"] for m in ssa.json()["metadata"]["managedFields"]] == ["tester"]
    unapplied = orjson.dumps(row.make("one", {"app": "web"})).decode()
    ssa = api.patch(f"{url}/one?fieldManager=tester", content=unapplied, headers=APPLY)
    assert "applied" not in ssa.json()["metadata"]["labels"]  # no longer applied: removed
    ssa_new = api.patch(
        f"{url}/three?fieldManager=tester",
        content=orjson.dumps(row.make("three", {})).decode(),
        headers=APPLY,
    )
    assert ssa_new.status_code == 201, ssa_new.text
    no_manager = api.patch(f"{url}/one", content=unapplied, headers=APPLY)
    assert no_manager.status_code == 400 and "fieldManager" in no_manager.json()["message"]

    stale_patch = api.patch(
        f"{url}/one",
        json={"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}},
        headers=JSON_MERGE,
    )
    assert stale_patch.status_code == 409, stale_patch.text

    # update: conditional on resourceVersion
    current = see.get(f"{url}/one").json()
    stale = {
        **current,
        "metadata": {**current["metadata"], "resourceVersion": obj["metadata"]["resourceVersion"]},
    }
    conflict = api.put(f"{url}/one", json=stale)
    assert conflict.status_code == 409 and "has been modified" in conflict.json()["message"]
    replaced = api.put(
        f"{url}/one", json={**current, "metadata": {**current["metadata"], "labels": {"v": "2"}}}
    )
    assert replaced.status_code == 200 and replaced.json()["metadata"]["labels"] == {"v": "2"}
    renamed = api.put(
        f"{url}/one", json={**current, "metadata": {**current["metadata"], "name": "other"}}
    )
    assert renamed.status_code == 422

    # delete, and the watch saw every change in order
    gone = api.delete(f"{url}/two")
    assert gone.status_code == 200 and gone.json()["metadata"]["name"] == "two"
    assert see.get(f"{url}/two").status_code == 404
    assert api.delete(f"{url}/two").status_code == 404
    seen = events(see, url, start)
    assert seen[:3] == [("ADDED", "one"), ("ADDED", "two"), ("MODIFIED", "one")]
    assert seen[-1] == ("DELETED", "two")
    assert ("ADDED", "three") in seen
    selected = events(see, f"{url}?labelSelector=app%3Ddb", start)
    assert selected == [("ADDED", "two"), ("DELETED", "two")]


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_dry_run_of_every_write_writes_nothing(kind: Strategy, tenant, admin) -> None:
    row = MATRIX[(kind.group, kind.resource)]
    url = base(kind, tenant.tenant)
    api = writer(kind, tenant, admin)
    see = reader(kind, tenant, admin)
    dry = api.post(f"{url}?dryRun=All", json=row.make("dry", {}))
    assert dry.status_code == 201 and dry.json()["metadata"]["name"] == "dry"
    assert see.get(f"{url}/dry").status_code == 404
    start = see.get(url).json()["metadata"]["resourceVersion"]

    kept = row.as_read(api.post(url, json=row.make("kept", {"app": "x"})).json())
    patched = api.patch(f"{url}/kept?dryRun=All", json=row.change, headers=JSON_MERGE)
    assert patched.status_code == 200 and row.read(patched.json()) != row.read(kept)
    applied = api.patch(
        f"{url}/kept?dryRun=All&fieldManager=m",
        content=orjson.dumps(row.make("kept", {"app": "y"})).decode(),
        headers=APPLY,
    )
    assert applied.status_code == 200 and applied.json()["metadata"]["labels"] == {"app": "y"}
    replaced = api.put(
        f"{url}/kept?dryRun=All", json={**kept, "metadata": {**kept["metadata"], "labels": {}}}
    )
    assert replaced.status_code == 200
    deleted = api.delete(f"{url}/kept?dryRun=All")
    assert deleted.status_code == 200
    in_body = api.request("DELETE", f"{url}/kept", json={"dryRun": ["All"]})
    assert in_body.status_code == 200
    collection = api.delete(f"{url}?dryRun=All")
    assert collection.status_code == 200 and [
        o["metadata"]["name"] for o in collection.json()["items"]
    ] == ["kept"]
    assert see.get(f"{url}/kept").json() == kept
    assert events(see, url, start) == [("ADDED", "kept")]


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_preconditions_finalizers_and_deletecollection(kind: Strategy, tenant, admin) -> None:
    row = MATRIX[(kind.group, kind.resource)]
    url = base(kind, tenant.tenant)
    api = writer(kind, tenant, admin)
    see = reader(kind, tenant, admin)
    made = api.post(url, json=row.make("held", {"group": "a"})).json()
    wrong_uid = api.request(
        "DELETE", f"{url}/held", json={"preconditions": {"uid": "not-this-one"}}
    )
    assert wrong_uid.status_code == 409 and "Precondition failed" in wrong_uid.json()["message"]
    wrong_rv = api.request(
        "DELETE", f"{url}/held", json={"preconditions": {"resourceVersion": "1"}}
    )
    assert wrong_rv.status_code == 409
    assert see.get(f"{url}/held").status_code == 200

    # a finalizer holds the object after its deletion, until it is removed
    api.patch(
        f"{url}/held", json={"metadata": {"finalizers": ["example.com/hold"]}}, headers=JSON_MERGE
    )
    marked = api.request(
        "DELETE", f"{url}/held", json={"preconditions": {"uid": made["metadata"]["uid"]}}
    )
    assert marked.status_code == 200 and marked.json()["metadata"]["deletionTimestamp"]
    still = see.get(f"{url}/held").json()
    assert still["metadata"]["deletionTimestamp"] and still["metadata"]["finalizers"]
    more = api.patch(
        f"{url}/held",
        json={"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}},
        headers=JSON_MERGE,
    )
    assert more.status_code == 422 and "no new finalizers" in more.json()["message"]
    released = api.patch(f"{url}/held", json={"metadata": {"finalizers": None}}, headers=JSON_MERGE)
    assert released.status_code == 200
    assert see.get(f"{url}/held").status_code == 404

    # deletecollection deletes what the selector matches, and nothing else
    for name, group in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        assert api.post(url, json=row.make(name, {"group": group})).status_code == 201
    removed = api.delete(url, params={"labelSelector": "group=a"})
    assert removed.status_code == 200, removed.text
    assert sorted(o["metadata"]["name"] for o in removed.json()["items"]) == ["a1", "a2"]
    assert [o["metadata"]["name"] for o in see.get(url).json()["items"]] == ["b1"]


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_propagation_policies_leave_the_collector_its_finalizer(
    kind: Strategy, tenant, admin
) -> None:
    """Foreground and Orphan (in the query, in DeleteOptions, or as orphanDependents) mark an
    object of a kind with dependents with the finalizer the garbage collector removes once it
    has dealt with them (an object of another kind goes at once); Background deletes at once;
    any other policy is refused, writing nothing."""
    row = MATRIX[(kind.group, kind.resource)]
    url = base(kind, tenant.tenant)
    api = writer(kind, tenant, admin)
    see = reader(kind, tenant, admin)
    for name, how, finalizer in (
        ("fg", {"params": {"propagationPolicy": "Foreground"}}, "foregroundDeletion"),
        ("or", {"json": {"propagationPolicy": "Orphan"}}, "orphan"),
        ("od", {"json": {"orphanDependents": True}}, "orphan"),
    ):
        assert api.post(url, json=row.make(name, {})).status_code == 201
        marked = api.request("DELETE", f"{url}/{name}", **how)
        assert marked.status_code == 200, marked.text
        if not kind.has_dependents:
            assert see.get(f"{url}/{name}").status_code == 404
            continue
        held = see.get(f"{url}/{name}").json()["metadata"]
        assert held["finalizers"] == [finalizer] and held["deletionTimestamp"]
        released = api.patch(
            f"{url}/{name}", json={"metadata": {"finalizers": None}}, headers=JSON_MERGE
        )
        assert released.status_code == 200
        assert see.get(f"{url}/{name}").status_code == 404
    assert api.post(url, json=row.make("bg", {})).status_code == 201
    bad = api.delete(f"{url}/bg", params={"propagationPolicy": "Sideways"})
    assert bad.status_code in (400, 422) and "propagationPolicy" in bad.text
    in_body = api.request("DELETE", f"{url}/bg", json={"propagationPolicy": "Sideways"})
    assert in_body.status_code == 400 and "Orphan, Background, Foreground" in in_body.text
    assert "deletionTimestamp" not in see.get(f"{url}/bg").json()["metadata"]
    gone = api.delete(f"{url}/bg", params={"propagationPolicy": "Background"})
    assert gone.status_code == 200
    assert see.get(f"{url}/bg").status_code == 404


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_tenants_are_isolated(kind: Strategy, make_tenant, admin) -> None:
    row = MATRIX[(kind.group, kind.resource)]
    owner, other = make_tenant(), make_tenant()
    url = base(kind, owner.tenant)
    owner_writes, other_writes = writer(kind, owner, admin), writer(kind, other, admin)
    assert owner_writes.post(url, json=row.make("mine", {})).status_code == 201
    assert (
        other_writes.post(base(kind, other.tenant), json=row.make("theirs", {})).status_code == 201
    )
    for method, path in (
        ("GET", url),
        ("GET", f"{url}/mine"),
        ("POST", url),
        ("PATCH", f"{url}/mine"),
        ("DELETE", f"{url}/mine"),
        ("DELETE", url),
        ("GET", f"{base(kind, 'kube-system')}/mine"),
    ):
        body = row.make("x", {}) if method == "POST" else ({} if method == "PATCH" else None)
        answer = other.request(
            method, path, json=body, headers=JSON_MERGE if method == "PATCH" else None
        )
        if kind.resource == "services" and "kube-system" in path:
            # anyone reads kube-system's Services (`kubectl cluster-info`): there are none
            assert answer.status_code == 404, (method, path, answer.text)
            continue
        assert answer.status_code == 403, (method, path, answer.text)
    every = {o["metadata"]["name"] for o in admin.get(everywhere(kind)).json()["items"]}
    assert {"mine", "theirs"} <= every
    if row.admin_only:  # not even in its own namespaces, nor across them
        assert owner.get(f"{url}/mine").status_code == 403
        assert owner.get(url).status_code == 403
        assert other.get(everywhere(kind)).status_code == 403
        return
    assert [o["metadata"]["name"] for o in other.get(everywhere(kind)).json()["items"]] == [
        "theirs"
    ]
    assert owner.get(f"{url}/mine").status_code == 200


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_field_validation(kind: Strategy, tenant, admin) -> None:
    row = MATRIX[(kind.group, kind.resource)]
    url = base(kind, tenant.tenant)
    api = writer(kind, tenant, admin)
    unknown = {**row.make("strict", {}), "surprise": 1}
    strict = api.post(f"{url}?fieldValidation=Strict", json=unknown)
    assert strict.status_code == 400 and 'unknown field "surprise"' in strict.json()["message"]
    warned = api.post(url, json=unknown)
    assert warned.status_code == 201 and "surprise" in warned.headers["Warning"]
    assert "surprise" not in warned.json()
    wrong_kind = api.post(url, json={**row.make("k", {}), "kind": "Pod"})
    assert wrong_kind.status_code == 400 and kind.kind in wrong_kind.json()["message"]
    bad_name = api.post(url, json=row.make("Not_A_Name", {}))
    assert bad_name.status_code == 422 and "metadata.name" in bad_name.text


@pytest.mark.parametrize("kind", MATRIX_KINDS, ids=KIND_IDS)
def test_namespace_deletion_deletes_through_the_store(kind: Strategy, tenant, admin) -> None:
    """Every watcher of the kind sees DELETED for each object of a deleted namespace."""
    row = MATRIX[(kind.group, kind.resource)]
    see = reader(kind, tenant, admin)
    ns = f"{tenant.tenant}-gone"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    start = see.get(everywhere(kind)).json()["metadata"]["resourceVersion"]
    for name in ("x", "y"):
        assert (
            writer(kind, tenant, admin).post(base(kind, ns), json=row.make(name, {})).status_code
            == 201
        )
    assert tenant.delete(f"/api/v1/namespaces/{ns}").status_code == 200
    assert tenant.get(f"/api/v1/namespaces/{ns}").status_code in (403, 404)
    seen = events(see, everywhere(kind), start)
    assert sorted(e for e in seen if e[0] == "DELETED") == [("DELETED", "x"), ("DELETED", "y")]


def test_a_finalizer_keeps_its_namespace_terminating(tenant) -> None:
    ns = f"{tenant.tenant}-held"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    url = f"/api/v1/namespaces/{ns}/configmaps"
    held = MATRIX[("", "configmaps")].make("held", {})
    held["metadata"]["finalizers"] = ["example.com/hold"]
    assert tenant.post(url, json=held).status_code == 201
    tenant.delete(f"/api/v1/namespaces/{ns}")
    namespace = tenant.get(f"/api/v1/namespaces/{ns}").json()
    assert namespace["status"]["phase"] == "Terminating"
    refused = tenant.post(url, json=MATRIX[("", "configmaps")].make("late", {}))
    assert refused.status_code == 403 and "being terminated" in refused.json()["message"]
    tenant.patch(f"{url}/held", json={"metadata": {"finalizers": None}}, headers=JSON_MERGE)
    assert tenant.get(f"/api/v1/namespaces/{ns}").status_code in (403, 404)


def test_configmap_data_is_bounded_and_immutable(tenant) -> None:
    url = f"/api/v1/namespaces/{tenant.tenant}/configmaps"
    big = tenant.post(
        url, json={"metadata": {"name": "big"}, "data": {"blob": "x" * (1024 * 1024 + 1)}}
    )
    assert big.status_code == 422 and "at most 1048576 bytes" in big.json()["message"]
    bad_key = tenant.post(url, json={"metadata": {"name": "k"}, "data": {"no/slash": "v"}})
    assert bad_key.status_code == 422 and "config key" in bad_key.json()["message"]
    frozen = {"metadata": {"name": "frozen"}, "data": {"a": "1"}, "immutable": True}
    assert tenant.post(url, json=frozen).status_code == 201
    change = tenant.patch(f"{url}/frozen", json={"data": {"a": "2"}}, headers=JSON_MERGE)
    assert change.status_code == 422 and "immutable" in change.json()["message"]
    relabel = tenant.patch(
        f"{url}/frozen", json={"metadata": {"labels": {"a": "b"}}}, headers=JSON_MERGE
    )
    assert relabel.status_code == 200


def test_secret_types_and_string_data(tenant) -> None:
    url = f"/api/v1/namespaces/{tenant.tenant}/secrets"
    made = tenant.post(url, json={"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}})
    assert made.status_code == 201
    assert made.json()["data"] == {"password": _b64("hunter2")} and "stringData" not in made.json()
    assert made.json()["type"] == "Opaque"
    tls = tenant.post(
        url,
        json={
            "metadata": {"name": "t"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": _b64("c")},
        },
    )
    assert tls.status_code == 422 and "tls.key" in tls.json()["message"]
    docker = tenant.post(
        url,
        json={
            "metadata": {"name": "d"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": _b64("not json")},
        },
    )
    assert docker.status_code == 422 and "not valid JSON" in docker.json()["message"]
    retype = tenant.patch(f"{url}/s", json={"type": "kubernetes.io/basic-auth"}, headers=JSON_MERGE)
    assert retype.status_code == 422 and "immutable" in retype.json()["message"]
    not_base64 = tenant.post(url, json={"metadata": {"name": "b"}, "data": {"k": "%%%"}})
    assert not_base64.status_code == 422 and "base64" in not_base64.json()["message"]
    selected = tenant.get(url, params={"fieldSelector": "type=Opaque"}).json()["items"]
    assert [s["metadata"]["name"] for s in selected] == ["s"]


def test_secret_values_are_never_stored_in_plain_text(tenant, server) -> None:
    """Neither the objects table nor the change log holds a Secret's value, in plain text or in
    base64; the API and a watch show it."""
    value = "correct-horse-battery-staple-7f3a"
    url = f"/api/v1/namespaces/{tenant.tenant}/secrets"
    start = tenant.get(url).json()["metadata"]["resourceVersion"]
    made = tenant.post(url, json={"metadata": {"name": "vault"}, "stringData": {"pw": value}})
    assert made.status_code == 201
    tenant.patch(
        f"{url}/vault", json={"metadata": {"labels": {"rotated": "no"}}}, headers=JSON_MERGE
    )
    stored = server.services.db.read(
        lambda s: [
            *s.execute(text("SELECT body FROM objects WHERE name = 'vault'")).scalars(),
            *s.execute(text("SELECT object FROM changes WHERE name = 'vault'")).scalars(),
        ]
    )
    assert len(stored) == 3  # the object, its ADDED and MODIFIED
    for raw in stored:
        dumped = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
        assert value not in dumped and _b64(value) not in dumped
        assert "aesgcm:v1:" in dumped
    assert tenant.get(f"{url}/vault").json()["data"] == {"pw": _b64(value)}
    watched = tenant.get(f"{url}?watch=true&resourceVersion={start}&timeoutSeconds=1").text
    assert _b64(value) in watched and "sealedData" not in watched
