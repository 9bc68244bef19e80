"""Callbacks (webhooks) through their whole life, over real HTTP to a real receiver on
loopback: a Callback is created (its secret shown once), a pod's transitions are emitted into
the outbox in the transition's transaction and delivered after commit as signed CloudEvents,
failures are retried with backoff (500s, timeouts), redirects are never followed, a transaction
that rolls back sends nothing, and another tenant sees none of it. SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.callbacks import service as callbacks
from app.callbacks.signing import HEADER, SignatureError, verify
from app.db.models import CallbackDelivery
from app.kube.meta import now
from app.pods import service as pods
from tests.api.test_pod_updates import bound_pod
from tests.conftest import Api, statements_touching, unique
from tests.factories import pod
from tests.receiver import Receiver

BASE = "/apis/tessera.io/v1"
MERGE = {"Content-Type": "application/merge-patch+json"}
BEST_EFFORT = {"tessera.io/compute-qos": "best-effort", "tessera.io/gpu-model": "H100"}


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


def create_callback(
    api: Api, url: str, events: list[str] | None = None, name: str | None = None
) -> dict:
    body = {
        "apiVersion": "tessera.io/v1",
        "kind": "Callback",
        "metadata": {"name": name or unique("cb-")},
        "spec": {"url": url, "events": events or ["PodFinished"], "description": "test hook"},
    }
    response = api.post(f"{BASE}/namespaces/{api.tenant}/callbacks", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def deliveries(api: Api, name: str) -> list[dict]:
    response = api.get(f"{BASE}/namespaces/{api.tenant}/callbacks/{name}/deliveries")
    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "CallbackDeliveryList"
    return response.json()["items"]


def until(api: Api, name: str, done: Callable[[list[dict]], bool], timeout: float = 15) -> list:
    """The callback's deliveries once `done` holds for them (polled through the API)."""
    deadline = time.monotonic() + timeout
    while True:
        items = deliveries(api, name)
        if done(items) or time.monotonic() > deadline:
            assert done(items), items
            return items
        time.sleep(0.05)


def running_pod(server, tenant: Api, admin: Api, name: str, **labels: str) -> dict:
    bound = bound_pod(tenant, admin, name, **labels)
    assert server.services.db.write(lambda s: pods.start(s, uid=bound["metadata"]["uid"]))
    return bound


