"""ResourceQuotas with the real kubectl against a real `tessera serve`: the admin applies one,
the tenant reads it (`get quota`, `describe quota`), cannot change it, and meets its 403."""

from __future__ import annotations

import yaml

from tests.conftest import unique
from tests.e2e.conftest import Kubectl, Process, race_creates

QUOTA = """
apiVersion: v1
kind: ResourceQuota
metadata:
  name: team
spec:
  hard:
    requests.cpu: "6"
    requests.memory: 16Gi
    nvidia.com/gpu: "1"
    pods: "PODS"
"""

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: NAME
spec:
  containers:
    - name: main
      image: registry.example/app:1.0
      resources:
        requests: {cpu: "1.2", memory: 2Gi}
"""

GPU_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: NAME
spec:
  containers:
    - name: main
      image: registry.example/app:1.0
      resources:
        limits: {nvidia.com/gpu: 1}
"""


def test_the_admin_sets_a_quota_and_the_tenant_reads_and_meets_it(
    tenant_kubectl, admin_kubectl: Kubectl
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    ns = str(kubectl.namespace)
    applied = admin_kubectl("apply", "-n", ns, "-f", "-", stdin=QUOTA.replace("PODS", "3"))
    assert applied.strip() == "resourcequota/team created"
    again = admin_kubectl("apply", "-n", ns, "-f", "-", stdin=QUOTA.replace("PODS", "2"))
    assert again.strip() == "resourcequota/team configured"

    refused = kubectl.fails("apply", "-f", "-", stdin=QUOTA.replace("PODS", "100"))
    assert "forbidden" in refused and "only the admin" in refused
    assert "forbidden" in kubectl.fails("delete", "quota", "team")

    for name in ("one", "two"):
        assert kubectl("apply", "-f", "-", stdin=POD.replace("NAME", name)).strip() == (
            f"pod/{name} created"
        )
    over = kubectl.fails("apply", "-f", "-", stdin=POD.replace("NAME", "three"))
    assert (
        'pods "three" is forbidden: exceeded quota: team, requested: pods=1, used: pods=2, '
        "limited: pods=2" in over
    ), over

    table = kubectl("get", "quota")
    assert table.splitlines()[0].split() == ["NAME", "AGE", "REQUEST", "LIMIT"]
    line = table.splitlines()[1]
    # 1.2 vCPU is sold as 1.5: two pods use 3
    assert line.startswith("team ") and "requests.cpu: 3/6" in line and "pods: 2/2" in line

    described = kubectl("describe", "quota", "team")
    rows = {
        parts[0]: parts[1:]
        for parts in (line.split() for line in described.splitlines())
        if len(parts) == 3
    }
    assert rows["Resource"] == ["Used", "Hard"]
    assert rows["requests.cpu"] == ["3", "6"]
    assert rows["requests.memory"] == ["4Gi", "16Gi"]
    assert rows["pods"] == ["2", "2"]
    assert rows["nvidia.com/gpu"] == ["0", "1"]

    kubectl("delete", "pod", "one", "--wait=false")
    admin_kubectl("apply", "-n", ns, "-f", "-", stdin=QUOTA.replace("PODS", "5"))
    assert kubectl("apply", "-f", "-", stdin=GPU_POD.replace("NAME", "gpu-a")).strip() == (
        "pod/gpu-a created"
    )
    second = kubectl.fails("apply", "-f", "-", stdin=GPU_POD.replace("NAME", "gpu-b"))
    assert (
        "exceeded quota: team, requested: nvidia.com/gpu=1, used: nvidia.com/gpu=1, "
        "limited: nvidia.com/gpu=1" in second
    ), second


def test_concurrent_creates_on_several_workers_admit_exactly_the_room(two_workers: Process) -> None:
    """Two API worker processes, 50 creates at once against room for 10: exactly 10 admitted."""
    server = two_workers
    name = unique("rq")
    server.create_tenant(name)
    with server.admin() as admin:
        made = admin.post(
            f"/api/v1/namespaces/{name}/resourcequotas",
            json={"metadata": {"name": "ten"}, "spec": {"hard": {"pods": "10"}}},
        )
        assert made.status_code == 201, made.text
    token = server.tenant_token(name)
    path = f"/api/v1/namespaces/{name}/pods"
    posts = [(path, yaml.safe_load(POD.replace("NAME", f"race-{i}"))) for i in range(50)]
    results = race_creates(server, token, posts)
    assert sorted(results) == [201] * 10 + [403] * 40
    with server.admin() as admin:
        listed = admin.get(f"/api/v1/namespaces/{name}/pods").json()["items"]
        assert len(listed) == 10
        used = admin.get(f"/api/v1/namespaces/{name}/resourcequotas/ten").json()
        assert used["status"]["used"] == {"pods": "10"}


def test_a_tenant_quota_is_exact_across_namespaces_and_workers(two_workers: Process) -> None:
    """Two API worker processes, 40 creates at once in two namespaces of one tenant against a
    tenant-wide quota with room for 10: exactly 10 admitted."""
    server = two_workers
    name = unique("tq")
    second = f"{name}-b"
    server.create_tenant(name)
    with server.admin() as admin:
        made = admin.post("/api/v1/namespaces", json={"metadata": {"name": second}})
        assert made.status_code == 201, made.text
        quota = admin.patch(
            f"/apis/tessera.io/v1/tenants/{name}",
            json={"spec": {"quota": {"hard": {"count/pods": "10"}}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert quota.status_code == 200, quota.text
    token = server.tenant_token(name)
    posts = [
        (
            f"/api/v1/namespaces/{(name, second)[i % 2]}/pods",
            yaml.safe_load(POD.replace("NAME", f"race-{i}")),
        )
        for i in range(40)
    ]
    results = race_creates(server, token, posts)
    assert sorted(results) == [201] * 10 + [403] * 30
    with server.admin() as admin:
        listed = admin.get("/api/v1/pods").json()["items"]
        assert len([p for p in listed if p["metadata"]["namespace"] in (name, second)]) == 10
        shown = admin.get(f"/apis/tessera.io/v1/tenants/{name}").json()
        assert shown["status"]["quota"]["used"] == {"count/pods": "10"}
