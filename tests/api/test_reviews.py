"""Access reviews (`kubectl auth can-i`, `kubectl auth whoami`) answer from the rules the API
enforces: for every served verb and resource, as the admin and as a tenant in its own and in
another tenant's namespace, can-i says yes exactly when the real request is not refused."""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from app import kubeconfig
from app.auth import service as auth
from app.kube.resources import RESOURCES
from app.tls import ensure_tls
from tests.conftest import IN_CI, Api, ThreadedServer, unique
from tests.factories import gpu_node, pod

MERGE = {"Content-Type": "application/merge-patch+json"}
DRY = "dryRun=All"
AUTHORIZATION = "/apis/authorization.k8s.io/v1"
AUTHENTICATION = "/apis/authentication.k8s.io/v1"


def can_i(
    api: Api,
    verb: str,
    resource: str,
    *,
    group: str = "",
    sub: str = "",
    ns: str = "",
    name: str = "",
) -> dict:
    attributes = {
        "verb": verb,
        "resource": resource,
        "group": group,
        "subresource": sub,
        "namespace": ns,
        "name": name,
    }
    response = api.post(
        f"{AUTHORIZATION}/selfsubjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {k: v for k, v in attributes.items() if v}},
        },
    )
    assert response.status_code == 201, response.text
    review = response.json()
    assert review["kind"] == "SelfSubjectAccessReview"
    assert review["spec"]["resourceAttributes"]["verb"] == verb  # the spec is echoed
    return review["status"]


@dataclass
class World:
    admin: Api
    owner: Api
    other: Api
    node: str
    agent: Api  # the node's own token (its agent)
    controller: Api  # the controller manager's token

    def namespaced(self, ns: str, what: str) -> str:
        """A fresh object in `ns` made by the admin: a pod or a pod group; returns its name."""
        name = unique(what[:3] + "-")
        if what == "pods":
            response = self.admin.post(f"/api/v1/namespaces/{ns}/pods", json=pod(name))
        else:
            response = self.admin.post(
                f"/apis/tessera.io/v1/namespaces/{ns}/podgroups",
                json={"metadata": {"name": name}, "spec": {"minMember": 1}},
            )
        assert response.status_code == 201, response.text
        return name

    def fresh_node(self) -> str:
        name = unique("rv-")
        assert self.admin.post("/api/v1/nodes", json=gpu_node(name, gpus=1)).status_code == 201
        return name


def watch(api: Api, path: str) -> int:
    with api.http.stream("GET", path, params={"watch": "true", "timeoutSeconds": "1"}) as response:
        return response.status_code