def test_a_finished_pod_is_delivered_signed_as_a_cloudevent(
    server, tenant, admin, receiver
) -> None:
    created = create_callback(tenant, receiver.url())
    secret = created["status"]["signingSecret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    name = created["metadata"]["name"]
    job = running_pod(server, tenant, admin, unique("job-"))
    uid = job["metadata"]["uid"]
    before = datetime.now(UTC)
    assert server.services.db.write(lambda s: pods.finish(s, uid=uid))

    (got,) = receiver.wait_for(1)
    assert got.path == "/hook"
    assert got.headers["content-type"] == "application/cloudevents+json"
    timestamp = verify(secret, got.body, got.headers[HEADER.lower()], tolerance=60)
    assert abs(timestamp - time.time()) < 60
    with pytest.raises(SignatureError):
        verify(secret, got.body + b" ", got.headers[HEADER.lower()])
    with pytest.raises(SignatureError):
        verify("whsec_wrong", got.body, got.headers[HEADER.lower()])
    event = got.event
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.tessera.pod.finished"
    assert event["source"] == server.services.settings.effective_public_url
    assert event["subject"] == f"namespaces/{tenant.tenant}/pods/{job['metadata']['name']}"
    assert event["datacontenttype"] == "application/json"
    sent_at = datetime.fromisoformat(event["time"].replace("Z", "+00:00"))
    assert before - timedelta(seconds=1) <= sent_at <= datetime.now(UTC)
    assert event["data"] == {
        "namespace": tenant.tenant,
        "name": job["metadata"]["name"],
        "uid": uid,
        "phase": "Succeeded",
        "reason": "Completed",
        "exitCode": 0,
    }
    (delivery,) = until(tenant, name, lambda items: items and items[0]["phase"] == "Delivered")
    assert delivery["eventId"] == event["id"]
    assert delivery["attempts"] == 1 and delivery["responseCode"] == 200
    assert "lastError" not in delivery and delivery["lastAttemptTime"]
    # The same transition emitted again is the same event: no second delivery.
    row = server.services.db.read(lambda s: pods.repository.get_by_uid(s, uid))
    assert row is not None
    server.services.db.write(
        lambda s: callbacks.emit_pod_finished(
            s, row, phase="Succeeded", reason="Completed", exit_code=0, at=now()
        )
    )
    assert len(deliveries(tenant, name)) == 1
    # The Callback itself says so, and kubectl's table too.
    shown = tenant.get(f"{BASE}/namespaces/{tenant.tenant}/callbacks/{name}").json()
    assert shown["status"]["recentDeliveries"][0]["phase"] == "Delivered"
    table = tenant.get(
        f"{BASE}/namespaces/{tenant.tenant}/callbacks",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    ).json()
    assert [c["name"] for c in table["columnDefinitions"]][:4] == [
        "Name",
        "URL",
        "Events",
        "Last Delivery",
    ]
    (cells,) = [r["cells"] for r in table["rows"] if r["cells"][0] == name]
    assert cells[1:4] == [receiver.url(), "PodFinished", "Delivered (1 attempt)"]


def test_a_failing_receiver_gets_the_event_on_a_retry(server, tenant, admin, receiver) -> None:
    receiver.plan(500)
    created = create_callback(tenant, receiver.url())
    job = running_pod(server, tenant, admin, unique("job-"))
    server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"], succeeded=False))
    first, second = receiver.wait_for(2)
    assert first.body == second.body  # the same event, byte for byte
    assert first.event["data"]["phase"] == "Failed" and first.event["data"]["exitCode"] == 1
    assert (
        first.headers["tessera-delivery-attempt"],
        second.headers["tessera-delivery-attempt"],
    ) == (
        "1",
        "2",
    )
    secret = created["status"]["signingSecret"]
    for got in (first, second):
        verify(secret, got.body, got.headers["tessera-signature"])
    assert second.at - first.at >= 0.025  # the backoff: at least half the base of 0.05s
    (delivery,) = until(
        tenant, created["metadata"]["name"], lambda i: i and i[0]["phase"] == "Delivered"
    )
    assert delivery["attempts"] == 2 and delivery["responseCode"] == 200


def test_a_receiver_that_times_out_is_retried(server, tenant, admin, receiver) -> None:
    receiver.plan("stall")
    created = create_callback(tenant, receiver.url())
    job = running_pod(server, tenant, admin, unique("job-"))
    server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"]))
    stalled, retried = receiver.wait_for(2)
    assert retried.at - stalled.at >= 0.5  # the attempt's timeout passed first
    assert stalled.event["id"] == retried.event["id"]
    (delivery,) = until(
        tenant, created["metadata"]["name"], lambda i: i and i[0]["phase"] == "Delivered"
    )
    assert delivery["attempts"] == 2


def attempts_counted(admin: Api) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    response = admin.get("/metrics")
    assert response.status_code == 200
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(response.text)
        if family.name == "tessera_callback_attempts"
        for sample in family.samples
        if sample.name == "tessera_callback_attempts_total"
    }


def test_redirects_are_never_followed(server, tenant, admin, receiver) -> None:
    before = attempts_counted(admin)
    elsewhere = receiver.url("/elsewhere")
    receiver.plan(("redirect", elsewhere), ("redirect", elsewhere), ("redirect", elsewhere))
    created = create_callback(tenant, receiver.url())
    job = running_pod(server, tenant, admin, unique("job-"))
    server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"]))
    (delivery,) = until(
        tenant, created["metadata"]["name"], lambda i: i and i[0]["phase"] == "Failed"
    )
    assert delivery["attempts"] == 3  # callback_max_attempts in the test server
    assert delivery["responseCode"] == 302
    assert "redirect not followed" in delivery["lastError"] and elsewhere in delivery["lastError"]
    assert "gave up after 3 attempts" in delivery["lastError"]
    assert [r.path for r in receiver.requests] == ["/hook"] * 3
    after = attempts_counted(admin)
    assert after.get("retry", 0) - before.get("retry", 0) >= 2
    assert after.get("failed", 0) - before.get("failed", 0) >= 1


