"""The real kubectl against a real `tessera serve` over HTTPS, with kubeconfigs from the CLI."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import unique
from tests.e2e import lifecycle
from tests.e2e.conftest import KUBECTL, Kubectl, Process

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: NAME
  labels: {app: LABEL}
spec:
  containers:
  - name: main
    image: registry.example/app:1.0
    resources:
      requests: {cpu: "2", memory: 3.5Gi}
      limits: {tessera.io/gpu-memory: 20Gi, tessera.io/gpu-core: "25"}
"""


def manifest(name: str, label: str = "x") -> str:
    return POD.replace("NAME", name).replace("LABEL", label)


def columns(output: str) -> list[str]:
    return output.splitlines()[0].split()


def rows(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in output.splitlines()[1:] if line.strip()}


def test_version_and_api_resources(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert "Server Version: v1.32" in kubectl("version")
    listed = kubectl("api-resources")
    resources = rows(listed)
    every = [line.split() for line in listed.splitlines()[1:]]
    assert ["pods", "po", "v1", "true", "Pod"] in every  # and metrics.k8s.io's PodMetrics
    assert ["pods", "metrics.k8s.io/v1beta1", "true", "PodMetrics"] in every
    assert resources["gpudevices"][1:] == ["gpu,gpus", "tessera.io/v1", "false", "GPUDevice"]
    assert resources["poddisruptionbudgets"][1:] == [
        "pdb",
        "policy/v1",
        "true",
        "PodDisruptionBudget",
    ]  # always empty, so that kubectl drain evicts
    assert ["nodes", "no", "v1", "false", "Node"] in every  # and NodeMetrics
    assert resources["namespaces"][1] == "ns" and resources["events"][1] == "ev"


def test_explain_describes_pods_and_tessera_kinds(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    resources = kubectl("explain", "pods.spec.containers.resources.requests")
    assert "tessera.io/gpu-memory" in resources and "nvidia.com/gpu" in resources
    status = kubectl("explain", "gpu.status")
    assert "GROUP:      tessera.io" in status and "KIND:       GPUDevice" in status
    assert "health\t<string> -required-" in status and "Healthy, Unhealthy" in status
    assert "pods\t<[]GPUHolder>" in status  # an optional list stays a list one can drill into
    assert "minMember\t<integer> -required-" in kubectl("explain", "pg.spec")
    assert "url\t<string> -required-" in kubectl("explain", "callbacks.spec")
    assert "FIELD: capacity <map[string]string>" in kubectl("explain", "nodes.status.capacity")


def test_apply_validates_and_updates_labels(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert kubectl("apply", "-f", "-", stdin=manifest("web", "v1")).strip() == "pod/web created"
    assert kubectl("apply", "-f", "-", stdin=manifest("web", "v2")).strip() == "pod/web configured"
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json"))
    assert pod["metadata"]["labels"]["app"] == "v2"
    last = json.loads(
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    )
    assert last["metadata"]["labels"] == {"app": "v2"}
    assert pod["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "2-4Gi"

    unknown = manifest("typo").replace("    image:", "    imagePolicy: Always\n    image:")
    error = kubectl.fails("apply", "-f", "-", stdin=unknown)
    assert 'unknown field "spec.containers[0].imagePolicy"' in error
    assert kubectl.run("get", "pod", "typo", check=False).returncode != 0


def test_server_side_apply(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert "serverside-applied" in kubectl(
        "apply", "--server-side", "-f", "-", stdin=manifest("ssa", "a")
    )
    with_tier = manifest("ssa", "a").replace("labels: {app: a}", "labels: {app: a, tier: gpu}")
    kubectl("apply", "--server-side", "-f", "-", stdin=with_tier)
    assert (
        json.loads(kubectl("get", "pod", "ssa", "-o", "json"))["metadata"]["labels"]["tier"]
        == "gpu"
    )
    kubectl(
        "apply", "--server-side", "-f", "-", stdin=manifest("ssa", "a")
    )  # tier no longer applied: removed
    labels = json.loads(kubectl("get", "pod", "ssa", "-o", "json"))["metadata"]["labels"]
    assert "tier" not in labels and labels["app"] == "a"


def test_create_get_in_every_format(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert kubectl("create", "-f", "-", stdin=manifest("one", "web")).strip() == "pod/one created"
    kubectl("create", "-f", "-", stdin=manifest("two", "db"))
    table = kubectl("get", "pods")
    assert columns(table) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert rows(table)["one"][1:3] == ["0/1", "Pending"]
    wide = kubectl("get", "pods", "-o", "wide")
    assert columns(wide)[:8] == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "SPEC",
        "GPU",
        "NODE",
    ]
    assert rows(wide)["one"][5:8] == ["2-4Gi", "20Gi/25%", "<none>"]
    assert yaml.safe_load(kubectl("get", "pod", "one", "-o", "yaml"))["kind"] == "Pod"
    listed = json.loads(kubectl("get", "pods", "-o", "json"))
    assert listed["kind"] == "List" and {p["metadata"]["name"] for p in listed["items"]} == {
        "one",
        "two",
    }
    assert set(rows(kubectl("get", "pods", "-l", "app=web"))) == {"one"}
    assert "one" in kubectl("get", "pods", "--field-selector", "status.phase=Pending")


def test_errors_read_like_kubernetes(tenant_kubectl, tessera: Process) -> None:
    kubectl: Kubectl = tenant_kubectl()
    other: Kubectl = tenant_kubectl()
    assert 'Error from server (NotFound): pods "ghost" not found' in kubectl.fails(
        "get", "pod", "ghost"
    )
    kubectl("create", "-f", "-", stdin=manifest("dup"))
    assert "Error from server (AlreadyExists)" in kubectl.fails(
        "create", "-f", "-", stdin=manifest("dup")
    )
    invalid = manifest("huge").replace('cpu: "2"', 'cpu: "100"')
    error = kubectl.fails("create", "-f", "-", stdin=invalid)
    assert 'The Pod "huge" is invalid' in error and "largest spec sold has 64 vCPU" in error
    forbidden = kubectl.fails("get", "pods", "-n", other.namespace or "")
    assert "Error from server (Forbidden)" in forbidden and other.namespace in forbidden
    stale = yaml.safe_load(kubectl("get", "pod", "dup", "-o", "yaml"))
    kubectl("label", "pod", "dup", "fresh=yes")
    stale["metadata"]["labels"]["changed"] = "late"
    conflict = kubectl.fails("replace", "-f", "-", stdin=yaml.safe_dump(stale))
    assert "Error from server (Conflict)" in conflict and "has been modified" in conflict


def test_watch_sees_added_modified_deleted(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl("create", "-f", "-", stdin=manifest("watched"))
    watcher = subprocess.Popen(
        [
            "kubectl",
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "get",
            "pods",
            "-w",
            "--output-watch-events",
            "--request-timeout=20s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = watcher.stdout.readline()  # type: ignore[union-attr]
        assert first.split()[:2] == ["EVENT", "NAME"]
        assert watcher.stdout.readline().split()[:2] == ["ADDED", "watched"]  # type: ignore[union-attr]
        kubectl("label", "pod", "watched", "phase=two")
        assert watcher.stdout.readline().split()[:2] == ["MODIFIED", "watched"]  # type: ignore[union-attr]
        kubectl("delete", "pod", "watched")
        assert watcher.stdout.readline().split()[:2] == ["DELETED", "watched"]  # type: ignore[union-attr]
    finally:
        watcher.kill()
        watcher.wait()


def test_describe_shows_events_and_delete_removes(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl("create", "-f", "-", stdin=manifest("described"))
    described = kubectl("describe", "pod", "described")
    assert "Name:" in described and "described" in described
    assert "SpecRounded" in described and "rounded up to the sold spec 2-4Gi" in described
    events = kubectl("get", "events")
    assert columns(events) == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "pod/described" in events
    assert kubectl("delete", "pod", "described").strip() == 'pod "described" deleted'
    assert "NotFound" in kubectl.fails("get", "pod", "described")


def test_nodes_and_gpus(tenant_kubectl, admin_kubectl: Kubectl, tessera: Process) -> None:
    kubectl: Kubectl = tenant_kubectl()
    nodes = kubectl("get", "nodes", "-l", f"topology.kubernetes.io/zone={tessera.zone}")
    assert columns(nodes) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert len(rows(nodes)) == 3 and {r[1] for r in rows(nodes).values()} == {"Ready"}
    wide = kubectl(
        "get", "nodes", "-o", "wide", "-l", f"topology.kubernetes.io/zone={tessera.zone}"
    )
    assert {"GPU", "ZONE"} <= set(columns(wide))
    gpus = kubectl("get", "gpu", "-l", f"topology.kubernetes.io/zone={tessera.zone}")
    assert columns(gpus) == [
        "NAME",
        "NODE",
        "MODEL",
        "VRAM",
        "FREE",
        "SM",
        "FREE",
        "HEALTH",
        "LAST",
        "FAULT",
        "PODS",
    ]
    assert len(rows(gpus)) == 16 and all(
        r[2] == "H100" and r[3] == "80Gi/80Gi" for r in rows(gpus).values()
    )
    node = next(iter(rows(nodes)))
    assert (
        "is forbidden" in kubectl.run("cordon", node, check=False).stderr
    )  # cordon exits 0 on errors
    assert "SchedulingDisabled" not in kubectl("get", "node", node)
    admin_kubectl("cordon", node)
    assert "SchedulingDisabled" in admin_kubectl("get", "node", node)
    admin_kubectl("uncordon", node)


def test_admin_sees_every_namespace(tenant_kubectl, admin_kubectl: Kubectl) -> None:
    first: Kubectl = tenant_kubectl()
    second: Kubectl = tenant_kubectl()
    first("create", "-f", "-", stdin=manifest("a1"))
    second("create", "-f", "-", stdin=manifest("b1"))
    everything = admin_kubectl("get", "pods", "-A")
    assert columns(everything)[:2] == ["NAMESPACE", "NAME"]
    seen = {(line.split()[0], line.split()[1]) for line in everything.splitlines()[1:]}
    assert {(first.namespace, "a1"), (second.namespace, "b1")} <= seen
    mine = first.run("get", "pods", "-A", check=False)
    names = {tuple(line.split()[:2]) for line in mine.stdout.splitlines()[1:]}
    assert (first.namespace, "a1") in names and (second.namespace, "b1") not in names, mine


def bind(kubectl: Kubectl, admin_kubectl: Kubectl, tessera: Process, name: str) -> str:
    """Bind a pod of `manifest` (a 20 GiB, 25 % slice) to a GPU of this server's zone as the
    admin, as a scheduler would (this server runs none); returns the node."""
    gpus = json.loads(
        admin_kubectl(
            "get", "gpu", "-l", f"topology.kubernetes.io/zone={tessera.zone}", "-o", "json"
        )
    )["items"]
    gpu = gpus[0]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": name,
            "annotations": {
                "tessera.io/gpu-allocation": json.dumps(
                    [{"gpu": gpu["metadata"]["name"], "memoryMiB": 20480, "corePercent": 25}]
                )
            },
        },
        "target": {"kind": "Node", "name": gpu["spec"]["nodeName"]},
    }
    admin_kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{kubectl.namespace}/pods/{name}/binding",
        "-f",
        "-",
        stdin=json.dumps(binding),
    )
    return gpu["spec"]["nodeName"]


def test_delete_waits_for_a_bound_pod_to_stop(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process
) -> None:
    """A bound pod is marked for deletion; kubectl waits until the node agent removes it."""
    kubectl: Kubectl = tenant_kubectl()
    kubectl("create", "-f", "-", stdin=manifest("bound"))
    node = bind(kubectl, admin_kubectl, tessera, "bound")
    assert node in kubectl("get", "pod", "bound", "-o", "wide")
    started = time.monotonic()
    kubectl("delete", "pod", "bound", "--grace-period=1")
    assert time.monotonic() - started < 50
    assert "NotFound" in kubectl.fails("get", "pod", "bound")


GROUP = """
apiVersion: tessera.io/v1
kind: PodGroup
metadata:
  name: train
spec:
  minMember: MIN
  topology: {required: node}
"""


def test_pod_groups(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert (
        kubectl("apply", "-f", "-", stdin=GROUP.replace("MIN", "2")).strip()
        == "podgroup.tessera.io/train created"
    )
    assert (
        kubectl("apply", "-f", "-", stdin=GROUP.replace("MIN", "3")).strip()
        == "podgroup.tessera.io/train configured"
    )
    member = manifest("w0").replace(
        "labels: {app: x}", "labels: {app: x, tessera.io/pod-group: train}"
    )
    kubectl("create", "-f", "-", stdin=member)
    table = kubectl("get", "pg")
    assert columns(table) == ["NAME", "MIN", "MEMBERS", "SCHEDULED", "STATUS", "TOPOLOGY", "AGE"]
    assert rows(table)["train"][1:6] == ["3", "1", "0", "Pending", "node"]


# scheduler-plugins' coscheduling example as its users write it (the nodeSelector keeps it in
# the e2e pool, whose nodes have a running agent).
COSCHEDULED = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: nginx
  annotations: {tessera.io/topology-required: zone}
spec:
  scheduleTimeoutSeconds: 30
  minMember: 3
  minResources: {cpu: "3"}
"""
COSCHEDULED_POD = """
---
apiVersion: v1
kind: Pod
metadata:
  name: NAME
  labels: {app: nginx, scheduling.x-k8s.io/pod-group: nginx}
spec:
  schedulerName: scheduler-plugins-scheduler
  nodeSelector: {topology.kubernetes.io/zone: ZONE}
  containers:
  - name: nginx
    image: nginx
    resources:
      requests: {cpu: "1", memory: 2Gi}
      limits: {tessera.io/gpu-memory: 10Gi, tessera.io/gpu-core: "10"}
"""


def test_coscheduling_pod_groups(tenant_kubectl, tessera: Process, database_url: str) -> None:
    """An upstream coscheduling manifest applied unchanged: the PodGroup is served under
    scheduling.x-k8s.io, the real scheduling loop places its pods together, the agent runs
    them, and the group's status counts them."""
    from app.db.engine import Database
    from scheduler.loop import COSCHEDULING_SCHEDULER, LoopConfig, SchedulingLoop

    kubectl: Kubectl = tenant_kubectl()
    resources = kubectl("api-resources", "--api-group=scheduling.x-k8s.io")
    assert rows(resources)["podgroups"][1:] == [
        "scheduling.x-k8s.io/v1alpha1",
        "true",
        "PodGroup",
    ]
    explained = kubectl("explain", "podgroups.scheduling.x-k8s.io.spec")
    assert "scheduleTimeoutSeconds" in explained and "minMember" in explained
    names = ["nginx-0", "nginx-1", "nginx-2"]
    pods = [COSCHEDULED_POD.replace("NAME", n).replace("ZONE", tessera.zone) for n in names]
    # Two of the three first: below minMember nothing is placed.
    applied = kubectl("apply", "-f", "-", stdin=COSCHEDULED + "".join(pods[:2]))
    assert "podgroup.scheduling.x-k8s.io/nginx created" in applied
    assert "pod/nginx-0 created" in applied and "pod/nginx-1 created" in applied
    db = Database(database_url)
    try:
        scheduler = SchedulingLoop(db, LoopConfig(scheduler_name=COSCHEDULING_SCHEDULER))
        assert scheduler.run_once().bound == 0
        table = kubectl("get", "podgroups.scheduling.x-k8s.io")
        assert columns(table) == [
            "NAME",
            "PHASE",
            "MINMEMBER",
            "RUNNING",
            "SUCCEEDED",
            "FAILED",
            "AGE",
        ]
        assert rows(table)["nginx"][1:6] == ["Pending", "3", "0", "0", "0"]
        assert "tessera.io/v1" not in kubectl("get", "pg", "-o", "name")  # tessera.io's: none
        assert "No resources found" in kubectl.run("get", "podgroups.tessera.io").stderr
        applied = kubectl("apply", "-f", "-", stdin=COSCHEDULED + "".join(pods))
        assert "podgroup.scheduling.x-k8s.io/nginx unchanged" in applied
        assert "pod/nginx-2 created" in applied
        assert scheduler.run_once(now=time.monotonic() + 1000).bound == 3
    finally:
        db.dispose()
    for name in names:
        lifecycle.wait_for_phase(kubectl, name, "Running")
    group = yaml.safe_load(kubectl("get", "podgroup.scheduling.x-k8s.io", "nginx", "-o", "yaml"))
    assert group["spec"] == {
        "minMember": 3,
        "scheduleTimeoutSeconds": 30,
        "minResources": {"cpu": "3"},
    }
    assert {k: group["status"][k] for k in ("phase", "scheduled", "running")} == {
        "phase": "Running",
        "scheduled": 3,
        "running": 3,
    }
    both = (
        COSCHEDULED_POD.replace("NAME", "both")
        .replace("ZONE", tessera.zone)
        .replace("app: nginx,", "tessera.io/pod-group: nginx,")
    )
    assert "belongs to one gang" in kubectl.fails("apply", "-f", "-", stdin=both)
    # The group goes while its pods remain (as with Kubernetes and scheduler-plugins): they run
    # on, on their own.
    assert "deleted" in kubectl("delete", "podgroups.scheduling.x-k8s.io", "nginx")
    assert "NotFound" in kubectl.fails("get", "podgroups.scheduling.x-k8s.io", "nginx")
    for name in names:
        assert kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") == "Running"
    kubectl("delete", "pods", "-l", "scheduling.x-k8s.io/pod-group=nginx", "--grace-period=1")


def test_exec_attach_and_cp_without_a_node_agent_say_why_not(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> None:
    """These nodes are run by the control plane's node loop, with no agent of their own to run
    a session on: kubectl says so in words (tests/agent/test_sessions.py runs sessions on the
    docker runtime, and shows what the virtual runtime's agent answers)."""
    from tests.e2e.lifecycle import bring_to
    from tests.e2e.lifecycle import manifest as slice_manifest

    kubectl: Kubectl = tenant_kubectl()
    kubectl("apply", "-f", "-", stdin=slice_manifest("shell"))
    bring_to(
        "Running",
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name="shell",
    )
    for args in (
        ("exec", "shell", "--", "ls"),
        ("attach", "shell"),
        ("cp", "shell:/etc/hosts", "/tmp/tessera-cp-test"),
    ):
        done = kubectl.run(*args, check=False, timeout=30)
        assert done.returncode != 0, args
        assert "is not connected: it cannot run" in done.stderr, done.stderr
    # port-forward too, before it listens (its connections would come later)
    done = kubectl.run("port-forward", "shell", "18080:80", check=False, timeout=30)
    assert done.returncode != 0 and "is not connected: it cannot run" in done.stderr, done.stderr
    assert "NotFound" in kubectl.fails("exec", "nothing", "--", "ls")
    assert json.loads(kubectl("get", "pod", "shell", "-o", "json"))["status"]["phase"] == "Running"


def test_a_terminating_pod_is_not_ready(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> None:
    """Clients that wait for Ready=False after a delete see it while the pod stops."""
    from tests.e2e.lifecycle import bring_to
    from tests.e2e.lifecycle import manifest as slice_manifest

    kubectl: Kubectl = tenant_kubectl()
    held = slice_manifest("stopping", extra_meta="finalizers: [example.com/hold]")
    kubectl("apply", "-f", "-", stdin=held)
    running = bring_to(
        "Running",
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name="stopping",
    )
    ready = {c["type"]: c["status"] for c in running["status"]["conditions"]}
    assert ready["Ready"] == "True" and running["status"]["containerStatuses"][0]["ready"]
    kubectl("delete", "pod", "stopping", "--wait=false", "--grace-period=2")
    kubectl("wait", "--for=condition=Ready=false", "pod/stopping", "--timeout=20s")
    pod = json.loads(kubectl("get", "pod", "stopping", "-o", "json"))
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["ContainersReady"]["reason"] == "ContainersNotReady"
    assert "terminating" in conditions["Ready"]["message"]
    assert pod["status"]["containerStatuses"][0]["ready"] is False
    row = rows(kubectl("get", "pod", "stopping"))["stopping"]
    assert row[1:3] == ["0/1", "Terminating"]
    kubectl(
        "patch",
        "pod",
        "stopping",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )
    kubectl("wait", "--for=delete", "pod/stopping", "--timeout=30s")


DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: registry.example/web:1}]}
"""


def test_services_through_kubectl(tenant_kubectl) -> None:
    """`kubectl create service`, `get svc` with Kubernetes' columns, a headless Service, and the
    types a serverless pool does not serve refused in words."""
    kubectl: Kubectl = tenant_kubectl()
    kubectl("create", "service", "clusterip", "web", "--tcp=80:8080")
    kubectl("create", "service", "clusterip", "peers", "--clusterip=None", "--tcp=2222")
    listed = kubectl("get", "svc")
    assert columns(listed)[:5] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"]
    web, peers = rows(listed)["web"], rows(listed)["peers"]
    assert web[1] == "ClusterIP" and web[2].startswith("10.") and web[4] == "80/TCP"
    assert peers[2] == "None"
    spec = json.loads(kubectl("get", "svc", "web", "-o", "json"))["spec"]
    assert spec["ports"] == [{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    refused = kubectl.fails("create", "service", "nodeport", "np", "--tcp=80")
    assert "ClusterIP Services only" in refused
    kubectl("delete", "svc", "web", "peers")
    assert "No resources found" in kubectl.run("get", "services").stderr


def test_cluster_info_and_kinds_tessera_does_not_serve(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    info = kubectl("cluster-info")
    assert "Kubernetes control plane is running at https://127.0.0.1:" in info
    assert "No resources found" in kubectl.run("get", "services").stderr
    assert "NotFound" in kubectl.fails("get", "service", "web")
    # a manifest of a kind Tessera does not serve: kubectl says which kinds it does
    error = kubectl.fails("apply", "-f", "-", stdin=DAEMONSET)
    assert "the kind being validated is not one Tessera serves" in error, error
    assert "Pod (v1)" in error and "PodGroup (tessera.io/v1)" in error
    assert "could not find the requested resource" not in error


def test_admin_applies_nodes_with_server_side_validation(
    admin_kubectl: Kubectl, tmp_path: Path
) -> None:
    name = unique("applied")
    manifest = tmp_path / "node.yaml"
    node = (
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{rack: {rack}}}\n"
        "spec:\n  {spec}: true\nstatus:\n  capacity: {{cpu: '8', memory: 32Gi}}\n"
    )
    manifest.write_text(node.format(name=name, rack="r1", spec="unschedulabel"))
    typo = admin_kubectl.fails("apply", "-f", str(manifest))
    assert 'strict decoding error: unknown field "spec.unschedulabel"' in typo
    assert "NotFound" in admin_kubectl.fails("get", "node", name)

    manifest.write_text(node.format(name=name, rack="r1", spec="unschedulable"))
    assert admin_kubectl("apply", "-f", str(manifest)).strip() == f"node/{name} created"
    manifest.write_text(node.format(name=name, rack="r2", spec="unschedulable"))
    assert admin_kubectl("apply", "-f", str(manifest)).strip() == f"node/{name} configured"
    assert admin_kubectl("get", "node", name, "-o", "jsonpath={.metadata.labels.rack}") == "r2"
    manifest.write_text(node.format(name=name, rack="r3", spec="unschedulabel"))
    typo = admin_kubectl.fails("apply", "-f", str(manifest))
    assert 'unknown field "spec.unschedulabel"' in typo
    assert admin_kubectl("get", "node", name, "-o", "jsonpath={.metadata.labels.rack}") == "r2"
    assert admin_kubectl("delete", "node", name).strip() == f'node "{name}" deleted'


def test_drain_evicts_the_pods_of_a_node(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl("apply", "-f", "-", stdin=lifecycle.manifest("drained"))
    assert kubectl.namespace is not None
    node = lifecycle.bind(admin_kubectl, tessera, kubectl.namespace, "drained")
    lifecycle.wait_for_phase(kubectl, "drained", "Running")
    drained = admin_kubectl.run(
        "drain", node, "--force", "--ignore-daemonsets", "--grace-period=2", "--timeout=60s"
    )
    try:
        out = drained.stdout + drained.stderr
        assert f"node/{node} cordoned" in out
        assert f"evicting pod {kubectl.namespace}/drained" in out  # the Eviction API, not delete
        assert "pod/drained evicted" in out and f"node/{node} drained" in out
        assert "NotFound" in kubectl.fails("get", "pod", "drained")
    finally:
        admin_kubectl("uncordon", node)


def test_logs_of_a_pod_through_its_life(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl("apply", "-f", "-", stdin=lifecycle.manifest("talker"))
    waiting = kubectl.fails("logs", "talker")
    assert "is waiting to start: Tessera has not placed the pod on a node yet" in waiting
    assert kubectl.namespace is not None
    lifecycle.bind(admin_kubectl, tessera, kubectl.namespace, "talker")
    lifecycle.wait_for_phase(kubectl, "talker", "Running")
    assert kubectl("logs", "talker").splitlines() == [
        "tessera-runtime: started container main from image registry.example/app:1.0",
        "tessera-runtime: command (the image's entrypoint), args (none)",
    ]
    assert kubectl("logs", "talker", "--tail=1", "--timestamps").count("\n") == 1
    assert kubectl("logs", "talker", "-c", "main", "--since=1h").count("\n") == 2
    assert "not found" in kubectl.fails("logs", "talker", "--previous")
    # -f follows until the pod is gone: the stop is written while it ends.
    follow = subprocess.Popen(
        [str(KUBECTL), "--kubeconfig", str(kubectl.kubeconfig), "logs", "-f", "talker"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    kubectl("delete", "pod", "talker", "--grace-period=2")
    out, _ = follow.communicate(timeout=30)
    assert "tessera-runtime: SIGTERM: stopping within 2s" in out.splitlines()


def test_kubectl_reads_metrics_as_the_admin_only(admin_kubectl, tenant_kubectl) -> None:
    kubectl = tenant_kubectl()
    kubectl("get", "pods")
    text = admin_kubectl("get", "--raw", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = [s.labels for s in families["apiserver_request"].samples if s.value > 0]
    listed = {"verb": "list", "group": "", "resource": "pods", "subresource": "", "code": "200"}
    assert listed in requests
    assert families["scheduler_pod_scheduling_duration_seconds"].type == "histogram"
    assert "only the admin may get /metrics" in kubectl.fails("get", "--raw", "/metrics")


PRICE = """
apiVersion: billing.tessera.io/v1
kind: Price
metadata: {name: NAME}
spec:
  effectiveFrom: "WHEN"
  bestEffortFraction: "0.2"
  compute:
    general-purpose: {vcpuHour: "0.036", memoryGiBHour: "0.0072"}
    performance: {vcpuHour: "0.05", memoryGiBHour: "0.01"}
    gpu: {vcpuHour: "0.036", memoryGiBHour: "0.0072"}
  gpus:
    "*": {vramGiBHour: "0.018", smPercentHour: "0.036"}
  commitmentTiers:
  - {minPerDay: "10", discount: "0.1"}
  - {minPerDay: "100", discount: "0.2"}
"""

COMMITMENT = """
apiVersion: billing.tessera.io/v1
kind: Commitment
metadata: {name: plan}
spec: {amountPerDay: "AMOUNT"}
"""


def test_billing_kinds_through_kubectl(admin_kubectl, tenant_kubectl, tessera: Process) -> None:
    """Prices are the admin's to write and everyone's to read; a tenant manages its commitment
    plan with apply and reads its statements and usage with get."""
    kubectl = tenant_kubectl()
    name = unique("price-")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    price = PRICE.replace("NAME", name).replace("WHEN", when)
    # kubectl's own validation (server-side, through the OpenAPI document's PATCH) needs no flag
    assert "created" in admin_kubectl("apply", "-f", "-", stdin=price)
    listed = kubectl("get", "prices")
    assert columns(listed)[:4] == ["NAME", "EFFECTIVE", "PHASE", "BESTEFFORT"]
    assert rows(listed)[name][2] == "Scheduled"
    assert "unchanged" in admin_kubectl("apply", "-f", "-", stdin=price)
    labelled = price.replace(
        "metadata: {name: " + name, "metadata: {labels: {tier: std}, name: " + name
    )
    assert "configured" in admin_kubectl("apply", "-f", "-", stdin=labelled)
    stored = json.loads(admin_kubectl("get", "price", name, "-o", "json"))
    assert stored["metadata"]["labels"] == {"tier": "std"}
    # its rates never change once written: the refusal says what to do instead
    refused = admin_kubectl.fails("apply", "-f", "-", stdin=labelled.replace('"0.05"', '"0.06"'))
    assert "a price version never changes" in refused and "delete it" in refused
    assert json.loads(admin_kubectl("get", "price", name, "-o", "json"))["spec"] == stored["spec"]
    assert "forbidden" in kubectl.fails("label", "--overwrite", "price", name, "tier=cheap")
    assert "forbidden" in kubectl.fails("delete", "price", name)

    kubectl("apply", "-f", "-", stdin=COMMITMENT.replace("AMOUNT", "50"))
    plan = json.loads(kubectl("get", "commitment", "plan", "-o", "json"))
    assert plan["spec"]["amountPerDay"] == "50.00"  # in the currency's minor units
    assert rows(kubectl("get", "commitments"))["plan"][1] == "50.00"
    kubectl("apply", "-f", "-", stdin=COMMITMENT.replace("AMOUNT", "80"))
    assert json.loads(kubectl("get", "commitment", "plan", "-o", "json"))["spec"] == {
        "amountPerDay": "80.00"
    }
    assert "amountPerDay" in kubectl.fails(
        "apply", "-f", "-", stdin=COMMITMENT.replace("AMOUNT", "-5")
    )

    kubectl("create", "-f", "-", stdin=manifest("billed"))
    bind(kubectl, admin_kubectl, tessera, "billed")
    time.sleep(1.1)  # a whole second billed
    statements = kubectl("get", "statements")
    assert columns(statements)[:3] == ["NAME", "PHASE", "TOTAL"]
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert rows(statements)[today][1] == "Provisional"
    usage = kubectl("get", "usage")
    assert columns(usage)[:2] == ["START", "END"]
    document = json.loads(kubectl("get", "usage", "-o", "json"))
    assert document["kind"] in ("UsageList", "List")  # kubectl may rewrap a list
    assert {"vcpu", "memory"} <= {item["resource"] for item in document["items"]}
    by_pod = kubectl("get", "usage", "pod")  # a report named by its grouping
    assert columns(by_pod)[:3] == ["START", "END", "POD"]
    assert any(line.split()[2].endswith("/billed") for line in by_pod.splitlines()[1:])
    kubectl("delete", "commitment", "plan")
    assert "NotFound" in kubectl.fails("get", "commitment", "plan") or "not found" in (
        kubectl.fails("get", "commitment", "plan")
    )


def test_get_gpu_shows_a_fault_and_its_repair(admin_kubectl: Kubectl, tessera: Process) -> None:
    """The admin reports a fault through the API (`kubectl create --raw`, as a node agent
    would POST it); `kubectl get gpu` shows it Unhealthy with its last fault until the repair."""
    gpus = json.loads(
        admin_kubectl(
            "get", "gpu", "-l", f"topology.kubernetes.io/zone={tessera.zone}", "-o", "json"
        )
    )["items"]
    name = gpus[-1]["metadata"]["name"]
    report = {"apiVersion": "tessera.io/v1", "kind": "GPUFault", "spec": {"kind": "xid", "xid": 79}}
    path = f"/apis/tessera.io/v1/gpudevices/{name}"
    admin_kubectl("create", "--raw", f"{path}/fault", "-f", "-", stdin=json.dumps(report))
    try:
        row = rows(admin_kubectl("get", "gpu", name))[name]
        assert row[5:9] == ["Unhealthy", "xid", "79", row[8]] and row[8].startswith("(")
        wide = admin_kubectl("get", "gpu", name, "-o", "wide")
        assert "tessera.io/gpu-fault:NoExecute" in wide
    finally:
        admin_kubectl("create", "--raw", f"{path}/repair", "-f", "-", stdin="{}")
    row = rows(admin_kubectl("get", "gpu", name))[name]
    assert row[5] == "Healthy" and row[6:9] == ["xid", "79", row[8]]
    assert "repaired)" in admin_kubectl("get", "gpu", name)


def test_kubectl_resizes_a_running_pod_in_place(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process
) -> None:
    """`kubectl patch pod X --subresource resize` (kubectl 1.32 reads the pod through the
    subresource, then sends a strategic merge patch to it)."""
    kubectl: Kubectl = tenant_kubectl()
    discovery = json.loads(kubectl("get", "--raw", "/api/v1"))
    served = {r["name"]: r for r in discovery["resources"]}
    assert sorted(served["pods/resize"]["verbs"]) == ["get", "patch", "update"]
    kubectl("apply", "-f", "-", stdin=lifecycle.manifest("grow"))
    assert kubectl.namespace is not None
    node = lifecycle.bind(admin_kubectl, tessera, kubectl.namespace, "grow")
    lifecycle.wait_for_phase(kubectl, "grow", "Running")
    free = json.loads(admin_kubectl("get", "node", node, "-o", "json"))
    before = free["metadata"]["annotations"]["tessera.io/free-cpu"]
    cpu4 = '{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"4"},"limits":{"cpu":"4"}}}]}}'
    out = kubectl("patch", "pod", "grow", "--subresource", "resize", "--patch", cpu4)
    assert out.strip() == "pod/grow patched"
    pod = json.loads(kubectl("get", "pod", "grow", "-o", "json"))
    assert pod["metadata"]["annotations"]["tessera.io/pod-use-spec"] == "4-4Gi"
    assert pod["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "4"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-core"] == "10"
    after = json.loads(admin_kubectl("get", "node", node, "-o", "json"))
    assert float(after["metadata"]["annotations"]["tessera.io/free-cpu"]) == float(before) - 3
    assert "Resized" in kubectl("describe", "pod", "grow")
    # The GPU share cannot be resized: refused in words, nothing written.
    gpu = '{"spec":{"containers":[{"name":"main","resources":{"limits":{"tessera.io/gpu-core":"50"}}}]}}'
    refused = kubectl.fails("patch", "pod", "grow", "--subresource", "resize", "--patch", gpu)
    assert "cannot be resized in place" in refused, refused
    # Another tenant cannot resize it.
    other: Kubectl = tenant_kubectl()
    denied = other.fails(
        "patch", "pod", "grow", "-n", kubectl.namespace, "--subresource", "resize", "--patch", cpu4
    )
    assert "Forbidden" in denied or "forbidden" in denied, denied
    kubectl("delete", "pod", "grow", "--grace-period=0", "--force")
    # The ledger holds the rate change; its completeness check still passes.
    assert tessera.cli("billing", "audit", "--tenant", kubectl.namespace).endswith("complete")


CALLBACK = """
apiVersion: tessera.io/v1
kind: Callback
metadata:
  name: hook
spec:
  url: URL
  events: [PodFinished, EvictionNotice]
  description: our job tracker
"""


def test_callbacks_through_kubectl(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> None:
    """kubectl creates a Callback (its secret printed this once), lists it as a table, and the
    `tessera serve` process delivers a pod's end to the receiver, signed."""
    from app.callbacks.signing import verify
    from tests.receiver import Receiver

    kubectl: Kubectl = tenant_kubectl()
    with Receiver() as receiver:
        manifest_text = CALLBACK.replace("URL", receiver.url())
        secret = kubectl(
            "create", "-f", "-", "-o", "jsonpath={.status.signingSecret}", stdin=manifest_text
        )
        assert secret.startswith("whsec_")
        assert secret not in kubectl("get", "callback", "hook", "-o", "yaml")
        table = kubectl("get", "callbacks")
        assert columns(table) == ["NAME", "URL", "EVENTS", "LAST", "DELIVERY", "AGE"]
        assert rows(table)["hook"][1:4] == [receiver.url(), "PodFinished,EvictionNotice", "<none>"]
        assert "Description" in kubectl("get", "cb", "hook", "-o", "wide").title()
        refused = kubectl.fails(
            "apply", "-f", "-", stdin=manifest_text.replace(receiver.url(), "http://example.com/")
        )
        assert 'The Callback "hook" is invalid: spec.url' in refused
        assert "only to loopback" in refused
        described = kubectl("describe", "callback", "hook")
        assert "our job tracker" in described and receiver.url() in described
        assert secret not in described
        renamed = manifest_text.replace("our job tracker", "the tracker, renamed")
        assert "configured" in kubectl("apply", "-f", "-", stdin=renamed)
        description = kubectl("get", "cb", "hook", "-o", "jsonpath={.spec.description}")
        assert description == "the tracker, renamed"

        kubectl("apply", "-f", "-", stdin=lifecycle.manifest("job"))
        pod = lifecycle.bring_to(
            "Succeeded",
            kubectl=kubectl,
            admin=admin_kubectl,
            tessera=tessera,
            database_url=database_url,
            name="job",
        )
        (got,) = receiver.wait_for(1, timeout=30)
        verify(secret, got.body, got.headers["tessera-signature"])
        assert got.event["type"] == "io.tessera.pod.finished"
        assert got.event["data"]["uid"] == pod["metadata"]["uid"]
        deadline = time.monotonic() + 30
        while "Delivered" not in (table := kubectl("get", "callbacks")):
            assert time.monotonic() < deadline, table
            time.sleep(0.2)
        deliveries = json.loads(
            kubectl(
                "get",
                "--raw",
                f"/apis/tessera.io/v1/namespaces/{kubectl.namespace}/callbacks/hook/deliveries",
            )
        )
        assert deliveries["items"][0]["phase"] == "Delivered"
        assert deliveries["items"][0]["eventId"] == got.event["id"]
        rotated = json.loads(
            kubectl(
                "create",
                "--raw",
                f"/apis/tessera.io/v1/namespaces/{kubectl.namespace}/callbacks/hook/rotate",
                "-f",
                "-",
                stdin="{}",
            )
        )
        assert rotated["status"]["signingSecret"] not in (secret, "")
        assert kubectl("delete", "callback", "hook").strip() == 'callback.tessera.io "hook" deleted'
