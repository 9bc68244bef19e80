"""Leases on the registry: a node agent's heartbeat (its Lease sent back with a new renewTime)
takes the store's lean path (`Strategy.renewal`), and is still every bit an update: a new
resourceVersion, MODIFIED for watchers, conditional on the version sent, checked, and writing
the columns the node loop reads; anything more than a renewal takes the whole update."""

from __future__ import annotations

import orjson
from sqlalchemy import select

from app.db.models import Lease
from tests.conftest import unique
from tests.factories import gpu_node

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}


def _renewed(lease: dict, at: str) -> dict:
    return {**lease, "spec": {**lease["spec"], "renewTime": at}}


def _watched(api, since: str, name: str) -> list[tuple[str, str | None, str]]:
    answer = api.get(
        f"{LEASES}?watch=true&resourceVersion={since}&timeoutSeconds=1"
        f"&fieldSelector=metadata.name%3D{name}"
    )
    events = [orjson.loads(line) for line in answer.text.splitlines() if line.strip()]
    return [
        (
            e["type"],
            e["object"]["spec"].get("renewTime"),
            e["object"]["metadata"]["resourceVersion"],
        )
        for e in events
    ]


def test_a_heartbeat_is_an_update(admin, make_node_agent, server) -> None:
    node = unique("hb-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=0)).status_code == 201
    agent = make_node_agent(node)
    body = {
        "metadata": {"name": node, "labels": {"zone": "a"}, "annotations": {"kept": "yes"}},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 40,
            "acquireTime": "2026-12-04T10:00:00.000000Z",
            "renewTime": "2026-12-04T10:00:00.000000Z",
            "leaseTransitions": 0,
        },
    }
    created = agent.post(LEASES, json=body)
    assert created.status_code == 201, created.text
    lease = created.json()
    since = lease["metadata"]["resourceVersion"]

    renewed = agent.put(f"{LEASES}/{node}", json=_renewed(lease, "2026-12-04T10:00:10.5Z"))
    assert renewed.status_code == 200, renewed.text
    after = renewed.json()
    assert after["spec"]["renewTime"] == "2026-12-04T10:00:10.500000Z"
    assert int(after["metadata"]["resourceVersion"]) > int(since)
    assert {k: v for k, v in after["metadata"].items() if k != "resourceVersion"} == {
        k: v for k, v in lease["metadata"].items() if k != "resourceVersion"
    }
    assert {k: v for k, v in after["spec"].items() if k != "renewTime"} == {
        k: v for k, v in lease["spec"].items() if k != "renewTime"
    }
    assert admin.get(f"{LEASES}/{node}").json() == after
    assert _watched(admin, since, node) == [
        ("MODIFIED", "2026-12-04T10:00:10.500000Z", after["metadata"]["resourceVersion"])
    ]
    # the column the node loop and billing read
    column = server.services.db.read(
        lambda s: s.execute(
            select(Lease.renew_time).where(Lease.namespace == "kube-node-lease", Lease.name == node)
        ).scalar_one()
    )
    assert column.isoformat().startswith("2026-12-04T10:00:10.500000")

    # conditional on the version sent: the lease as it was before is stale
    stale = agent.put(f"{LEASES}/{node}", json=_renewed(lease, "2026-12-04T10:00:20Z"))
    assert stale.status_code == 409 and "has been modified" in stale.json()["message"]
    # checked: a renewTime that is not a time is refused, naming the field
    bad = agent.put(f"{LEASES}/{node}", json=_renewed(after, "yesterday"))
    assert bad.status_code == 422 and "spec.renewTime" in bad.text
    # the same renewTime again changes nothing: no new version
    same = agent.put(f"{LEASES}/{node}", json=after)
    assert same.status_code == 200
    assert same.json()["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
    # a dry run writes nothing
    dry = agent.put(f"{LEASES}/{node}?dryRun=All", json=_renewed(after, "2026-12-04T10:00:30Z"))
    assert dry.status_code == 200 and dry.json()["spec"]["renewTime"].startswith(
        "2026-12-04T10:00:30"
    )
    assert admin.get(f"{LEASES}/{node}").json() == after


def test_more_than_a_renewal_is_the_whole_update(admin, make_node_agent) -> None:
    node = unique("hb-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=0)).status_code == 201
    agent = make_node_agent(node)
    body = {
        "metadata": {"name": node, "labels": {"zone": "a"}},
        "spec": {"holderIdentity": node, "renewTime": "2026-12-04T10:00:00.000000Z"},
    }
    lease = agent.post(LEASES, json=body).json()
    admin.patch(
        f"{LEASES}/{node}", json={"metadata": {"finalizers": ["example.com/hold"]}}, headers=MERGE
    )
    lease = agent.get(f"{LEASES}/{node}").json()

    # labels left out with a new renewTime: the update removes them
    unlabelled = {
        **lease,
        "metadata": {k: v for k, v in lease["metadata"].items() if k != "labels"},
    }
    answer = agent.put(f"{LEASES}/{node}", json=_renewed(unlabelled, "2026-12-04T10:00:10Z"))
    assert answer.status_code == 200, answer.text
    lease = answer.json()
    assert "labels" not in lease["metadata"] and lease["metadata"]["finalizers"]
    # a new holder: taken, with its transition
    taken = {
        **lease,
        "spec": {
            **lease["spec"],
            "holderIdentity": "someone",
            "acquireTime": "2026-12-04T10:00:20.000000Z",
            "leaseTransitions": 1,
        },
    }
    answer = agent.put(f"{LEASES}/{node}", json=taken)
    assert answer.status_code == 200 and answer.json()["spec"]["holderIdentity"] == "someone"
    # a deletion only marks it while its finalizer holds it; renewals go on, and removing the
    # finalizer removes it
    assert admin.delete(f"{LEASES}/{node}").json()["metadata"]["deletionTimestamp"]
    marked = admin.get(f"{LEASES}/{node}").json()
    renewed = agent.put(f"{LEASES}/{node}", json=_renewed(marked, "2026-12-04T10:00:40Z"))
    assert renewed.status_code == 200 and renewed.json()["metadata"]["deletionTimestamp"]
    released = admin.patch(
        f"{LEASES}/{node}", json={"metadata": {"finalizers": None}}, headers=MERGE
    )
    assert released.status_code == 200
    assert admin.get(f"{LEASES}/{node}").status_code == 404