def test_a_transaction_that_rolls_back_sends_nothing(server, tenant, admin, receiver) -> None:
    created = create_callback(tenant, receiver.url())
    name = created["metadata"]["name"]
    doomed = running_pod(server, tenant, admin, unique("doomed-"))
    kept = running_pod(server, tenant, admin, unique("kept-"))

    class Abort(Exception):
        pass

    def finish_then_fail(session: Any) -> None:
        assert pods.finish(session, uid=doomed["metadata"]["uid"])
        raise Abort

    with pytest.raises(Abort):
        server.services.db.write(finish_then_fail)
    assert server.services.db.write(lambda s: pods.finish(s, uid=kept["metadata"]["uid"]))
    (got,) = receiver.wait_for(1)
    until(tenant, name, lambda i: i and i[0]["phase"] == "Delivered")
    # Only the committed transition was sent; the rolled-back one left no row at all.
    assert got.event["data"]["uid"] == kept["metadata"]["uid"]
    assert [d["subject"].rsplit("/", 1)[1] for d in deliveries(tenant, name)] == [
        kept["metadata"]["name"]
    ]
    rows = server.services.db.read(
        lambda s: list(
            s.scalars(
                select(CallbackDelivery.subject).where(
                    CallbackDelivery.subject.like(f"%/{doomed['metadata']['name']}")
                )
            )
        )
    )
    assert rows == []
    assert len(receiver.requests) == 1
    phase = tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/{doomed['metadata']['name']}")
    assert phase.json()["status"]["phase"] == "Running"


def test_preemption_and_eviction_give_notice_then_the_pod_finishes(
    server, tenant, admin, receiver
) -> None:
    created = create_callback(tenant, receiver.url(), ["EvictionNotice", "PodFinished"])
    secret = created["status"]["signingSecret"]
    victim = running_pod(server, tenant, admin, unique("be-"), **BEST_EFFORT)
    ns = tenant.tenant
    preemptor = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod(unique("reg-"), cpu="4", memory="16Gi", gpus=1)
    ).json()
    before = datetime.now(UTC)
    evicted = server.services.db.write(
        lambda s: pods.preempt(
            s,
            nominations={preemptor["metadata"]["uid"]: victim["spec"]["nodeName"]},
            victims=[victim["metadata"]["uid"]],
            notice_seconds=30,
        )
    )
    assert evicted == [victim["metadata"]["uid"]]
    (notice,) = receiver.wait_for(1)
    verify(secret, notice.body, notice.headers["tessera-signature"])
    event = notice.event
    assert event["type"] == "io.tessera.pod.eviction-notice"
    assert event["data"]["reason"] == "PreemptionByScheduler"
    assert event["data"]["noticeSeconds"] == 30
    deadline = datetime.fromisoformat(event["data"]["deadline"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=29) <= deadline <= datetime.now(UTC) + timedelta(seconds=30)
    # The notice is over: the pod ends Failed (Preempted), and that is a PodFinished.
    assert server.services.db.write(lambda s: pods.end_preempted(s, uid=victim["metadata"]["uid"]))
    _, finished = receiver.wait_for(2)
    assert finished.event["type"] == "io.tessera.pod.finished"
    assert finished.event["data"]["phase"] == "Failed"
    assert finished.event["data"]["reason"] == "Preempted"
    assert finished.event["data"]["exitCode"] == 143

    # The Eviction subresource gives the pod its grace period as notice.
    other = running_pod(server, tenant, admin, unique("ev-"))
    name = other["metadata"]["name"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name},
        "deleteOptions": {"gracePeriodSeconds": 45},
    }
    dry = tenant.post(f"/api/v1/namespaces/{ns}/pods/{name}/eviction?dryRun=All", json=eviction)
    assert dry.status_code == 201
    response = tenant.post(f"/api/v1/namespaces/{ns}/pods/{name}/eviction", json=eviction)
    assert response.status_code == 201, response.text
    *_, evict_notice = receiver.wait_for(3)
    assert evict_notice.event["data"]["reason"] == "EvictionByEvictionAPI"
    assert evict_notice.event["data"]["noticeSeconds"] == 45
    assert evict_notice.event["subject"] == f"namespaces/{ns}/pods/{name}"
    until(
        tenant, created["metadata"]["name"], lambda i: len(i) == 3
    )  # not 4: the dry run sent none


def test_only_subscribed_events_of_the_callbacks_namespace_are_sent(
    server, tenant, admin, make_tenant, receiver
) -> None:
    """A callback hears its own namespace's pods, for its event types only; another tenant's
    pods finishing never reach it."""
    only_notices = create_callback(tenant, receiver.url("/notices"), ["EvictionNotice"])
    stranger = make_tenant("cbs")
    theirs = create_callback(stranger, receiver.url("/theirs"))
    mine = create_callback(tenant, receiver.url("/mine"))
    job = running_pod(server, tenant, admin, unique("job-"))
    server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"]))
    until(tenant, mine["metadata"]["name"], lambda i: i and i[0]["phase"] == "Delivered")
    assert deliveries(tenant, only_notices["metadata"]["name"]) == []
    assert deliveries(stranger, theirs["metadata"]["name"]) == []
    assert [r.path for r in receiver.requests] == ["/mine"]


