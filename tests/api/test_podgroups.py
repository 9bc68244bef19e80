"""Pod groups (gangs) over the API: `kubectl get pg`."""

from __future__ import annotations

import contextlib
import json

from tests.conftest import statements_touching
from tests.factories import pod


def group(
    name: str, min_member: int = 2, required: str | None = None, preferred: str | None = None
) -> dict:
    topology = {k: v for k, v in (("required", required), ("preferred", preferred)) if v}
    return {
        "apiVersion": "tessera.io/v1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, "topology": topology},
    }


def test_create_list_and_member_counts(tenant) -> None:
    base = f"/apis/tessera.io/v1/namespaces/{tenant.tenant}/podgroups"
    created = tenant.post(base, json=group("train", 3, required="node"))
    assert created.status_code == 201, created.text
    assert created.json()["spec"] == {"minMember": 3, "topology": {"required": "node"}}
    assert created.json()["status"] == {
        "phase": "Pending",
        "members": 0,
        "scheduled": 0,
        "running": 0,
    }
    for i in range(3):
        member = pod(f"w{i}", cpu="4", memory="8Gi", labels={"tessera.io/pod-group": "train"})
        assert (
            tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=member).status_code == 201
        )
    status = tenant.get(f"{base}/train").json()["status"]
    assert status == {"phase": "Waiting", "members": 3, "scheduled": 0, "running": 0}
    listed = tenant.get(base).json()
    assert listed["kind"] == "PodGroupList" and [
        g["metadata"]["name"] for g in listed["items"]
    ] == ["train"]
    everywhere = tenant.get("/apis/tessera.io/v1/podgroups").json()["items"]
    assert {g["metadata"]["namespace"] for g in everywhere} == {tenant.tenant}


