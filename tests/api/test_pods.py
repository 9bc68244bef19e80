"""The Pod API over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import yaml

from tests.factories import gpu_node, pod


def test_create_returns_a_pending_pod_with_its_rounded_spec(tenant) -> None:
    ns = tenant.tenant
    response = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("web", cpu="2", memory="3.5Gi")
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["kind"] == "Pod" and created["apiVersion"] == "v1"
    meta = created["metadata"]
    assert meta["namespace"] == ns and meta["uid"] and int(meta["resourceVersion"]) > 0
    assert meta["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"
    # The class admission derived is an annotation: the labels are the user's own.
    assert meta["annotations"]["tessera.io/compute-class"] == "general-purpose"
    assert "tessera.io/compute-class" not in (meta.get("labels") or {})
    assert created["status"]["phase"] == "Pending"
    scheduled = [c for c in created["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "False" and scheduled[0]["message"]

    fetched = tenant.get(f"/api/v1/namespaces/{ns}/pods/web").json()
    assert fetched == created


def test_yaml_body_and_default_spec(tenant) -> None:
    manifest = pod("bare")
    response = tenant.post(
        f"/api/v1/namespaces/{tenant.tenant}/pods",
        content=yaml.safe_dump(manifest),
        headers={"Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"


def test_events_record_creation_and_rounding(tenant) -> None:
    ns = tenant.tenant
    tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("rounded", cpu="1.2", memory="1Gi"))
    tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("exact", cpu="1", memory="2Gi"))
    events = tenant.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    by_pod = {e["involvedObject"]["name"]: e for e in events}
    assert by_pod["rounded"]["reason"] == "SpecRounded"
    assert "1.5-2Gi" in by_pod["rounded"]["message"]
    assert by_pod["exact"]["reason"] == "Created"
    only = tenant.get(
        f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "involvedObject.name=exact"}
    ).json()["items"]
    assert [e["involvedObject"]["name"] for e in only] == ["exact"]


def test_generate_name(tenant) -> None:
    ns = tenant.tenant
    names = {
        tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod(None)).json()["metadata"]["name"]
        for _ in range(3)
    }
    assert len(names) == 3 and all(
        n.startswith("job-") and len(n) == len("job-") + 5 for n in names
    )


def test_existing_name_is_409_already_exists(tenant) -> None:
    ns = tenant.tenant
    assert tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("dup")).status_code == 201
    response = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("dup"))
    assert response.status_code == 409
    status = response.json()
    assert status["kind"] == "Status" and status["reason"] == "AlreadyExists"
    assert status["message"] == 'pods "dup" already exists'
    assert status["details"] == {"name": "dup", "kind": "pods"}


def test_invalid_spec_is_422_with_every_bad_field(tenant) -> None:
    ns = tenant.tenant
    manifest = pod(
        "bad",
        cpu="80",
        memory="1Gi",
        gpus=1,
        gpu_memory="20Gi",
        labels={"tessera.io/compute-qos": "cheap"},
    )
    response = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest)
    assert response.status_code == 422
    status = response.json()
    assert status["reason"] == "Invalid" and status["message"].startswith('Pod "bad" is invalid:')
    fields = {c["field"] for c in status["details"]["causes"]}
    assert "metadata.labels.tessera.io/compute-qos" in fields
    assert "spec.containers[*].resources.requests.cpu" in fields
    assert "spec.containers[*].resources.limits[nvidia.com/gpu]" in fields
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/bad").status_code == 404


def test_unknown_field_strict_is_rejected_and_warn_drops_it(tenant) -> None:
    ns = tenant.tenant
    manifest = pod("strict")
    manifest["spec"]["containers"][0]["imagePolicy"] = "x"
    strict = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", params={"fieldValidation": "Strict"}, json=manifest
    )
    assert strict.status_code == 400
    assert 'unknown field "spec.containers[0].imagePolicy"' in strict.json()["message"]
    warned = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=manifest)
    assert warned.status_code == 201
    assert "imagePolicy" in warned.headers["warning"]
    assert "imagePolicy" not in warned.json()["spec"]["containers"][0]


def test_malformed_body_is_400(tenant) -> None:
    response = tenant.post(
        f"/api/v1/namespaces/{tenant.tenant}/pods",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["kind"] == "Status"


def test_list_selectors_and_paging(tenant) -> None:
    ns = tenant.tenant
    for i in range(7):
        labels = {"app": "web" if i % 2 == 0 else "db", "idx": str(i)}
        assert (
            tenant.post(
                f"/api/v1/namespaces/{ns}/pods", json=pod(f"p{i}", labels=labels)
            ).status_code
            == 201
        )
    url = f"/api/v1/namespaces/{ns}/pods"
    web = tenant.get(url, params={"labelSelector": "app=web"}).json()["items"]
    assert sorted(p["metadata"]["name"] for p in web) == ["p0", "p2", "p4", "p6"]
    not_web = tenant.get(url, params={"labelSelector": "app!=web,idx in (1,3)"}).json()["items"]
    assert sorted(p["metadata"]["name"] for p in not_web) == ["p1", "p3"]
    by_name = tenant.get(url, params={"fieldSelector": "metadata.name=p5"}).json()["items"]
    assert [p["metadata"]["name"] for p in by_name] == ["p5"]
    pending = tenant.get(
        url, params={"fieldSelector": "status.phase=Pending,spec.nodeName="}
    ).json()["items"]
    assert len(pending) == 7

    seen: list[str] = []
    token = None
    pages = 0
    while True:
        params = {"limit": 3, **({"continue": token} if token else {})}
        page = tenant.get(url, params=params).json()
        seen += [p["metadata"]["name"] for p in page["items"]]
        pages += 1
        token = page["metadata"].get("continue")
        if not token:
            break
    assert seen == [f"p{i}" for i in range(7)] and pages == 3


def test_bad_selectors_are_400_naming_the_problem(tenant) -> None:
    url = f"/api/v1/namespaces/{tenant.tenant}/pods"
    bad_field = tenant.get(url, params={"fieldSelector": "spec.image=x"})
    assert bad_field.status_code == 400 and "spec.image" in bad_field.json()["message"]
    bad_label = tenant.get(url, params={"labelSelector": "app in x"})
    assert bad_label.status_code == 400 and "label selector" in bad_label.json()["message"]
    bad_token = tenant.get(url, params={"continue": "garbage!"})
    assert bad_token.status_code == 400 and "continue" in bad_token.json()["message"]


def test_merge_patch_labels_and_stale_resource_version(tenant) -> None:
    ns = tenant.tenant
    created = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("patchme", labels={"a": "1"})
    ).json()
    rv = created["metadata"]["resourceVersion"]
    headers = {"Content-Type": "application/merge-patch+json"}
    patched = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/patchme",
        json={"metadata": {"labels": {"b": "2", "a": None}, "annotations": {"note": "hi"}}},
        headers=headers,
    )
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["metadata"]["labels"] == {"b": "2"}
    assert body["metadata"]["annotations"]["note"] == "hi"
    assert int(body["metadata"]["resourceVersion"]) > int(rv)

    stale = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/patchme",
        json={"metadata": {"resourceVersion": rv, "labels": {"c": "3"}}},
        headers=headers,
    )
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert "has been modified" in stale.json()["message"]

    replaced = dict(body)
    replaced["metadata"] = {**body["metadata"], "resourceVersion": rv}
    assert tenant.put(f"/api/v1/namespaces/{ns}/pods/patchme", json=replaced).status_code == 409


def test_spec_and_placement_labels_are_immutable(tenant) -> None:
    ns = tenant.tenant
    tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("fixed"))
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    image = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/fixed",
        json={"spec": {"restartPolicy": "Never"}},
        headers=headers,
    )
    assert image.status_code == 422 and "spec.restartPolicy" in image.json()["message"]
    qos = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/fixed",
        json={"metadata": {"labels": {"tessera.io/compute-qos": "best-effort"}}},
        headers=headers,
    )
    assert qos.status_code == 422
    assert qos.json()["details"]["causes"][0]["field"] == "metadata.labels.tessera.io/compute-qos"


def test_delete_unbound_pod_removes_it_at_once(tenant) -> None:
    ns = tenant.tenant
    tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("gone"))
    response = tenant.delete(f"/api/v1/namespaces/{ns}/pods/gone")
    assert response.status_code == 200
    assert response.json()["metadata"]["deletionTimestamp"]
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/gone").status_code == 404
    missing = tenant.delete(f"/api/v1/namespaces/{ns}/pods/gone")
    assert missing.status_code == 404 and missing.json()["message"] == 'pods "gone" not found'


def test_bind_marks_scheduled_and_delete_waits_for_the_node(tenant, admin) -> None:
    from tests.conftest import unique

    node = unique("bind-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=2)).status_code == 201
    ns = tenant.tenant
    tenant.post(
        f"/api/v1/namespaces/{ns}/pods",
        json=pod("slice", cpu="2", memory="8Gi", gpu_memory="20Gi", gpu_core=25),
    )
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "slice",
            "annotations": {
                "tessera.io/gpu-allocation": f'[{{"gpu": "{node}-gpu1", "memoryMiB": 20480, "corePercent": 25}}]'
            },
        },
        "target": {"kind": "Node", "name": node},
    }
    forbidden = tenant.post(f"/api/v1/namespaces/{ns}/pods/slice/binding", json=binding)
    assert forbidden.status_code == 403
    bound = admin.post(f"/api/v1/namespaces/{ns}/pods/slice/binding", json=binding)
    assert bound.status_code == 201, bound.text
    current = tenant.get(f"/api/v1/namespaces/{ns}/pods/slice").json()
    assert current["spec"]["nodeName"] == node
    assert {c["type"]: c["status"] for c in current["status"]["conditions"]}[
        "PodScheduled"
    ] == "True"
    gpu = tenant.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu1").json()
    assert gpu["status"]["free"] == {"memory": "60Gi", "corePercent": 75}
    assert gpu["status"]["pods"] == [
        {"namespace": ns, "name": "slice", "memory": "20Gi", "corePercent": 25}
    ]

    again = admin.post(f"/api/v1/namespaces/{ns}/pods/slice/binding", json=binding)
    assert again.status_code == 409 and "already assigned" in again.json()["message"]

    deleting = tenant.delete(f"/api/v1/namespaces/{ns}/pods/slice")
    assert deleting.status_code == 200 and deleting.json()["metadata"]["deletionTimestamp"]
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/slice").status_code == 200
    reasons = [
        e["reason"]
        for e in tenant.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
        if e["involvedObject"]["name"] == "slice"
    ]
    assert "Scheduled" in reasons and "Killing" in reasons

    forced = tenant.delete(f"/api/v1/namespaces/{ns}/pods/slice", params={"gracePeriodSeconds": 0})
    assert forced.status_code == 200
    assert tenant.get(f"/api/v1/namespaces/{ns}/pods/slice").status_code == 404
    gpu = tenant.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu1").json()
    assert (
        gpu["status"]["free"] == {"memory": "80Gi", "corePercent": 100}
        and gpu["status"]["pods"] == []
    )


def test_oversized_bodies_are_refused(tenant) -> None:
    manifest = pod("big")
    manifest["metadata"]["annotations"] = {"blob": "x" * (3 * 1024 * 1024)}
    response = tenant.post(f"/api/v1/namespaces/{tenant.tenant}/pods", json=manifest)
    assert response.status_code == 413 and response.json()["reason"] == "RequestEntityTooLarge"


def _watch(api, path: str, params: dict, count: int) -> list[dict]:
    """The first `count` lines of a watch (it ends after 2 s if fewer come)."""
    import json

    lines: list[dict] = []
    query = {"watch": "true", "timeoutSeconds": "2", **params}
    with api.http.stream("GET", path, params=query, timeout=30) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line:
                lines.append(json.loads(line))
            if len(lines) >= count:
                break
    return lines


def test_a_watch_of_events_sees_new_events_of_its_own_tenant_only(make_tenant) -> None:
    """Events keep their own log (their table, by resourceVersion): a watch from a list's
    version sees the events recorded after it, with field selectors, and nothing of another
    tenant's."""
    a, b = make_tenant("ev"), make_tenant("ev")
    path = f"/api/v1/namespaces/{a.tenant}/events"
    since = a.get(path).json()["metadata"]["resourceVersion"]
    assert (
        a.post(
            f"/api/v1/namespaces/{a.tenant}/pods", json=pod("first", cpu="1.2", memory="1Gi")
        ).status_code
        == 201
    )
    assert b.post(f"/api/v1/namespaces/{b.tenant}/pods", json=pod("theirs")).status_code == 201
    assert a.post(f"/api/v1/namespaces/{a.tenant}/pods", json=pod("second")).status_code == 201
    seen = _watch(a, path, {"resourceVersion": since}, 2)
    assert [
        (e["type"], e["object"]["involvedObject"]["name"], e["object"]["reason"]) for e in seen
    ] == [
        ("ADDED", "first", "SpecRounded"),
        ("ADDED", "second", "Created"),
    ]
    first_rv = seen[0]["object"]["metadata"]["resourceVersion"]
    # resumed from the first event's version: only what came after it
    later = _watch(a, path, {"resourceVersion": first_rv}, 1)
    assert [e["object"]["involvedObject"]["name"] for e in later] == ["second"]
    # a field selector on the involved object
    only = _watch(
        a,
        path,
        {"resourceVersion": since, "fieldSelector": "involvedObject.name=second"},
        1,
    )
    assert [e["object"]["involvedObject"]["name"] for e in only] == ["second"]
    # across namespaces, a tenant still sees only its own
    everywhere = _watch(a, "/api/v1/events", {"resourceVersion": since}, 3)
    assert {e["object"]["metadata"]["namespace"] for e in everywhere} == {a.tenant}
