"""Tenancy: every endpoint, both roles. A tenant never reads, changes or learns of another
tenant's objects; missing, invalid and revoked tokens get 401."""

from __future__ import annotations

import json

import httpx
import pytest

from app.auth import service as auth
from tests.conftest import Api, unique
from tests.factories import gpu_node, pod

MERGE = {"Content-Type": "application/merge-patch+json"}

# (method, path, body, headers): every namespaced operation; {ns} and {name} are filled in.
NAMESPACED = [
    ("GET", "/api/v1/namespaces/{ns}/pods", None, None),
    ("GET", "/api/v1/namespaces/{ns}/pods?watch=true&timeoutSeconds=1", None, None),
    ("POST", "/api/v1/namespaces/{ns}/pods", pod("{name}"), None),
    ("GET", "/api/v1/namespaces/{ns}/pods/{name}", None, None),
    ("PATCH", "/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"labels": {"x": "y"}}}, MERGE),
    ("PUT", "/api/v1/namespaces/{ns}/pods/{name}", pod("{name}"), None),
    ("DELETE", "/api/v1/namespaces/{ns}/pods/{name}", None, None),
    ("POST", "/api/v1/namespaces/{ns}/pods/{name}/binding", {"target": {"name": "n"}}, None),
    ("GET", "/api/v1/namespaces/{ns}/pods/{name}/log", None, None),
    (
        "POST",
        "/api/v1/namespaces/{ns}/pods/{name}/log",
        {"lines": [{"time": "2026-12-04T10:00:00Z", "text": "forged"}]},
        None,
    ),
    ("GET", "/api/v1/namespaces/{ns}/pods/{name}/resize", None, None),
    (
        "PATCH",
        "/api/v1/namespaces/{ns}/pods/{name}/resize",
        {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "3"}}}]}},
        MERGE,
    ),
    ("PUT", "/api/v1/namespaces/{ns}/pods/{name}/resize", pod("{name}"), None),
    ("GET", "/api/v1/namespaces/{ns}/events", None, None),
    ("GET", "/api/v1/namespaces/{ns}", None, None),
    ("PATCH", "/api/v1/namespaces/{ns}", {"metadata": {"labels": {"x": "y"}}}, MERGE),
    ("PUT", "/api/v1/namespaces/{ns}", {"metadata": {"name": "{ns}"}}, None),
    ("DELETE", "/api/v1/namespaces/{ns}", None, None),
    ("GET", "/apis/tessera.io/v1/namespaces/{ns}/podgroups", None, None),
    (
        "POST",
        "/apis/tessera.io/v1/namespaces/{ns}/podgroups",
        {"metadata": {"name": "{name}"}, "spec": {"minMember": 1}},
        None,
    ),
    ("GET", "/apis/tessera.io/v1/namespaces/{ns}/podgroups/{name}", None, None),
    (
        "PATCH",
        "/apis/tessera.io/v1/namespaces/{ns}/podgroups/{name}",
        {"spec": {"minMember": 3}},
        MERGE,
    ),
    ("DELETE", "/apis/tessera.io/v1/namespaces/{ns}/podgroups/{name}", None, None),
    ("GET", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", None, None),
    (
        "GET",
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups?watch=true&timeoutSeconds=1",
        None,
        None,
    ),
    (
        "POST",
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
        {"metadata": {"name": "{name}"}, "spec": {"minMember": 1}},
        None,
    ),
    ("GET", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}", None, None),
    (
        "PATCH",
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
        {"spec": {"minMember": 3}},
        MERGE,
    ),
    (
        "PUT",
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
        {"metadata": {"name": "{name}"}, "spec": {"minMember": 2}},
        None,
    ),
    ("DELETE", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}", None, None),
    ("GET", "/apis/tessera.io/v1/namespaces/{ns}/callbacks", None, None),
    (
        "GET",
        "/apis/tessera.io/v1/namespaces/{ns}/callbacks?watch=true&timeoutSeconds=1",
        None,
        None,
    ),
    (
        "POST",
        "/apis/tessera.io/v1/namespaces/{ns}/callbacks",
        {
            "metadata": {"name": "{name}"},
            "spec": {"url": "https://evil.example/", "events": ["PodFinished"]},
        },
        None,
    ),
    ("GET", "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}", None, None),
    (
        "PATCH",
        "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}",
        {"spec": {"url": "https://evil.example/"}},
        MERGE,
    ),
    (
        "PUT",
        "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}",
        {
            "metadata": {"name": "{name}"},
            "spec": {"url": "https://evil.example/", "events": ["PodFinished"]},
        },
        None,
    ),
    ("DELETE", "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}", None, None),
    ("POST", "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}/rotate", None, None),
    ("GET", "/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}/deliveries", None, None),
    (
        "PATCH",
        "/api/v1/namespaces/{ns}/pods/{name}/status",
        {"status": {"phase": "Running"}},
        MERGE,
    ),
    ("GET", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", None, None),
    ("GET", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", None, None),
]
ADMIN_ONLY = [
    ("POST", "/api/v1/nodes", gpu_node("tenant-made"), None),
    ("PATCH", "/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, MERGE),
    ("PUT", "/api/v1/nodes/{node}", gpu_node("{node}"), None),
    ("DELETE", "/api/v1/nodes/{node}", None, None),
    (
        "PATCH",
        "/apis/tessera.io/v1/gpudevices/{node}-gpu0",
        {"status": {"health": "Unhealthy"}},
        MERGE,
    ),
    (
        "POST",
        "/apis/tessera.io/v1/gpudevices/{node}-gpu0/fault",
        {"spec": {"kind": "xid", "xid": 79}},
        None,
    ),
    ("POST", "/apis/tessera.io/v1/gpudevices/{node}-gpu0/repair", None, None),
    ("POST", "/apis/tessera.io/v1/gpudevices/no-such-gpu/fault", {"spec": {"kind": "ecc"}}, None),
    ("GET", "/apis/tessera.io/v1/tenants", None, None),
    ("POST", "/apis/tessera.io/v1/tenants", {"metadata": {"name": "sneaky"}}, None),
    ("GET", "/apis/tessera.io/v1/tenants/{other}", None, None),
    ("POST", "/apis/tessera.io/v1/tenants/{other}/tokens", {}, None),
]
READ_ONLY_SHARED = [
    "/api/v1/nodes",
    "/api/v1/nodes/{node}",
    "/apis/tessera.io/v1/gpudevices",
    "/apis/tessera.io/v1/gpudevices/{node}-gpu0",
]
EVERYTHING = [
    *[(m, p, b, h) for m, p, b, h in NAMESPACED],
    *ADMIN_ONLY,
    *[("GET", p, None, None) for p in READ_ONLY_SHARED],
    ("GET", "/api/v1/pods", None, None),
    ("GET", "/api/v1/events", None, None),
    ("GET", "/api/v1/namespaces", None, None),
    ("POST", "/api/v1/namespaces", {"metadata": {"name": "x"}}, None),
    ("GET", "/apis/tessera.io/v1/podgroups", None, None),
    ("GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups", None, None),
    ("GET", "/apis/tessera.io/v1/callbacks", None, None),
]


def fill(template: object, **values: str) -> object:
    text = json.dumps(template)
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return json.loads(text)


def call(
    client: httpx.Client,
    method: str,
    path: str,
    body: object,
    headers: dict[str, str] | None,
    **values: str,
) -> httpx.Response:
    return client.request(
        method,
        str(fill(path, **values)),
        json=fill(body, **values) if body is not None else None,
        headers=headers,
    )


@pytest.fixture
def two_tenants(make_tenant, admin):
    owner, intruder = make_tenant("own"), make_tenant("intr")
    assert (
        owner.post(
            f"/api/v1/namespaces/{owner.tenant}/pods", json=pod("secret", cpu="1", memory="2Gi")
        ).status_code
        == 201
    )
    hook = {
        "metadata": {"name": "secret"},
        "spec": {"url": "https://hooks.example.com/own", "events": ["PodFinished"]},
    }
    callbacks = f"/apis/tessera.io/v1/namespaces/{owner.tenant}/callbacks"
    assert owner.post(callbacks, json=hook).status_code == 201
    gang = {"metadata": {"name": "secret"}, "spec": {"minMember": 4}}
    coscheduling = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{owner.tenant}/podgroups"
    assert owner.post(coscheduling, json=gang).status_code == 201
    node = unique("tn-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    return owner, intruder, node


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), NAMESPACED, ids=[f"{m} {p}" for m, p, _, _ in NAMESPACED]
)
def test_another_tenants_namespace_is_forbidden_whether_or_not_it_exists(
    two_tenants, method, path, body, headers
) -> None:
    owner, intruder, _node = two_tenants
    existing = call(intruder.http, method, path, body, headers, ns=owner.tenant, name="secret")
    missing = call(intruder.http, method, path, body, headers, ns=owner.tenant, name="nothing")
    ghost_ns = call(intruder.http, method, path, body, headers, ns=unique("ghost"), name="secret")
    for response in (existing, missing, ghost_ns):
        assert response.status_code == 403, (method, path, response.text)
        status = response.json()
        assert status["kind"] == "Status" and status["reason"] == "Forbidden"
    # Nothing tells the intruder whether "secret" exists: the answers differ only by the name asked.
    assert existing.json() == json.loads(json.dumps(missing.json()).replace("nothing", "secret"))
    # And nothing was changed: the owner still sees its pod as it was.
    still = owner.get(f"/api/v1/namespaces/{owner.tenant}/pods/secret").json()
    assert "x" not in still["metadata"].get("labels", {})
    hook = owner.get(f"/apis/tessera.io/v1/namespaces/{owner.tenant}/callbacks/secret").json()
    assert hook["spec"]["url"] == "https://hooks.example.com/own"
    gang = owner.get(
        f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{owner.tenant}/podgroups/secret"
    ).json()
    assert gang["spec"]["minMember"] == 4


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), NAMESPACED, ids=[f"{m} {p}" for m, p, _, _ in NAMESPACED]
)
def test_a_node_sees_nothing_of_a_tenant_but_the_pods_bound_to_it(
    two_tenants, make_node_agent, method, path, body, headers
) -> None:
    """The tenant's pod is not bound to the node: its token is refused alike whether the pod
    (or the namespace) exists or not."""
    owner, _intruder, node = two_tenants
    agent = make_node_agent(node)
    existing = call(agent.http, method, path, body, headers, ns=owner.tenant, name="secret")
    missing = call(agent.http, method, path, body, headers, ns=owner.tenant, name="nothing")
    ghost_ns = call(agent.http, method, path, body, headers, ns=unique("ghost"), name="secret")
    for response in (existing, missing, ghost_ns):
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["reason"] == "Forbidden"
        assert f'node "{node}"' in response.json()["message"]
    assert existing.json() == json.loads(json.dumps(missing.json()).replace("nothing", "secret"))
    still = owner.get(f"/api/v1/namespaces/{owner.tenant}/pods/secret").json()
    assert "x" not in still["metadata"].get("labels", {}) and still["status"]["phase"] == "Pending"


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), ADMIN_ONLY, ids=[f"{m} {p}" for m, p, _, _ in ADMIN_ONLY]
)
def test_another_nodes_inventory_and_the_tenants_are_not_a_nodes(
    two_tenants, admin, make_node_agent, method, path, body, headers
) -> None:
    owner, _intruder, node = two_tenants
    elsewhere = make_node_agent(unique("tn-other-"))
    response = call(elsewhere.http, method, path, body, headers, node=node, other=owner.tenant)
    assert response.status_code == 403, response.text
    assert response.json()["reason"] == "Forbidden"
    assert admin.get(f"/api/v1/nodes/{node}").json()["spec"] == {}


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), ADMIN_ONLY, ids=[f"{m} {p}" for m, p, _, _ in ADMIN_ONLY]
)
def test_inventory_and_tenants_are_the_admins(
    two_tenants, admin, method, path, body, headers
) -> None:
    owner, intruder, node = two_tenants
    response = call(intruder.http, method, path, body, headers, node=node, other=owner.tenant)
    assert response.status_code == 403, response.text
    assert response.json()["reason"] == "Forbidden"
    assert admin.get(f"/api/v1/nodes/{node}").json()["spec"] == {}


