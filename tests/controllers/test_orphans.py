"""An owner deleted with `--cascade=orphan` leaves its dependents alone, even when the
controller's caches lag: the ReplicaSet's informer says it is gone while the pod informer
still holds the pod with its (since removed) ownerReference. Against the test server over
HTTP, both databases."""

from __future__ import annotations

import asyncio
from typing import Any

from app.controllers.apps import delete_orphans
from app.controllers.client import PODS, REPLICASETS, Client
from app.controllers.endpoints import ENDPOINT_SLICES, SERVICES, EndpointController
from app.controllers.informer import Informer, Informers
from tests.conftest import Api, ThreadedServer, unique
from tests.controllers.test_manager import controller_token

APPS = "/apis/apps/v1/namespaces/{ns}/replicasets"
PODS_PATH = "/api/v1/namespaces/{ns}/pods"


def replica_set(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }


def owned_pod(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": owner["metadata"]["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def orphan_delete(tenant: Api, ns: str, rs: dict[str, Any], pod_name: str) -> None:
    """`kubectl delete rs --cascade=orphan` as the API and the garbage collector carry it out:
    the owner marked with the `orphan` finalizer, its reference taken off the dependent, then
    the finalizer removed (the owner goes)."""
    name = rs["metadata"]["name"]
    marked = tenant.request(
        "DELETE",
        f"{APPS.format(ns=ns)}/{name}",
        json={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"},
    )
    assert marked.status_code in (200, 202), marked.text
    assert "orphan" in marked.json()["metadata"]["finalizers"]
    merge = {"Content-Type": "application/merge-patch+json"}
    freed = tenant.patch(
        f"{PODS_PATH.format(ns=ns)}/{pod_name}",
        content=b'{"metadata": {"ownerReferences": null}}',
        headers=merge,
    )
    assert freed.status_code == 200, freed.text
    released = tenant.patch(
        f"{APPS.format(ns=ns)}/{name}",
        content=b'{"metadata": {"finalizers": null}}',
        headers=merge,
    )
    assert released.status_code == 200, released.text
    assert tenant.get(f"{APPS.format(ns=ns)}/{name}").status_code == 404


def test_an_orphaned_pod_survives_a_lagging_pod_cache(server: ThreadedServer, tenant: Api) -> None:
    ns = tenant.tenant
    assert ns is not None
    made = tenant.post(APPS.format(ns=ns), json=replica_set(unique("rs-")))
    assert made.status_code == 201, made.text
    rs = made.json()
    pod_name = unique("p-")
    pod = tenant.post(PODS_PATH.format(ns=ns), json=owned_pod(pod_name, rs))
    assert pod.status_code == 201, pod.text

    async def race() -> None:
        client = Client(server.url, controller_token(server))
        try:
            # the pod informer saw the pod owned, and nothing since: its watch lags behind
            # the ReplicaSets' watch, which already told the controller that the owner is gone
            pods = Informer(client, PODS)
            pods.apply("ADDED", pod.json())
            orphan_delete(tenant, ns, rs, pod_name)
            await delete_orphans(
                client, pods, PODS, REPLICASETS, "ReplicaSet", ns, rs["metadata"]["name"]
            )
        finally:
            await client.close()

    asyncio.run(race())
    kept = tenant.get(f"{PODS_PATH.format(ns=ns)}/{pod_name}")
    assert kept.status_code == 200, "the orphaned pod was deleted for its former owner"
    assert not kept.json()["metadata"].get("deletionTimestamp")
    assert not kept.json()["metadata"].get("ownerReferences")


def test_a_pod_still_owned_by_a_gone_replica_set_is_deleted(
    server: ThreadedServer, tenant: Api
) -> None:
    """The other side: an owner deleted outright (its dependents not orphaned) takes the pod
    with it, though the cache saw the pod before the owner went."""
    ns = tenant.tenant
    assert ns is not None
    made = tenant.post(APPS.format(ns=ns), json=replica_set(unique("rs-")))
    assert made.status_code == 201, made.text
    rs = made.json()
    pod_name = unique("p-")
    pod = tenant.post(PODS_PATH.format(ns=ns), json=owned_pod(pod_name, rs))
    assert pod.status_code == 201, pod.text

    async def collect() -> None:
        client = Client(server.url, controller_token(server))
        try:
            pods = Informer(client, PODS)
            pods.apply("ADDED", pod.json())
            gone = tenant.request("DELETE", f"{APPS.format(ns=ns)}/{rs['metadata']['name']}")
            assert gone.status_code in (200, 202), gone.text
            await delete_orphans(
                client, pods, PODS, REPLICASETS, "ReplicaSet", ns, rs["metadata"]["name"]
            )
        finally:
            await client.close()

    asyncio.run(collect())
    left = tenant.get(f"{PODS_PATH.format(ns=ns)}/{pod_name}")
    assert left.status_code == 404 or left.json()["metadata"].get("deletionTimestamp")


def test_a_slice_the_manager_made_is_in_its_cache_before_the_watch_brings_it(
    server: ThreadedServer, tenant: Api
) -> None:
    """What the manager makes is in its shared cache at once: a Service deleted with
    `--cascade=orphan` right after its slice was made would otherwise find no dependent in the
    garbage collector's cache (its watch not there yet), go, and leave a slice naming a gone
    owner, which the collector then deleted (seen in CI, 1 run in 2)."""
    ns = tenant.tenant
    assert ns is not None
    name = unique("svc-")
    made = tenant.post(
        f"/api/v1/namespaces/{ns}/services",
        json={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": {"app": name}},
        },
    )
    assert made.status_code == 201, made.text

    async def reconcile() -> dict[str, Any] | None:
        client = Client(server.url, controller_token(server))
        try:
            informers = Informers(client)  # never started: nothing comes through a watch
            for resource in (SERVICES, PODS, ENDPOINT_SLICES):
                informers.get(resource)
            informers[SERVICES].apply("ADDED", made.json())
            controller = EndpointController()
            controller.bind(client, informers)
            await controller.reconcile(f"{ns}/{name}")
            return informers[ENDPOINT_SLICES].get(ns, name)
        finally:
            await client.close()

    cached = asyncio.run(reconcile())
    stored = tenant.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{name}")
    assert stored.status_code == 200, stored.text
    assert cached is not None, "the slice the controller made is not in its cache"
    assert cached["metadata"]["resourceVersion"] == stored.json()["metadata"]["resourceVersion"]
