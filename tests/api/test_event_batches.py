"""Tessera's EventBatch (`POST /apis/tessera.io/v1/namespaces/{ns}/eventbatches`), over real
HTTP on both databases: each event recorded as its own `POST .../events` would record it (the
same checks, a repeat counted on the event it repeats), one answer per item in order, a refused
item leaving the others recorded; the controller manager's and the admin's, nobody else's;
bounded."""

from __future__ import annotations

from typing import Any

from app.auth import service as auth
from tests.conftest import Api, ThreadedServer, unique
from tests.factories import cpu_node, pod

BATCHES = "/apis/tessera.io/v1/namespaces/{ns}/eventbatches"


def batch(*items: Any) -> dict[str, Any]:
    return {"apiVersion": "tessera.io/v1", "kind": "EventBatch", "items": list(items)}


def about(kind: str, name: str, reason: str, api_version: str | None = None) -> dict[str, Any]:
    involved = {"kind": kind, "name": name, **({"apiVersion": api_version} if api_version else {})}
    return {
        "involvedObject": involved,
        "reason": reason,
        "message": f"{reason} {name}",
        "type": "Normal",
        "reportingComponent": "replicaset-controller",
    }


def _controller(server: ThreadedServer) -> Api:
    token = server.services.db.write(lambda s: auth.create_token(s, role="controller")).value
    return Api(server.url, token)


def _events(api: Api, ns: str) -> list[dict[str, Any]]:
    """The events these tests recorded (not those Tessera records itself: Created, Scheduled)."""
    listed = api.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    return [e for e in listed if e["source"]["component"] == "replicaset-controller"]


def test_each_item_is_recorded_as_an_event_of_its_own(server: ThreadedServer, tenant: Api) -> None:
    ns = tenant.tenant
    made = tenant.post(
        f"/apis/apps/v1/namespaces/{ns}/replicasets",
        json={
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        },
    )
    assert made.status_code == 201, made.text
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("p1")).status_code == 201
    controller = _controller(server)
    created = about("ReplicaSet", "web", "SuccessfulCreate", "apps/v1")
    answer = controller.post(
        BATCHES.format(ns=ns),
        json=batch(
            created,
            about("ReplicaSet", "nowhere", "SuccessfulCreate", "apps/v1"),  # no such object
            about("ReplicaSet", "web", "ScalingUp", "apps/v1"),
            about("Widget", "w", "Made"),  # a kind events are not taken about
            "not an event",
        ),
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["kind"] == "EventBatch" and body["apiVersion"] == "tessera.io/v1"
    items = body["items"]
    assert [i["kind"] for i in items] == ["Event", "Status", "Event", "Status", "Status"]
    assert items[1]["code"] == 404 and items[3]["code"] == 422 and items[4]["code"] == 400
    assert "Unsupported value" in items[3]["message"]
    # the same again, in a later batch: counted on the first, as a repeated create is
    again = controller.post(BATCHES.format(ns=ns), json=batch(created)).json()["items"]
    assert again[0]["metadata"]["name"] == items[0]["metadata"]["name"]
    assert again[0]["count"] == 2
    # what a list shows: two events about the ReplicaSet, the repeated one counted twice
    recorded = {e["reason"]: e for e in _events(tenant, ns)}
    assert set(recorded) == {"SuccessfulCreate", "ScalingUp"}
    assert recorded["SuccessfulCreate"]["count"] == 2
    assert recorded["SuccessfulCreate"]["involvedObject"]["uid"] == made.json()["metadata"]["uid"]
    assert recorded["SuccessfulCreate"]["source"]["component"] == "replicaset-controller"


def test_only_the_controller_manager_and_the_admin_record_them(
    server: ThreadedServer, admin: Api, tenant: Api, make_node_agent: Any
) -> None:
    ns = tenant.tenant
    node = unique("evn-")
    assert admin.post("/api/v1/nodes", json=cpu_node(node)).status_code == 201
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("p1")).status_code == 201
    bound = admin.post(
        f"/api/v1/namespaces/{ns}/pods/p1/binding",
        json={"target": {"kind": "Node", "name": node}},
    )
    assert bound.status_code == 201, bound.text
    event = about("Pod", "p1", "Pulled")
    for caller in (tenant, make_node_agent(node)):  # a node sends its events one by one
        refused = caller.post(BATCHES.format(ns=ns), json=batch(event))
        assert refused.status_code == 403, refused.text
    assert _events(admin, ns) == []
    assert admin.post(BATCHES.format(ns=ns), json=batch(event)).status_code == 200
    assert [e["reason"] for e in _events(admin, ns)] == ["Pulled"]
    # the controller manager only in a tenant's namespace
    outside = _controller(server).post(BATCHES.format(ns="kube-system"), json=batch(event))
    assert outside.status_code == 403, outside.text


def test_a_batch_is_bounded_and_well_formed(server: ThreadedServer, tenant: Api) -> None:
    url = BATCHES.format(ns=tenant.tenant)
    controller = _controller(server)
    event = about("Pod", "p", "Pulled")
    too_many = controller.post(url, json=batch(*([event] * 501)))
    assert too_many.status_code == 400 and "at most 500" in too_many.json()["message"]
    assert controller.post(url, json=batch()).status_code == 400
    wrong = controller.post(url, json={**batch(event), "kind": "EventList"})
    assert wrong.status_code == 400 and "EventBatch" in wrong.json()["message"]
    assert _events(tenant, tenant.tenant) == []