@pytest.mark.parametrize("path", READ_ONLY_SHARED)
def test_tenants_read_the_pool_but_not_other_tenants_pods_in_it(two_tenants, admin, path) -> None:
    owner, intruder, node = two_tenants
    ns = owner.tenant
    owner.post(f"/api/v1/namespaces/{ns}/pods", json=pod("on-gpu", gpus=1))
    binding = {
        "target": {"kind": "Node", "name": node},
        "metadata": {
            "annotations": {
                "tessera.io/gpu-allocation": json.dumps(
                    [{"gpu": f"{node}-gpu0", "memoryMiB": 81920, "corePercent": 100}]
                )
            }
        },
    }
    assert (
        admin.post(f"/api/v1/namespaces/{ns}/pods/on-gpu/binding", json=binding).status_code == 201
    )
    seen_by_intruder = intruder.get(str(fill(path, node=node)))
    assert seen_by_intruder.status_code == 200
    assert ns not in seen_by_intruder.text and "on-gpu" not in seen_by_intruder.text
    seen_by_owner = owner.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu0").json()
    assert seen_by_owner["status"]["pods"][0]["name"] == "on-gpu"
    assert (
        admin.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu0").json()["status"]["pods"][0][
            "namespace"
        ]
        == ns
    )


def test_lists_never_return_another_tenants_rows(two_tenants, admin) -> None:
    owner, intruder, _ = two_tenants
    intruder.post(f"/api/v1/namespaces/{intruder.tenant}/pods", json=pod("mine"))
    intruder.post(
        f"/apis/tessera.io/v1/namespaces/{intruder.tenant}/podgroups",
        json={"metadata": {"name": "g"}, "spec": {"minMember": 1}},
    )
    intruder.post(
        f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{intruder.tenant}/podgroups",
        json={"metadata": {"name": "xg"}, "spec": {"minMember": 1}},
    )
    intruder.post(
        f"/apis/tessera.io/v1/namespaces/{intruder.tenant}/callbacks",
        json={
            "metadata": {"name": "h"},
            "spec": {"url": "https://h.example/", "events": ["GPUFault"]},
        },
    )
    for path in (
        "/api/v1/pods",
        "/api/v1/events",
        "/api/v1/namespaces",
        "/apis/tessera.io/v1/podgroups",
        "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
        "/apis/tessera.io/v1/callbacks",
    ):
        body = intruder.get(path).json()
        namespaces = {i["metadata"].get("namespace", i["metadata"]["name"]) for i in body["items"]}
        assert namespaces == {intruder.tenant}, path
    everything = admin.get("/api/v1/pods").json()["items"]
    assert {owner.tenant, intruder.tenant} <= {p["metadata"]["namespace"] for p in everything}


