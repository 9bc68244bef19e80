"""Pod groups (gangs) over the API: `kubectl get pg`."""

from __future__ import annotations

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
