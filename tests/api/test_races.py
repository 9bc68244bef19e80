"""Concurrent deletes racing binds and starts: no client ever sees a deadlock (PostgreSQL used
to answer 500 with DeadlockDetected on the resourceVersion counter). On both databases."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from app.pods import service as pods
from tests.conftest import unique
from tests.factories import cpu_node, pod


def test_deletes_racing_binds_and_starts_never_fail(server, tenant, admin) -> None:
    ns = tenant.tenant
    node = unique("race-")
    assert admin.post("/api/v1/nodes", json=cpu_node(node, cpu="64", memory="256Gi")).is_success
    names = [f"r{i}" for i in range(40)]
    uids = {}
    for name in names:
        created = tenant.post(
            f"/api/v1/namespaces/{ns}/pods", json=pod(name, cpu="0.5", memory="1Gi")
        )
        assert created.status_code == 201
        uids[name] = created.json()["metadata"]["uid"]
    first, second = names[:20], names[20:]
    for name in first:  # bound already: their deletes race the agent's starts
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        assert admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=binding).is_success

    def delete(name: str) -> int:
        return tenant.delete(f"/api/v1/namespaces/{ns}/pods/{name}").status_code

    def bind(name: str) -> int:
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        return admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=binding).status_code

    def start(name: str) -> bool:
        return server.services.db.write(lambda s: pods.start(s, uid=uids[name]))

    with ThreadPoolExecutor(max_workers=24) as pool:
        deletes = [pool.submit(delete, n) for n in names]
        binds = [pool.submit(bind, n) for n in second]
        starts = [pool.submit(start, n) for n in first]
        delete_codes = [f.result() for f in deletes]
        bind_codes = [f.result() for f in binds]
        [f.result() for f in starts]  # an exception here is a failure
    assert set(delete_codes) <= {200}, delete_codes
    assert set(bind_codes) <= {201, 404, 409}, bind_codes  # 404/409: the delete came first
    # every pod is gone or terminating; nothing holds capacity twice
    left = tenant.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
    assert all(p["metadata"].get("deletionTimestamp") for p in left)
    free = admin.get(f"/api/v1/nodes/{node}").json()["metadata"]["annotations"]
    assert free  # the node still answers with its free amounts