def test_rules(tenant) -> None:
    ns = tenant.tenant
    base = f"/apis/tessera.io/v1/namespaces/{ns}/podgroups"
    assert tenant.post(base, json=group("g")).status_code == 201
    assert tenant.post(base, json=group("g")).status_code == 409
    wide = tenant.post(base, json=group("bad", required="node", preferred="zone"))
    assert (
        wide.status_code == 422
        and wide.json()["details"]["causes"][0]["field"] == "spec.topology.preferred"
    )
    zero = tenant.post(base, json=group("zero", 0))
    assert zero.status_code == 400 and "minMember" in zero.json()["message"]
    orphan = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("o", labels={"tessera.io/pod-group": "nope"})
    )
    assert orphan.status_code == 422 and "no PodGroup" in orphan.json()["message"]
    tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("m", labels={"tessera.io/pod-group": "g"})
    )
    moved = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/m",
        json={"metadata": {"labels": {"tessera.io/pod-group": "other"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert moved.status_code == 422
    resized = tenant.patch(
        f"{base}/g",
        json={"spec": {"minMember": 5}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resized.status_code == 200 and resized.json()["spec"]["minMember"] == 5
    # A group goes while pods still name it (as kubectl delete -f of a gang's manifest asks:
    # the group first); its pods stay, on their own.
    gone = tenant.delete(f"{base}/g")
    assert gone.status_code == 200, gone.text
    assert tenant.get(f"{base}/g").status_code == 404
    member = tenant.get(f"/api/v1/namespaces/{ns}/pods/m")
    assert member.status_code == 200
    assert member.json()["metadata"]["labels"]["tessera.io/pod-group"] == "g"
    assert tenant.get(f"{base}/g").status_code == 404


def test_other_tenants_groups_are_forbidden(make_tenant) -> None:
    owner, intruder = make_tenant("pgo"), make_tenant("pgi")
    owner.post(f"/apis/tessera.io/v1/namespaces/{owner.tenant}/podgroups", json=group("secret"))
    for method in ("GET", "DELETE"):
        response = intruder.request(
            method, f"/apis/tessera.io/v1/namespaces/{owner.tenant}/podgroups/secret"
        )
        assert response.status_code == 403
    assert (
        intruder.post(
            f"/apis/tessera.io/v1/namespaces/{owner.tenant}/podgroups", json=group("x")
        ).status_code
        == 403
    )
    assert intruder.get("/apis/tessera.io/v1/podgroups").json()["items"] == []


# --- what the generic registry gives PodGroups of both groups -------------------------------

TESSERA = "/apis/tessera.io/v1"
COSCHEDULING = "/apis/scheduling.x-k8s.io/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
KINDS = (
    (TESSERA, "tessera.io/pod-group", lambda name, n=2: group(name, n)),
    (
        COSCHEDULING,
        "scheduling.x-k8s.io/pod-group",
        lambda name, n=2: {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": n},
        },
    ),
)


def joins(api, label: str, gang: str, name: str) -> int:
    """The status of creating a pod that names the gang `gang` (422 when no such group)."""
    body = pod(name, labels={label: gang})
    return api.post(f"/api/v1/namespaces/{api.tenant}/pods", json=body).status_code


def scheduler_reads(db, namespace: str, name: str) -> int | None:
    """The minMember the scheduler reads of a group (None: it sees no such group)."""
    from sqlalchemy import select

    from app.db.models import PodGroup, table

    groups = table(PodGroup)
    query = select(groups.c.min_member).where(
        groups.c.namespace == namespace, groups.c.name == name
    )
    return db.read(lambda s: s.execute(query).scalar())


def test_a_dry_run_of_every_verb_writes_nothing(tenant, db) -> None:
    """dryRun=All on create, update, patch, apply, delete (by query and by DeleteOptions) and
    deletecollection answers as the write would, and neither the object nor what the scheduler
    reads of it changes (a pod cannot join a group made in a dry run)."""
    for prefix, label, make in KINDS:
        base = f"{prefix}/namespaces/{tenant.tenant}/podgroups"
        dry = tenant.post(f"{base}?dryRun=All", json=make("dry"))
        assert dry.status_code == 201 and dry.json()["spec"]["minMember"] == 2, dry.text
        assert tenant.get(f"{base}/dry").status_code == 404
        assert joins(tenant, label, "dry", f"p-{len(prefix)}") == 422
        applied = tenant.patch(
            f"{base}/dry?dryRun=All&fieldManager=me",
            content=json.dumps(make("dry")),
            headers=APPLY,
        )
        assert applied.status_code == 201, applied.text
        assert tenant.get(f"{base}/dry").status_code == 404

        kept = tenant.post(base, json=make("kept")).json()
        rv = kept["metadata"]["resourceVersion"]
        replaced = tenant.put(
            f"{base}/kept?dryRun=All", json={**kept, "spec": {**kept["spec"], "minMember": 9}}
        )
        assert replaced.status_code == 200 and replaced.json()["spec"]["minMember"] == 9
        patched = tenant.patch(
            f"{base}/kept?dryRun=All", json={"spec": {"minMember": 7}}, headers=MERGE
        )
        assert patched.status_code == 200 and patched.json()["spec"]["minMember"] == 7
        by_body = tenant.request("DELETE", f"{base}/kept", json={"dryRun": ["All"]})
        assert by_body.status_code == 200, by_body.text
        assert tenant.delete(f"{base}/kept?dryRun=All").status_code == 200
        collection = tenant.delete(f"{base}?dryRun=All")
        assert collection.status_code == 200
        assert [g["metadata"]["name"] for g in collection.json()["items"]] == ["kept"]
        now = tenant.get(f"{base}/kept").json()
        assert now["spec"]["minMember"] == 2 and now["metadata"]["resourceVersion"] == rv
        assert scheduler_reads(db, tenant.tenant, "kept") == 2  # what the scheduler reads
        tenant.delete(f"{base}/kept")


def test_put_and_deletecollection_on_tessera_pod_groups(tenant, db) -> None:
    """tessera.io PodGroups take PUT (the JobSet controller replaces its gang's) and DELETE of
    the collection by label, as every kind of the registry."""
    base = f"{TESSERA}/namespaces/{tenant.tenant}/podgroups"
    made = tenant.post(base, json={**group("a"), "metadata": {"name": "a", "labels": {"x": "1"}}})
    tenant.post(base, json=group("b"))
    body = made.json()
    body["spec"]["minMember"] = 4
    replaced = tenant.put(f"{base}/a", json=body)
    assert replaced.status_code == 200 and replaced.json()["spec"]["minMember"] == 4
    assert scheduler_reads(db, tenant.tenant, "a") == 4  # the scheduler reads the change
    assert tenant.put(f"{base}/a", json=body).status_code == 409  # stale resourceVersion
    gone = tenant.delete(f"{base}?labelSelector=x%3D1")
    assert [g["metadata"]["name"] for g in gone.json()["items"]] == ["a"]
    assert scheduler_reads(db, tenant.tenant, "a") is None
    assert [g["metadata"]["name"] for g in tenant.get(base).json()["items"]] == ["b"]
    # the name is free again in either group: what the scheduler read went with it
    assert (
        tenant.post(
            f"{COSCHEDULING}/namespaces/{tenant.tenant}/podgroups", json=KINDS[1][2]("a")
        ).status_code
        == 201
    )


def test_a_uid_precondition_guards_a_deletion(tenant) -> None:
    for prefix, _, make in KINDS:
        base = f"{prefix}/namespaces/{tenant.tenant}/podgroups"
        uid = tenant.post(base, json=make("g")).json()["metadata"]["uid"]
        stale = tenant.request("DELETE", f"{base}/g", json={"preconditions": {"uid": "not-" + uid}})
        assert stale.status_code == 409, stale.text
        assert "Precondition failed" in stale.json()["message"]
        assert tenant.get(f"{base}/g").json()["metadata"]["uid"] == uid
        right = tenant.request("DELETE", f"{base}/g", json={"preconditions": {"uid": uid}})
        assert right.status_code == 200
        assert tenant.get(f"{base}/g").status_code == 404


def test_a_finalizer_keeps_a_group_until_it_is_removed(tenant) -> None:
    base = f"{TESSERA}/namespaces/{tenant.tenant}/podgroups"
    body = group("held")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    assert tenant.post(base, json=body).status_code == 201
    marked = tenant.delete(f"{base}/held").json()
    assert "deletionTimestamp" in marked["metadata"]
    assert tenant.get(f"{base}/held").status_code == 200
    # its name is still held in both groups while it is being deleted
    clash = tenant.post(
        f"{COSCHEDULING}/namespaces/{tenant.tenant}/podgroups", json=KINDS[1][2]("held")
    )
    assert clash.status_code == 409
    released = tenant.patch(f"{base}/held", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert released.status_code == 200
    assert tenant.get(f"{base}/held").status_code == 404


def test_watchers_see_a_namespace_take_its_groups_with_it(tenant) -> None:
    """A namespace's deletion deletes each group through the store: a watch of the namespace's
    podgroups (either group) sees DELETED, with the status a get shows."""
    ns = f"{tenant.tenant}-pgw"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    for i, (prefix, _, make) in enumerate(KINDS):
        made = tenant.post(f"{prefix}/namespaces/{ns}/podgroups", json=make(f"g{i}"))
        assert made.status_code == 201
    since = {
        prefix: tenant.get(f"{prefix}/namespaces/{ns}/podgroups").json()["metadata"][
            "resourceVersion"
        ]
        for prefix, _, _ in KINDS
    }
    with contextlib.ExitStack() as watches:
        streams = [  # open (authorized) while the namespace is there
            watches.enter_context(
                tenant.http.stream(
                    "GET",
                    f"{prefix}/namespaces/{ns}/podgroups",
                    params={
                        "watch": "true",
                        "resourceVersion": since[prefix],
                        "timeoutSeconds": "2",
                    },
                )
            )
            for prefix, _, _ in KINDS
        ]
        assert all(stream.status_code == 200 for stream in streams)
        assert tenant.delete(f"/api/v1/namespaces/{ns}").status_code == 200
        for i, ((prefix, _, _), stream) in enumerate(zip(KINDS, streams, strict=True)):
            events = [json.loads(line) for line in stream.iter_lines() if line.strip()]
            deleted = [e["object"] for e in events if e["type"] == "DELETED"]
            assert [o["metadata"]["name"] for o in deleted] == [f"g{i}"], events
            assert deleted[0]["apiVersion"] == prefix.removeprefix("/apis/")
            assert deleted[0]["status"]["phase"] == "Pending"


def test_a_list_reads_the_groups_statuses_once_a_page(server, tenant) -> None:
    """A list of PodGroups works out every group's status (member counts, scheduling state)
    in two queries for the page, not two for each group: listing 12 groups runs as many
    statements as listing 2, and each status counts its own members."""
    base = f"/apis/tessera.io/v1/namespaces/{tenant.tenant}/podgroups"
    for i in range(12):
        assert tenant.post(base, json=group(f"g{i:02}")).status_code == 201
    for name, members in (("g00", 1), ("g05", 3)):
        for m in range(members):
            member = pod(f"{name}-{m}", labels={"tessera.io/pod-group": name})
            created = tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=member)
            assert created.status_code == 201, created.text
    with statements_touching(server.services.db.engine, "pod_groups", "FROM pods") as statements:
        two = tenant.get(base, params={"limit": 2})
        read_for_two = len(statements)
        statements.clear()
        twelve = tenant.get(base)
        read_for_twelve = len(statements)
    assert len(two.json()["items"]) == 2 and len(twelve.json()["items"]) == 12
    assert read_for_twelve == read_for_two, (read_for_two, read_for_twelve)
    members = {g["metadata"]["name"]: g["status"]["members"] for g in twelve.json()["items"]}
    assert members == {f"g{i:02}": {0: 1, 5: 3}.get(i, 0) for i in range(12)}
