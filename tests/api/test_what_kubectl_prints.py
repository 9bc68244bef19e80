"""What `kubectl get` prints, column by column, and how events read: in time order, a repeated
warning counted on one event (real HTTP, SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import update

from app.db.models import Pod
from app.events import service as events
from tests.conftest import unique
from tests.factories import gpu_node, pod

TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}


def _row(tenant: Any, name: str) -> dict[str, Any]:
    table = tenant.get(f"/api/v1/namespaces/{tenant.tenant}/pods/{name}", headers=TABLE).json()
    columns = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(columns, table["rows"][0]["cells"], strict=True))


def test_the_gpu_column_shows_what_a_slice_got_and_nominated_node_is_shown(
    server, tenant, admin
) -> None:
    ns = tenant.tenant
    node = unique("print-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    # A slice of an H100 by its VRAM alone: its SM share follows from the model (13 %).
    sliced = pod("s", gpu_memory="10Gi", labels={"tessera.io/gpu-model": "H100"})
    created = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=sliced)
    assert created.status_code == 201, created.text
    # Not placed yet, the column says what it asked.
    assert _row(tenant, "s")["GPU"] == "10Gi"
    placed = [{"gpu": f"{node}-gpu0", "memoryMiB": 10240, "corePercent": 13}]
    binding = {
        "metadata": {"name": "s", "annotations": {"tessera.io/gpu-allocation": json.dumps(placed)}},
        "target": {"kind": "Node", "name": node},
    }
    bound = admin.post(f"/api/v1/namespaces/{ns}/pods/s/binding", json=binding)
    assert bound.status_code == 201, bound.text
    row = _row(tenant, "s")
    assert (row["GPU"], row["Node"]) == ("10Gi/13%", node)
    # A slice that asked for its share shows it; so does one whole GPU.
    asked = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("a", gpu_memory="20Gi", gpu_core=25)
    )
    assert asked.status_code == 201 and _row(tenant, "a")["GPU"] == "20Gi/25%"
    whole = tenant.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod("w", cpu="4", memory="16Gi", gpus=1)
    )
    assert whole.status_code == 201, whole.text
    assert _row(tenant, "w")["GPU"] == "1x GPU"

    # Preemption nominated a node for the pending pod: the column names it.
    assert _row(tenant, "a")["Nominated Node"] == "<none>"
    server.services.db.write(
        lambda s: s.execute(
            update(Pod).where(Pod.namespace == ns, Pod.name == "a").values(nominated_node_name=node)
        )
    )
    assert _row(tenant, "a")["Nominated Node"] == node


def test_events_list_in_time_order_and_a_repeated_warning_is_counted(server, tenant) -> None:
    ns = tenant.tenant
    names = ["zz", "aa", "mm"]
    uids = {}
    for name in names:
        created = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod(name))
        assert created.status_code == 201
        uids[name] = created.json()["metadata"]["uid"]
    since = tenant.get(f"/api/v1/namespaces/{ns}/events").json()["metadata"]["resourceVersion"]

    db = server.services.db
    tenant_id = db.read(lambda s: s.get(Pod, uids["zz"]).tenant_id)

    def warn(name: str, message: str, kind: str = "Warning", reason: str = "FailedScheduling"):
        involved = events.Involved("Pod", name, uids[name], ns)
        db.write(
            lambda s: events.record(
                s, involved=involved, reason=reason, message=message, type=kind, tenant_id=tenant_id
            )
        )

    for attempt in range(1, 6):  # five tries of zz, each a warning
        warn("zz", f"0/3 nodes are available (try {attempt})")
    warn("aa", "no room")
    for _ in range(2):  # Normal events are each their own
        warn("mm", "Started", kind="Normal", reason="Started")
    items = tenant.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    mine = [e for e in items if e["reason"] in ("FailedScheduling", "Started")]
    assert [(e["involvedObject"]["name"], e["count"]) for e in mine] == [
        ("zz", 5),
        ("aa", 1),
        ("mm", 1),
        ("mm", 1),
    ]
    zz = mine[0]
    assert zz["message"] == "0/3 nodes are available (try 5)"
    assert zz["series"]["count"] == 5 and zz["series"]["lastObservedTime"].endswith("Z")
    assert zz["firstTimestamp"] <= zz["lastTimestamp"]
    assert "series" not in mine[1]
    # Names sort in time order per object, as Kubernetes names events.
    assert mine[2]["metadata"]["name"] < mine[3]["metadata"]["name"]
    # A watch from before sees each event at its latest: the counted warning once, modified
    # (repeats are counted in place, not logged one by one), the single one added.
    watched = tenant.get(
        f"/api/v1/namespaces/{ns}/events",
        params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"},
    )
    seen = [
        (e["type"], e["object"]["involvedObject"]["name"], e["object"]["count"])
        for e in map(json.loads, watched.text.splitlines())
        if e["type"] != "BOOKMARK" and e["object"]["reason"] == "FailedScheduling"
    ]
    assert seen == [("MODIFIED", "zz", 5), ("ADDED", "aa", 1)]