def test_namespaces_a_tenant_may_create(tenant, make_tenant) -> None:
    other = make_tenant("nsx")
    mine = tenant.post("/api/v1/namespaces", json={"metadata": {"name": f"{tenant.tenant}-dev"}})
    assert mine.status_code == 201
    assert (
        tenant.post(f"/api/v1/namespaces/{tenant.tenant}-dev/pods", json=pod("p")).status_code
        == 201
    )
    theirs = tenant.post("/api/v1/namespaces", json={"metadata": {"name": f"{other.tenant}-x"}})
    assert theirs.status_code == 403
    dup = tenant.post("/api/v1/namespaces", json={"metadata": {"name": f"{tenant.tenant}-dev"}})
    assert dup.status_code == 409
    # Deleting it deletes the pod it holds (never placed: at once) and then the namespace.
    busy = tenant.delete(f"/api/v1/namespaces/{tenant.tenant}-dev")
    assert busy.status_code == 200
    assert tenant.get(f"/api/v1/namespaces/{tenant.tenant}-dev").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), EVERYTHING, ids=[f"{m} {p}" for m, p, _, _ in EVERYTHING]
)
def test_missing_invalid_and_revoked_tokens_are_401(
    server, tenant, method, path, body, headers
) -> None:
    revoked = server.services.db.write(
        lambda s: auth.create_token(s, role="tenant", tenant=tenant.tenant)
    ).value
    server.services.db.write(lambda s: auth.revoke_token(s, key_id=revoked))
    values = {"ns": tenant.tenant, "name": "x", "node": "n", "other": "o"}
    for token in (None, "not-a-token", "tsr_0123456789abcdef_wrong", revoked):
        client = Api(server.url, token or "").http
        if token is None:
            client.headers.pop("Authorization")
        response = call(client, method, path, body, headers, **values)
        assert response.status_code == 401, (token, response.text)
        assert response.json()["reason"] == "Unauthorized"