def test_the_secret_is_shown_once_and_rotates(server, tenant, receiver) -> None:
    created = create_callback(tenant, receiver.url())
    name, secret = created["metadata"]["name"], created["status"]["signingSecret"]
    path = f"{BASE}/namespaces/{tenant.tenant}/callbacks/{name}"
    answers = [
        tenant.get(path).text,
        tenant.get(f"{BASE}/namespaces/{tenant.tenant}/callbacks").text,
        tenant.get(f"{BASE}/callbacks").text,
        tenant.get(path, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).text,
        tenant.patch(path, json={"spec": {"description": "changed"}}, headers=MERGE).text,
        tenant.get(f"{path}/deliveries").text,
    ]
    with tenant.stream(
        "GET",
        f"{BASE}/namespaces/{tenant.tenant}/callbacks",
        params={"watch": "true", "timeoutSeconds": "1", "resourceVersion": "0"},
    ) as watch:
        answers.append(watch.read().decode())
    assert name in answers[-1]
    for text in answers:
        assert secret not in text and "signingSecret" not in text
    # A status sent on create is ignored: the server makes the secret.
    forced = tenant.post(
        f"{BASE}/namespaces/{tenant.tenant}/callbacks",
        json={
            "metadata": {"name": unique("cb-")},
            "spec": {"url": receiver.url(), "events": ["GPUFault"]},
            "status": {"signingSecret": "whsec_mine"},
        },
    )
    assert forced.status_code == 201 and forced.json()["status"]["signingSecret"] != "whsec_mine"

    rotated = tenant.post(f"{path}/rotate")
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()["status"]["signingSecret"]
    assert new != secret and new.startswith("whsec_")
    assert new not in tenant.get(path).text
    assert (
        tenant.post(f"{BASE}/namespaces/{tenant.tenant}/callbacks/absent/rotate").status_code == 404
    )


@pytest.mark.parametrize(
    ("url", "events", "field", "says"),
    [
        ("http://hooks.example.com/x", ["PodFinished"], "spec.url", "only to loopback"),
        ("ftp://hooks.example.com/x", ["PodFinished"], "spec.url", "use https://"),
        ("https://10.1.2.3/x", ["PodFinished"], "spec.url", "private"),
        ("https://169.254.169.254/latest", ["PodFinished"], "spec.url", "link-local"),
        ("https://[fd00::1]/x", ["PodFinished"], "spec.url", "private"),
        ("https://user:pw@hooks.example.com/", ["PodFinished"], "spec.url", "credentials"),
        ("https://hooks.example.com/#x", ["PodFinished"], "spec.url", "fragment"),
        ("hooks.example.com", ["PodFinished"], "spec.url", "absolute"),
        ("https://hooks.example.com/" + "a" * 2048, ["PodFinished"], "spec.url", "at most 2048"),
        ("https://hooks.example.com/", [], "spec.events", "at least one"),
        ("https://hooks.example.com/", ["PodDone"], "spec.events[0]", "supported values"),
        ("https://hooks.example.com/", ["GPUFault", "GPUFault"], "spec.events[1]", "Duplicate"),
    ],
)
def test_only_https_or_loopback_urls_and_known_events(tenant, url, events, field, says) -> None:
    name = unique("bad-")
    response = tenant.post(
        f"{BASE}/namespaces/{tenant.tenant}/callbacks",
        json={"metadata": {"name": name}, "spec": {"url": url, "events": events}},
    )
    assert response.status_code == 422, response.text
    status = response.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert status["message"].startswith(f'Callback "{name}" is invalid: {field}')
    (cause,) = [c for c in status["details"]["causes"] if c["field"] == field]
    assert says in cause["message"], cause
    assert tenant.get(f"{BASE}/namespaces/{tenant.tenant}/callbacks/{name}").status_code == 404


