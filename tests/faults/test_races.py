"""A fault racing binds, finishes and other faults over real HTTP (SQLite and PostgreSQL): no
request fails (deadlocks are retried), and a pod that holds the failed GPU afterwards held it
before the fault and was told."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from app.pods import service as pods
from tests.conftest import unique
from tests.factories import gpu_node, pod

GPUS = "/apis/tessera.io/v1/gpudevices"


def test_a_fault_racing_binds_and_finishes(server, tenant, admin) -> None:
    ns = tenant.tenant
    db = server.services.db
    node = unique("frace-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    gpu = f"{node}-gpu0"
    running = [f"run{i}" for i in range(3)]
    waiting = [f"new{i}" for i in range(3)]
    uids = {}
    for name in running + waiting:
        created = tenant.post(
            f"/api/v1/namespaces/{ns}/pods",
            json=pod(name, cpu="1", memory="4Gi", gpu_memory="10Gi", gpu_core=10),
        )
        assert created.status_code == 201
        uids[name] = created.json()["metadata"]["uid"]

    def bind(name: str) -> int:
        share = [{"gpu": gpu, "memoryMiB": 10240, "corePercent": 10}]
        binding = {
            "target": {"kind": "Node", "name": node},
            "metadata": {"annotations": {"tessera.io/gpu-allocation": json.dumps(share)}},
        }
        url = f"/api/v1/namespaces/{ns}/pods/{name}/binding"
        return admin.post(url, json=binding).status_code

    for name in running:
        assert bind(name) == 201
        db.write(lambda s, name=name: pods.start(s, uid=uids[name]))

    def fault() -> int:
        body = {"spec": {"kind": "xid", "xid": 48}}
        return admin.post(f"{GPUS}/{gpu}/fault", json=body).status_code

    def finish(name: str) -> bool:
        return db.write(lambda s: pods.finish(s, uid=uids[name]))

    with ThreadPoolExecutor(max_workers=8) as workers:
        faults = [workers.submit(fault) for _ in range(2)]
        binds = [workers.submit(bind, n) for n in waiting]
        finishes = [workers.submit(finish, running[0])]
        assert [f.result() for f in faults] == [200, 200]
        assert {f.result() for f in binds} <= {201, 422}  # 422: the GPU failed first
        [f.result() for f in finishes]  # an exception here is a failure

    after = admin.get(f"{GPUS}/{gpu}").json()
    assert after["status"]["health"] == "Unhealthy" and len(after["status"]["faults"]) == 2
    for name in running + waiting:
        obj = tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
        holds = obj["status"]["phase"] not in ("Succeeded", "Failed") and "nodeName" in obj["spec"]
        told = any(
            c["type"] == "DisruptionTarget" and c["reason"] == "DeletionByDeviceTaintManager"
            for c in obj["status"]["conditions"]
        )
        assert told or not holds, (name, obj["status"])  # holding it, it was told
        if "nodeName" not in obj["spec"]:
            assert not told  # never bound: nothing to tell
    held = sum(p["corePercent"] for p in after["status"].get("pods", []))
    assert after["status"]["free"]["corePercent"] == 100 - held