def pods(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"/api/v1/namespaces/{ns}/pods"
    if verb == "create":
        return "", api.post(f"{base}?{DRY}", json=pod(unique("new-"))).status_code
    if verb == "list":
        return "", api.get(base).status_code
    if verb == "watch":
        return "", watch(api, base)
    if verb == "deletecollection":
        return "", api.delete(f"{base}?{DRY}&labelSelector=matches%3Dnothing").status_code
    name = w.namespaced(ns, "pods")
    path = f"{base}/{name}"
    if verb == "get":
        return name, api.get(path).status_code
    if verb == "patch":
        body = {"metadata": {"labels": {"x": "y"}}}
        return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
    if verb == "update":
        current = w.admin.get(path).json()
        current["metadata"]["labels"] = {"x": "y"}
        return name, api.put(f"{path}?{DRY}", json=current).status_code
    assert verb == "delete"
    return name, api.delete(f"{path}?{DRY}").status_code


def pod_batches(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    assert verb == "create"
    body = {"apiVersion": "tessera.io/v1", "kind": "PodBatch", "items": [pod(unique("b-"))]}
    return "", api.post(
        f"/apis/tessera.io/v1/namespaces/{ns}/podbatches?{DRY}", json=body
    ).status_code


def binding(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = w.namespaced(ns, "pods")
    body = {"target": {"kind": "Node", "name": w.node}}
    return name, api.post(
        f"/api/v1/namespaces/{ns}/pods/{name}/binding?{DRY}", json=body
    ).status_code


def eviction(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = w.namespaced(ns, "pods")
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    return name, api.post(
        f"/api/v1/namespaces/{ns}/pods/{name}/eviction?{DRY}", json=body
    ).status_code


def log(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = w.namespaced(ns, "pods")
    path = f"/api/v1/namespaces/{ns}/pods/{name}/log"
    if verb == "create":  # what a node agent sends; the pod here is bound to no node
        lines = [{"time": "2026-12-04T10:00:00Z", "text": "hello"}]
        return name, api.post(path, json={"lines": lines}).status_code
    status = api.get(path).status_code
    return name, 200 if status == 400 else status  # allowed: "is waiting to start"


def session(sub: str) -> Callable[[World, Api, str, str], tuple[str, int]]:
    """exec, attach, port-forward: a plain request (POST: create, GET: get) is answered 400
    ("served over WebSocket") once allowed; the pod here is bound to no node."""

    def call(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
        name = w.namespaced(ns, "pods")
        path = f"/api/v1/namespaces/{ns}/pods/{name}/{sub}?command=ls&stdout=true&ports=80"
        status = (api.post if verb == "create" else api.get)(path).status_code
        return name, 200 if status == 400 else status

    return call


def pod_metrics(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods"
    if verb == "list":
        return "", api.get(base).status_code
    name = w.namespaced(ns, "pods")
    return name, api.get(f"{base}/{name}").status_code  # 404: no usage reported, once allowed


def node_metrics(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = "/apis/metrics.k8s.io/v1beta1/nodes"
    if verb == "list":
        return "", api.get(base).status_code
    return w.node, api.get(f"{base}/{w.node}").status_code


def resize(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = w.namespaced(ns, "pods")
    path = f"/api/v1/namespaces/{ns}/pods/{name}/resize"
    asks = {"requests": {"cpu": "3", "memory": "6Gi"}}
    if verb == "get":
        return name, api.get(path).status_code
    if verb == "patch":
        body = {"spec": {"containers": [{"name": "main", "resources": asks}]}}
        return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
    assert verb == "update"
    current = w.admin.get(path).json()
    current["spec"]["containers"][0]["resources"] = asks
    return name, api.put(f"{path}?{DRY}", json=current).status_code


def events(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"/api/v1/namespaces/{ns}/events"
    if verb == "create":  # about a pod bound to no node: only the admin may (404 for it)
        body = {
            "involvedObject": {"kind": "Pod", "name": "no-such-pod"},
            "reason": "Pulled",
            "message": "",
        }
        return "", api.post(base, json=body).status_code
    return "", (api.get(base).status_code if verb == "list" else watch(api, base))


def budgets(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    if verb == "list":
        return "", api.get(base).status_code
    return "pdb", api.get(f"{base}/pdb").status_code  # none exist: 404 once allowed


def _callback(w: World, ns: str) -> str:
    """A fresh callback in `ns` made by the admin; returns its name."""
    name = unique("cb-")
    response = w.admin.post(
        f"/apis/tessera.io/v1/namespaces/{ns}/callbacks",
        json={
            "metadata": {"name": name},
            "spec": {"url": "https://hooks.example.com/x", "events": ["PodFinished"]},
        },
    )
    assert response.status_code == 201, response.text
    return name


def callback_rotate(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = _callback(w, ns)
    path = f"/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}/rotate"
    return name, api.post(path).status_code


def callback_deliveries(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = _callback(w, ns)
    path = f"/apis/tessera.io/v1/namespaces/{ns}/callbacks/{name}/deliveries"
    return name, api.get(path).status_code


def namespaces(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    """For namespaces the namespace asked about is the object itself (`ns`, or `ns-<suffix>`
    when creating one)."""
    if verb == "create":
        name = unique(f"{ns}-")
        return name, api.post(
            f"/api/v1/namespaces?{DRY}", json={"metadata": {"name": name}}
        ).status_code
    if verb == "list":
        return "", api.get("/api/v1/namespaces").status_code
    if verb == "watch":
        return "", watch(api, "/api/v1/namespaces")
    path = f"/api/v1/namespaces/{ns}"
    if verb == "get":
        return ns, api.get(path).status_code
    if verb == "patch":
        body = {"metadata": {"labels": {"x": "y"}}}
        return ns, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
    if verb == "update":
        return ns, api.put(f"{path}?{DRY}", json={"metadata": {"name": ns}}).status_code
    assert verb == "delete"
    return ns, api.delete(f"{path}?{DRY}").status_code


def nodes(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    if verb == "create":
        name = unique("made-")
        status = api.post("/api/v1/nodes", json=gpu_node(name, gpus=1)).status_code
        w.admin.delete(f"/api/v1/nodes/{name}")
        return "", status
    if verb == "list":
        return "", api.get("/api/v1/nodes").status_code
    if verb == "watch":
        return "", watch(api, "/api/v1/nodes")
    name = w.fresh_node()
    path = f"/api/v1/nodes/{name}"
    try:
        if verb == "get":
            return name, api.get(path).status_code
        if verb == "patch":
            body = {"metadata": {"labels": {"x": "y"}}}
            return name, api.patch(path, json=body, headers=MERGE).status_code
        if verb == "update":
            return name, api.put(path, json=gpu_node(name, gpus=1)).status_code
        assert verb == "delete"
        return name, api.delete(path).status_code
    finally:
        w.admin.delete(path)


def gpudevices(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = "/apis/tessera.io/v1/gpudevices"
    name = f"{w.node}-gpu0"
    if verb == "list":
        return "", api.get(base).status_code
    if verb == "watch":
        return "", watch(api, base)
    if verb == "get":
        return name, api.get(f"{base}/{name}").status_code
    assert verb == "patch"
    body = {"status": {"health": "Healthy"}}
    return name, api.patch(f"{base}/{name}", json=body, headers=MERGE).status_code


def gpu_faults(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = f"{w.node}-gpu0"
    base = f"/apis/tessera.io/v1/gpudevices/{name}"
    status = api.post(f"{base}/fault", json={"spec": {"kind": "ecc"}}).status_code
    assert w.admin.post(f"{base}/repair").status_code == 200
    return name, status


def gpu_repairs(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = f"{w.node}-gpu0"
    return name, api.post(f"/apis/tessera.io/v1/gpudevices/{name}/repair").status_code


def tenants(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = "/apis/tessera.io/v1/tenants"
    if verb == "create":
        return "", api.post(base, json={"metadata": {"name": unique("made")}}).status_code
    if verb == "list":
        return "", api.get(base).status_code
    name = str(w.other.tenant)
    if verb == "update":
        body = {"metadata": {"name": name}, "spec": {"budget": {"daily": "1"}}}
        return name, api.put(f"{base}/{name}?{DRY}", json=body).status_code
    if verb == "patch":
        patched = api.patch(
            f"{base}/{name}?{DRY}",
            json={"spec": {"budget": {"daily": "1"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return name, patched.status_code
    assert verb == "get"
    return name, api.get(f"{base}/{name}").status_code


def tokens(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    name = str(w.other.tenant)
    return name, api.post(f"/apis/tessera.io/v1/tenants/{name}/tokens", json={}).status_code


LEASES = "/apis/coordination.k8s.io/v1"


def leases(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    """The lease named like the world's node: its agent's own in kube-node-lease, anyone's
    elsewhere."""
    base = f"{LEASES}/namespaces/{ns}/leases"
    name = w.node
    body = {"metadata": {"name": name}, "spec": {"holderIdentity": name}}
    if verb == "create":
        return name, api.post(f"{base}?{DRY}", json=body).status_code
    if verb == "list":
        return "", api.get(base).status_code
    if verb == "watch":
        return "", watch(api, base)
    if verb == "deletecollection":
        return "", api.delete(f"{base}?{DRY}&labelSelector=matches%3Dnothing").status_code
    assert w.admin.post(base, json=body).status_code in (201, 409)
    path = f"{base}/{name}"
    if verb == "get":
        return name, api.get(path).status_code
    if verb == "patch":
        patch = {"spec": {"leaseDurationSeconds": 40}}
        return name, api.patch(f"{path}?{DRY}", json=patch, headers=MERGE).status_code
    if verb == "update":
        return name, api.put(f"{path}?{DRY}", json=body).status_code
    assert verb == "delete"
    return name, api.delete(f"{path}?{DRY}").status_code


def pod_status(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    """A fresh pod, not bound: the admin's report is refused 409 (allowed, but not yet)."""
    name = w.namespaced(ns, "pods")
    path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
    if verb == "get":
        return name, api.get(path).status_code
    if verb == "patch":
        body = {"status": {"phase": "Running"}}
        return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
    assert verb == "update"
    current = w.admin.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
    current["status"]["phase"] = "Running"
    return name, api.put(f"{path}?{DRY}", json=current).status_code


def nodetokens(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    body = {"apiVersion": "tessera.io/v1", "kind": "NodeToken", "node": w.node}
    return "", api.post("/apis/tessera.io/v1/nodetokens", json=body).status_code


BILLING = "/apis/billing.tessera.io/v1"


def prices(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    def body(name: str) -> dict:
        at = datetime.now(UTC) + timedelta(days=1000, seconds=random.randrange(10**8))
        spec = {
            "effectiveFrom": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "compute": {
                c: {"vcpuHour": "0.04", "memoryGiBHour": "0.004"}
                for c in ("general-purpose", "performance", "gpu")
            },
            "gpus": {"*": {"vramGiBHour": "0.02", "smPercentHour": "0.03"}},
        }
        return {"metadata": {"name": name}, "spec": spec}

    if verb == "create":
        return "", api.post(f"{BILLING}/prices", json=body(unique("pr-"))).status_code
    if verb == "list":
        return "", api.get(f"{BILLING}/prices").status_code
    name = unique("pr-")
    assert w.admin.post(f"{BILLING}/prices", json=body(name)).status_code == 201
    if verb == "get":
        return name, api.get(f"{BILLING}/prices/{name}").status_code
    if verb == "patch":
        label = {"metadata": {"labels": {"x": "y"}}}
        path = f"{BILLING}/prices/{name}?{DRY}"
        status = api.patch(path, json=label, headers=MERGE).status_code
        w.admin.delete(f"{BILLING}/prices/{name}")
        return name, status
    assert verb == "delete"
    status = api.delete(f"{BILLING}/prices/{name}").status_code
    w.admin.delete(f"{BILLING}/prices/{name}")
    return name, status


def commitments(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"{BILLING}/namespaces/{ns}/commitments"
    plan = {"metadata": {"name": "plan"}, "spec": {"amountPerDay": "25"}}
    if verb == "create":
        status = api.post(base, json=plan).status_code
        return "", 201 if status == 409 else status  # allowed: one plan per tenant
    if verb == "list":
        return "", api.get(base).status_code
    if verb == "watch":
        return "", watch(api, base)
    if verb == "deletecollection":
        return "", api.delete(f"{base}?{DRY}").status_code
    if w.admin.get(f"{base}/plan").status_code == 404:
        assert w.admin.post(base, json=plan).status_code == 201
    if verb == "get":
        return "plan", api.get(f"{base}/plan").status_code
    if verb == "patch":
        body = {"spec": {"amountPerDay": "30"}}
        return "plan", api.patch(f"{base}/plan", json=body, headers=MERGE).status_code
    if verb == "update":
        current = w.admin.get(f"{base}/plan").json()
        return "plan", api.put(f"{base}/plan?{DRY}", json=current).status_code
    assert verb == "delete"
    return "plan", api.delete(f"{base}/plan").status_code


def statements(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    base = f"{BILLING}/namespaces/{ns}/statements"
    if verb == "list":
        return "", api.get(base).status_code
    day = datetime.now(UTC).date().isoformat()
    return day, api.get(f"{base}/{day}").status_code  # 404 without usage, once allowed


def usage(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    return "", api.get(f"{BILLING}/namespaces/{ns}/usage").status_code


JOB_SPEC = {
    "suspend": True,
    "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
    },
}
BODIES: dict[str, dict] = {
    "jobs": {"spec": JOB_SPEC},
    "cronjobs": {
        "spec": {"schedule": "@daily", "suspend": True, "jobTemplate": {"spec": JOB_SPEC}}
    },
    "jobsets": {
        "spec": {"suspend": True, "replicatedJobs": [{"name": "w", "template": {"spec": JOB_SPEC}}]}
    },
}


def registry_kind(
    resource: str,
    group: str = "",
    make: Callable[[str], dict] | None = None,
    version: str = "v1",
) -> Callable[[World, Api, str, str], tuple[str, int]]:
    """A kind the generic registry keeps (a ConfigMap, a Deployment): every verb, dry runs."""
    prefix = f"/apis/{group}/{version}" if group else "/api/v1"
    body_of = make or (lambda name: {"metadata": {"name": name}})

    def call(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
        base = f"{prefix}/namespaces/{ns}/{resource}"
        if verb == "create":
            return "", api.post(f"{base}?{DRY}", json=body_of("x")).status_code
        if verb == "list":
            return "", api.get(base).status_code
        if verb == "watch":
            return "", watch(api, base)
        if verb == "deletecollection":
            return "", api.delete(f"{base}?{DRY}&labelSelector=matches%3Dnothing").status_code
        name = unique("reg-")
        assert w.admin.post(base, json=body_of(name)).status_code == 201
        path = f"{base}/{name}"
        if verb == "get":
            return name, api.get(path).status_code
        if verb == "patch":
            body = {"metadata": {"labels": {"x": "y"}}}
            return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
        if verb == "update":
            current = w.admin.get(path).json()
            return name, api.put(f"{path}?{DRY}", json=current).status_code
        assert verb == "delete"
        return name, api.delete(f"{path}?{DRY}").status_code

    return call


def workload(kind: str) -> Callable[[str], dict]:
    def make(name: str) -> dict:
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"run": name}},
                "template": {
                    "metadata": {"labels": {"run": name}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        }

    return make


def workload_sub(
    resource: str, kind: str, sub: str
) -> Callable[[World, Api, str, str], tuple[str, int]]:
    """A workload's status or scale subresource: get, patch, update (dry runs)."""

    def call(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
        base = f"/apis/apps/v1/namespaces/{ns}/{resource}"
        name = unique("wl-")
        assert w.admin.post(base, json=workload(kind)(name)).status_code == 201
        path = f"{base}/{name}/{sub}"
        if verb == "get":
            return name, api.get(path).status_code
        if verb == "patch":
            body = {"spec": {"replicas": 2}} if sub == "scale" else {"status": {"replicas": 1}}
            return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
        assert verb == "update"
        current = w.admin.get(path).json()
        return name, api.put(f"{path}?{DRY}", json=current).status_code

    return call


def quota_status(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
    """A ResourceQuota's status: computed as it is read, written only by the admin."""
    base = f"/api/v1/namespaces/{ns}/resourcequotas"
    name = unique("rq-")
    assert w.admin.post(base, json={"metadata": {"name": name}}).status_code == 201
    path = f"{base}/{name}/status"
    if verb == "get":
        return name, api.get(path).status_code
    if verb == "patch":
        body = {"status": {"hard": {"pods": "1"}}}
        return name, api.patch(f"{path}?{DRY}", json=body, headers=MERGE).status_code
    assert verb == "update"
    current = w.admin.get(path).json()
    return name, api.put(f"{path}?{DRY}", json=current).status_code


def registry_status(
    resource: str, status: dict, prefix: str = "/apis/batch/v1"
) -> Callable[[World, Api, str, str], tuple[str, int]]:
    """The status subresource of a workload kind the registry keeps."""

    def call(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
        base = f"{prefix}/namespaces/{ns}/{resource}"
        name = unique("st-")
        made = w.admin.post(base, json={"metadata": {"name": name}, **BODIES[resource]})
        assert made.status_code == 201, made.text
        path = f"{base}/{name}/status"
        if verb == "get":
            return name, api.get(path).status_code
        if verb == "patch":
            return name, api.patch(
                f"{path}?{DRY}", json={"status": status}, headers=MERGE
            ).status_code
        assert verb == "update"
        current = w.admin.get(path).json()
        return name, api.put(f"{path}?{DRY}", json=current).status_code

    return call


def review(path: str, body: dict) -> Callable[[World, Api, str, str], tuple[str, int]]:
    def call(w: World, api: Api, ns: str, verb: str) -> tuple[str, int]:
        return "", api.post(path, json=body).status_code

    return call


# (group, resource[/subresource]) -> the real request for a verb; every served pair is here.
REQUESTS: dict[tuple[str, str], Callable[[World, Api, str, str], tuple[str, int]]] = {
    ("", "pods"): pods,
    ("", "pods/binding"): binding,
    ("tessera.io", "podbatches"): pod_batches,
    ("", "pods/eviction"): eviction,
    ("", "pods/log"): log,
    ("", "pods/exec"): session("exec"),
    ("", "pods/attach"): session("attach"),
    ("", "pods/portforward"): session("portforward"),
    ("metrics.k8s.io", "pods"): pod_metrics,
    ("metrics.k8s.io", "nodes"): node_metrics,
    ("", "pods/resize"): resize,
    ("", "pods/status"): pod_status,
    ("coordination.k8s.io", "leases"): leases,
    ("", "events"): events,
    ("", "services"): registry_kind(
        "services",
        make=lambda name: {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}},
    ),
    ("discovery.k8s.io", "endpointslices"): registry_kind(
        "endpointslices",
        "discovery.k8s.io",
        lambda name: {"metadata": {"name": name}, "addressType": "IPv4"},
    ),
    ("policy", "poddisruptionbudgets"): budgets,
    ("", "namespaces"): namespaces,
    ("", "nodes"): nodes,
    ("tessera.io", "gpudevices"): gpudevices,
    ("tessera.io", "gpudevices/fault"): gpu_faults,
    ("tessera.io", "gpudevices/repair"): gpu_repairs,
    ("tessera.io", "podgroups"): registry_kind(
        "podgroups", "tessera.io", lambda n: {"metadata": {"name": n}, "spec": {"minMember": 1}}
    ),
    ("scheduling.x-k8s.io", "podgroups"): registry_kind(
        "podgroups",
        "scheduling.x-k8s.io",
        lambda n: {"metadata": {"name": n}, "spec": {"minMember": 1}},
        "v1alpha1",
    ),
    ("tessera.io", "callbacks"): registry_kind(
        "callbacks",
        "tessera.io",
        lambda n: {
            "metadata": {"name": n},
            "spec": {"url": "https://hooks.example.com/x", "events": ["PodFinished"]},
        },
    ),
    ("tessera.io", "callbacks/rotate"): callback_rotate,
    ("tessera.io", "callbacks/deliveries"): callback_deliveries,
    ("tessera.io", "tenants"): tenants,
    ("tessera.io", "tenants/tokens"): tokens,
    ("tessera.io", "nodetokens"): nodetokens,
    ("billing.tessera.io", "prices"): prices,
    ("billing.tessera.io", "commitments"): commitments,
    ("billing.tessera.io", "statements"): statements,
    ("billing.tessera.io", "usage"): usage,
    ("", "configmaps"): registry_kind("configmaps"),
    ("", "secrets"): registry_kind("secrets"),
    ("", "resourcequotas"): registry_kind("resourcequotas"),
    ("", "resourcequotas/status"): quota_status,
    ("apps", "replicasets"): registry_kind("replicasets", "apps", workload("ReplicaSet")),
    ("apps", "replicasets/status"): workload_sub("replicasets", "ReplicaSet", "status"),
    ("apps", "replicasets/scale"): workload_sub("replicasets", "ReplicaSet", "scale"),
    ("apps", "deployments"): registry_kind("deployments", "apps", workload("Deployment")),
    ("apps", "deployments/status"): workload_sub("deployments", "Deployment", "status"),
    ("apps", "deployments/scale"): workload_sub("deployments", "Deployment", "scale"),
    ("batch", "jobs"): registry_kind(
        "jobs", "batch", lambda n: {"metadata": {"name": n}, **BODIES["jobs"]}
    ),
    ("batch", "jobs/status"): registry_status("jobs", {"active": 1}),
    ("batch", "cronjobs"): registry_kind(
        "cronjobs", "batch", lambda n: {"metadata": {"name": n}, **BODIES["cronjobs"]}
    ),
    ("batch", "cronjobs/status"): registry_status("cronjobs", {"active": []}),
    ("jobset.x-k8s.io", "jobsets"): registry_kind(
        "jobsets",
        "jobset.x-k8s.io",
        lambda n: {"metadata": {"name": n}, **BODIES["jobsets"]},
        "v1alpha2",
    ),
    ("jobset.x-k8s.io", "jobsets/status"): registry_status(
        "jobsets", {"restarts": 1}, "/apis/jobset.x-k8s.io/v1alpha2"
    ),
    ("authorization.k8s.io", "selfsubjectaccessreviews"): review(
        f"{AUTHORIZATION}/selfsubjectaccessreviews",
        {"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}},
    ),
    ("authorization.k8s.io", "selfsubjectrulesreviews"): review(
        f"{AUTHORIZATION}/selfsubjectrulesreviews", {"spec": {"namespace": "default"}}
    ),
    ("authentication.k8s.io", "selfsubjectreviews"): review(
        f"{AUTHENTICATION}/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    ),
}
SERVED = [
    (r.group, full, verb, r.namespaced)
    for r in RESOURCES
    for full, verbs in ((r.name, r.verbs), *((f"{r.name}/{s}", v) for s, _, v in r.subresources))
    for verb in verbs
]
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Namespaced lists across all namespaces: the only cluster-wide requests on namespaced kinds.
ACROSS = {
    ("", "pods"): "/api/v1/pods",
    ("", "events"): "/api/v1/events",
    ("", "services"): "/api/v1/services",
    ("policy", "poddisruptionbudgets"): "/apis/policy/v1/poddisruptionbudgets",
    ("tessera.io", "podgroups"): "/apis/tessera.io/v1/podgroups",
    ("scheduling.x-k8s.io", "podgroups"): "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
    ("tessera.io", "callbacks"): "/apis/tessera.io/v1/callbacks",
    ("coordination.k8s.io", "leases"): f"{LEASES}/leases",
    ("billing.tessera.io", "commitments"): f"{BILLING}/commitments",
    ("billing.tessera.io", "statements"): f"{BILLING}/statements",
    ("billing.tessera.io", "usage"): f"{BILLING}/usage",
    ("", "configmaps"): "/api/v1/configmaps",
    ("", "secrets"): "/api/v1/secrets",
    ("", "resourcequotas"): "/api/v1/resourcequotas",
    ("discovery.k8s.io", "endpointslices"): "/apis/discovery.k8s.io/v1/endpointslices",
    ("apps", "replicasets"): "/apis/apps/v1/replicasets",
    ("apps", "deployments"): "/apis/apps/v1/deployments",
    ("batch", "jobs"): "/apis/batch/v1/jobs",
    ("batch", "cronjobs"): "/apis/batch/v1/cronjobs",
    ("metrics.k8s.io", "pods"): "/apis/metrics.k8s.io/v1beta1/pods",
    ("jobset.x-k8s.io", "jobsets"): "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
}


@pytest.fixture
def world(make_tenant, make_node_agent, admin, server: ThreadedServer) -> World:
    owner, other = make_tenant("rvo"), make_tenant("rvx")
    node = unique("rvn-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    token = server.services.db.write(lambda s: auth.create_token(s, role="controller")).value
    return World(admin, owner, other, node, make_node_agent(node), Api(server.url, token))


def test_every_served_pair_has_a_real_request() -> None:
    assert {(g, r) for g, r, _, _ in SERVED} == set(REQUESTS)


# On SQLite alone: every answer and every refusal here is the authorizer's, which reads no
# table of its own and is the same code on both databases (the requests' effects on PostgreSQL
# are every other API test's). About 1,600 reviews and as many requests: 60-140 s a backend.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_can_i_says_yes_exactly_when_the_request_succeeds(world: World) -> None:
    w = world
    roles = [
        ("admin", w.admin, str(w.owner.tenant)),
        ("tenant in its namespace", w.owner, str(w.owner.tenant)),
        ("tenant in another's namespace", w.owner, str(w.other.tenant)),
        ("node in kube-node-lease", w.agent, "kube-node-lease"),  # for leases; else its own
        ("node in a tenant's namespace", w.agent, str(w.owner.tenant)),
        ("controller manager in a tenant's namespace", w.controller, str(w.owner.tenant)),
        ("controller manager in kube-system", w.controller, "kube-system"),
    ]
    wrong = []
    checked = 0
    for group, full, verb, namespaced in SERVED:
        resource, _, sub = full.partition("/")
        for role, api, ns in roles:
            if ns == "kube-node-lease" and full != "leases":
                ns = str(w.owner.tenant)  # nothing else lives in kube-node-lease
            if ns == "kube-system" and full != "leases":
                ns = str(w.owner.tenant)
            name, status = REQUESTS[(group, full)](w, api, ns, verb)
            asked_ns = ns if namespaced or resource != "namespaces" else ""
            answer = can_i(api, verb, resource, group=group, sub=sub, ns=asked_ns, name=name)
            assert answer["reason"], (role, verb, full)
            assert answer.get("denied", False) is not answer["allowed"]
            checked += 1
            if answer["allowed"] != (status not in (401, 403)):
                wrong.append((role, verb, full, ns, name, status, answer))
        if (group, full) in ACROSS and verb in ("list", "watch"):
            for role, api in (
                ("admin", w.admin),
                ("tenant", w.owner),
                ("controller manager", w.controller),
            ):
                path = ACROSS[(group, full)]
                status = api.get(path).status_code if verb == "list" else watch(api, path)
                answer = can_i(api, verb, resource, group=group)
                checked += 1
                if answer["allowed"] != (status not in (401, 403)):
                    wrong.append((role, verb, full, "*", "", status, answer))
    assert wrong == []
    assert checked > 120


def test_what_tessera_does_not_serve_is_refused_with_a_reason(world: World) -> None:
    served = {(g, f, v) for g, f, v, _ in SERVED}
    for group, full, _, _ in SERVED:
        resource, _, sub = full.partition("/")
        for verb in VERBS:
            if (group, full, verb) in served:
                continue
            answer = can_i(world.admin, verb, resource, group=group, sub=sub, ns="default")
            assert answer["allowed"] is False and answer["denied"] is True
            assert f"serves {full} for the verbs" in answer["reason"], answer
    for group, resource in (
        ("", "replicationcontrollers"),
        ("apps", "statefulsets"),
        ("tessera.io", "pods"),
    ):
        answer = can_i(world.admin, "get", resource, group=group, ns="default")
        assert answer["allowed"] is False
        assert f'does not serve the resource "{resource}"' in answer["reason"]
    assert can_i(world.admin, "get", "pods", sub="proxy", ns="default")["allowed"] is False
    # Even the admin cannot delete a system namespace, and the API refuses it the same way.
    refused = can_i(world.admin, "delete", "namespaces", name="default")
    assert refused["allowed"] is False and "system namespace" in refused["reason"]
    response = world.admin.delete(f"/api/v1/namespaces/default?{DRY}")
    assert response.status_code == 403 and "system namespace" in response.json()["message"]


def test_wildcards_and_paths(world: World) -> None:
    owner = world.owner
    ns = str(owner.tenant)
    assert can_i(owner, "*", "pods", ns=ns)["allowed"] is True
    assert can_i(owner, "*", "nodes")["allowed"] is False
    assert can_i(owner, "*", "*", ns=ns)["allowed"] is False
    assert can_i(world.admin, "*", "pods", ns=ns)["allowed"] is True

    def path(api: Api, verb: str, url: str) -> dict:
        body = {"spec": {"nonResourceAttributes": {"verb": verb, "path": url}}}
        return api.post(f"{AUTHORIZATION}/selfsubjectaccessreviews", json=body).json()["status"]

    assert path(owner, "get", "/version")["allowed"] is True
    assert path(owner, "get", "/openapi/v3/api/v1")["allowed"] is True
    assert path(owner, "post", "/version")["allowed"] is False
    assert path(owner, "get", "/metrics")["allowed"] is False
    for spec in ({}, {"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {}}):
        response = owner.post(f"{AUTHORIZATION}/selfsubjectaccessreviews", json={"spec": spec})
        assert response.status_code == 422, response.text
        assert response.json()["details"]["causes"][0]["field"] == "spec.resourceAttributes"


def test_rules_review_lists_what_the_rules_allow(world: World) -> None:
    owner, other = world.owner, world.other

    def rules(api: Api, ns: str) -> dict:
        response = api.post(
            f"{AUTHORIZATION}/selfsubjectrulesreviews", json={"spec": {"namespace": ns}}
        )
        assert response.status_code == 201, response.text
        assert response.json()["spec"] == {"namespace": ns}
        return response.json()["status"]

    def verbs(status: dict, group: str, resource: str, names: list[str] | None = None) -> set:
        return {
            verb
            for rule in status["resourceRules"]
            if rule["apiGroups"] == [group]
            and rule["resources"] == [resource]
            and rule.get("resourceNames") == names
            for verb in rule["verbs"]
        }

    own = rules(owner, str(owner.tenant))
    assert verbs(own, "", "pods") == {
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    }
    assert verbs(own, "tessera.io", "podgroups") >= {"create", "delete"}
    assert verbs(own, "tessera.io", "callbacks") >= {"create", "delete", "update", "watch"}
    assert verbs(own, "tessera.io", "callbacks/deliveries") == {"get"}
    assert verbs(own, "", "nodes") == {"get", "list", "watch"}
    assert verbs(own, "", "pods/binding") == set() and verbs(own, "tessera.io", "tenants") == set()
    assert verbs(own, "", "namespaces", [str(owner.tenant)]) >= {"create", "delete", "get"}
    assert own["incomplete"] is True and f"{owner.tenant}-<suffix>" in own["evaluationError"]
    assert own["nonResourceRules"][0]["verbs"] == ["get"]
    assert {"/version", "/apis/*"} <= set(own["nonResourceRules"][0]["nonResourceURLs"])
    elsewhere = rules(owner, str(other.tenant))
    assert verbs(elsewhere, "", "pods") == set()
    assert verbs(elsewhere, "", "nodes") == {"get", "list", "watch"}
    everything = rules(world.admin, str(owner.tenant))
    assert verbs(everything, "", "pods/binding") == {"create"}
    assert verbs(everything, "tessera.io", "tenants/tokens") == {"create"}


def test_whoami_names_the_caller_as_forbidden_messages_do(world: World) -> None:
    owner = world.owner
    response = owner.post(
        f"{AUTHENTICATION}/selfsubjectreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert response.status_code == 201, response.text
    user = response.json()["status"]["userInfo"]
    assert user["username"] == f"tessera:tenant:{owner.tenant}"
    assert "tessera:tenants" in user["groups"]
    refused = owner.get(f"/api/v1/namespaces/{world.other.tenant}/pods").json()["message"]
    assert f'User "{user["username"]}"' in refused
    admin = world.admin.post(f"{AUTHENTICATION}/selfsubjectreviews", json={}).json()
    assert admin["status"]["userInfo"]["username"] == "tessera:admin"
    assert (
        httpx.post(f"{owner.http.base_url}{AUTHENTICATION}/selfsubjectreviews").status_code == 401
    )


def test_discovery_lists_the_review_groups(world: World) -> None:
    groups = {g["name"] for g in world.owner.get("/apis").json()["groups"]}
    assert {"authorization.k8s.io", "authentication.k8s.io", "tessera.io"} <= groups
    authz = world.owner.get(f"{AUTHORIZATION}").json()["resources"]
    assert {(r["name"], tuple(r["verbs"])) for r in authz} == {
        ("selfsubjectaccessreviews", ("create",)),
        ("selfsubjectrulesreviews", ("create",)),
    }
    assert world.owner.get("/apis/authentication.k8s.io").json()["preferredVersion"] == {
        "groupVersion": "authentication.k8s.io/v1",
        "version": "v1",
    }


def test_kubectl_auth_can_i_and_whoami(
    world: World, server: ThreadedServer, tmp_path: Path
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if IN_CI:
            pytest.fail("kubectl is not installed: CI must run the kubectl tests")
        pytest.skip("kubectl is not installed")
    tls = ensure_tls(tmp_path / "tls", ["127.0.0.1"])
    with ThreadedServer(server.services.settings, server.services.db, tls) as https:
        owner = world.owner
        # The project's own builder, not text substitution: a token's random secret may hold any
        # placeholder's letters (a "NS" in it once turned this test red).
        config = kubeconfig.write(
            tmp_path / "tenant.kubeconfig",
            kubeconfig.build(
                server=https.url,
                ca_cert=tls.ca_cert,
                user="me",
                token=owner.token,
                namespace=str(owner.tenant),
            ),
        )
        _kubectl_answers(kubectl, config, world)


def _kubectl_answers(kubectl: str, config: Path, world: World) -> None:
    owner = world.owner

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl, "--kubeconfig", str(config), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    yes = run("auth", "can-i", "create", "pods")
    assert (yes.returncode, yes.stdout.strip()) == (0, "yes"), yes.stderr
    no = run("auth", "can-i", "list", "pods", "-n", str(world.other.tenant))
    assert no.returncode == 1, no.stderr
    assert no.stdout.startswith("no - ") and "only in namespaces it owns" in no.stdout
    whoami = run("auth", "whoami")
    assert whoami.returncode == 0, whoami.stderr
    assert f"tessera:tenant:{owner.tenant}" in whoami.stdout
    assert "tessera:tenants" in whoami.stdout
    listed = run("auth", "can-i", "--list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert "[create delete get list patch update watch deletecollection]" in rows["pods"]
    assert "[get list watch]" in rows["nodes"] and "tenants.tessera.io" not in rows