def test_valid_destinations_and_bounded_fields(tenant) -> None:
    for url in (
        "https://hooks.example.com/tessera?x=1",
        "http://127.0.0.1:9/x",
        "http://127.8.9.10/",
        "http://[::1]:8080/x",
        "http://localhost/x",
        "https://localhost:8443/",
    ):
        created = create_callback(tenant, url, ["GPUFault", "PodFinished", "EvictionNotice"])
        assert created["spec"]["url"] == url
    path = f"{BASE}/namespaces/{tenant.tenant}/callbacks/{created['metadata']['name']}"
    long = tenant.patch(path, json={"spec": {"description": "d" * 1025}}, headers=MERGE)
    assert long.status_code == 422 and "at most 1024" in long.text
    private = tenant.patch(path, json={"spec": {"url": "https://192.168.0.1/"}}, headers=MERGE)
    assert private.status_code == 422 and "private" in private.text
    assert tenant.get(path).json()["spec"]["url"] == "https://localhost:8443/"  # nothing written
    current = tenant.get(path).json()
    current["spec"]["events"] = ["GPUFault"]
    replaced = tenant.put(path, json=current)
    assert replaced.status_code == 200 and replaced.json()["spec"]["events"] == ["GPUFault"]
    stale = tenant.put(path, json=current)
    assert stale.status_code == 409 and "modified" in stale.json()["message"]
    assert tenant.delete(path).status_code == 200
    assert tenant.get(path).status_code == 404


def test_another_tenant_cannot_see_or_change_a_callback_or_its_deliveries(
    server, tenant, admin, make_tenant, receiver
) -> None:
    created = create_callback(tenant, receiver.url())
    name = created["metadata"]["name"]
    job = running_pod(server, tenant, admin, unique("job-"))
    server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"]))
    until(tenant, name, lambda i: i and i[0]["phase"] == "Delivered")
    intruder = make_tenant("cbx")
    path = f"{BASE}/namespaces/{tenant.tenant}/callbacks/{name}"
    attempts: list[httpx.Response] = [
        intruder.get(path),
        intruder.get(f"{path}/deliveries"),
        intruder.post(f"{path}/rotate"),
        intruder.patch(path, json={"spec": {"url": "https://evil.example/"}}, headers=MERGE),
        intruder.put(
            path,
            json={**created, "spec": {"url": "https://evil.example/", "events": ["PodFinished"]}},
        ),
        intruder.delete(path),
        intruder.get(f"{BASE}/namespaces/{tenant.tenant}/callbacks"),
    ]
    for response in attempts:
        assert response.status_code == 403, response.text
        assert response.json()["reason"] == "Forbidden"
    across = intruder.get(f"{BASE}/callbacks").json()["items"]
    assert all(i["metadata"]["namespace"] == intruder.tenant for i in across)
    still = tenant.get(path).json()
    assert still["spec"]["url"] == receiver.url() and len(deliveries(tenant, name)) == 1
    assert admin.get(path).status_code == 200  # the admin sees every namespace's
    assert created["status"]["signingSecret"] not in admin.get(f"{BASE}/callbacks").text


def test_a_stalled_receiver_does_not_hold_up_another(server, tenant, admin) -> None:
    """While one receiver keeps an attempt waiting, an event emitted meanwhile for another is
    sent at once (each delivery holds one sender, not the worker)."""
    ns = tenant.tenant
    with Receiver() as slow, Receiver() as fast:
        slow.plan("stall")
        create_callback(tenant, slow.url(), ["PodFinished"])
        quick = create_callback(tenant, fast.url(), ["EvictionNotice"])
        job = running_pod(server, tenant, admin, unique("job-"))
        other = running_pod(server, tenant, admin, unique("ev-"))
        server.services.db.write(lambda s: pods.finish(s, uid=job["metadata"]["uid"]))
        (stalled,) = slow.wait_for(1)
        name = other["metadata"]["name"]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        evicted = tenant.post(f"/api/v1/namespaces/{ns}/pods/{name}/eviction", json=eviction)
        assert evicted.status_code == 201
        (got,) = fast.wait_for(1)
        # Sent well before the stalled attempt's timeout (0.5 s) let a worker go on.
        assert got.at - stalled.at < 0.3
        assert len(slow.requests) == 1
        until(tenant, quick["metadata"]["name"], lambda i: i and i[0]["phase"] == "Delivered")


def test_deleting_a_namespace_deletes_its_callbacks_and_their_deliveries(
    server, tenant, receiver
) -> None:
    ns = f"{tenant.tenant}-{unique('x')}"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
    body = {"metadata": {"name": "hook"}, "spec": {"url": receiver.url(), "events": ["GPUFault"]}}
    assert tenant.post(f"{BASE}/namespaces/{ns}/callbacks", json=body).status_code == 201
    receiver.plan(500, 500, 500)
    tenant_id = server.services.db.read(
        lambda s: server.services.namespaces.lookup(s, ns).tenant_id
    )
    server.services.db.write(
        lambda s: callbacks.emit(
            s,
            tenant_id=tenant_id,
            namespace=ns,
            type="GPUFault",
            subject=f"namespaces/{ns}/pods/p",
            data={"gpu": "n-gpu0"},
            at=now(),
        )
    )
    receiver.wait_for(1)
    assert tenant.delete(f"/api/v1/namespaces/{ns}").status_code == 200
    assert tenant.get(f"{BASE}/namespaces/{ns}/callbacks/hook").status_code in (403, 404)
    left = server.services.db.read(
        lambda s: s.scalar(
            select(CallbackDelivery.uid).where(CallbackDelivery.subject.like(f"namespaces/{ns}/%"))
        )
    )
    assert left is None


def test_a_namespace_holds_at_most_fifty_callbacks(tenant) -> None:
    base = f"{BASE}/namespaces/{tenant.tenant}/callbacks"
    for i in range(callbacks.MAX_PER_NAMESPACE):
        body = {
            "metadata": {"name": f"h{i}"},
            "spec": {"url": "https://h.example/", "events": ["GPUFault"]},
        }
        assert tenant.post(base, json=body).status_code == 201
    body = {
        "metadata": {"name": "one-more"},
        "spec": {"url": "https://h.example/", "events": ["GPUFault"]},
    }
    refused = tenant.post(base, json=body)
    assert refused.status_code == 403 and "the most it may have" in refused.json()["message"]
    assert tenant.get(f"{base}/one-more").status_code == 404
    assert len(tenant.get(base).json()["items"]) == callbacks.MAX_PER_NAMESPACE


def test_a_gpu_fault_is_delivered_for_each_pod_on_that_gpu(server, tenant, admin, receiver) -> None:
    """The admin reports an Xid on a GPU: its tenant hears of its pod on it, not of its pod on
    the other GPU, and the event names the GPU, the node and the fault."""
    from tests.api.test_gpu_faults import fault, new_node, slice_on

    created = create_callback(tenant, receiver.url(), events=["GPUFault"])
    node = new_node(admin, gpus=2)
    hit, spared = unique("hit-"), unique("spared-")
    assert slice_on(tenant, admin, hit, node, 0).status_code == 201
    assert slice_on(tenant, admin, spared, node, 1).status_code == 201
    reported = admin.post(f"{BASE}/gpudevices/{node}-gpu0/fault", json=fault("xid", xid=79))
    assert reported.status_code in (200, 201), reported.text
    (got,) = receiver.wait_for(1)
    verify(created["status"]["signingSecret"], got.body, got.headers[HEADER.lower()])
    event = got.event
    assert event["type"] == "io.tessera.gpu.fault"
    assert event["subject"] == f"namespaces/{tenant.tenant}/pods/{hit}"
    assert event["data"]["gpu"] == f"{node}-gpu0" and event["data"]["node"] == node
    assert event["data"]["reason"] == "xid" and "79" in event["data"]["message"]
    # Deliveries are written in the fault's transaction: one, for the pod on the failed GPU.
    (delivery,) = until(
        tenant, created["metadata"]["name"], lambda i: i and i[0]["phase"] == "Delivered"
    )
    assert delivery["subject"] == event["subject"]


def test_a_list_reads_the_callbacks_statuses_once_a_page(server, tenant, receiver) -> None:
    """Each listed callback's rotation time and recent deliveries come from two queries for
    the page: listing 8 callbacks runs as many statements as listing 2."""
    names = [create_callback(tenant, receiver.url())["metadata"]["name"] for _ in range(8)]
    assert tenant.post(f"{BASE}/namespaces/{tenant.tenant}/callbacks/{names[3]}/rotate").is_success
    base = f"{BASE}/namespaces/{tenant.tenant}/callbacks"
    with statements_touching(
        server.services.db.engine, "callback_secrets", "row_number"
    ) as statements:
        two = tenant.get(base, params={"limit": 2})
        read_for_two = len(statements)
        statements.clear()
        eight = tenant.get(base)
        read_for_eight = len(statements)
    assert len(two.json()["items"]) == 2 and len(eight.json()["items"]) == 8
    assert read_for_eight == read_for_two, (read_for_two, read_for_eight)
    # each its own status, as a read of it alone shows it
    for listed in eight.json()["items"][:3]:
        alone = tenant.get(f"{base}/{listed['metadata']['name']}").json()
        assert listed["status"] == alone["status"]
    assert all(c["status"]["recentDeliveries"] == [] for c in eight.json()["items"])
