"""JobSets run by their controller: a real `tessera dev` (the API, the scheduler, the virtual
node agent and the controller manager in one process) on SQLite and on PostgreSQL, driven with
the real kubectl. The virtual runtime runs a container for `tessera.io/run-seconds` and exits
with `tessera.io/exit-code` (agent/runtime.py); the demo pool's GPU nodes have 8 GPUs, one
NVLink domain each."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.e2e import test_job_controller
from tests.e2e.test_job_controller import demo, eventually
from tests.events import assert_each_named_once, named

__all__ = ["demo"]  # the fixture: `tessera dev` on each database, the demo tenant's kubeconfig


UNREACHED = (
    "TLS handshake timeout",
    "Unable to connect to the server",
    "failed to download openapi",
)


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """kubectl with a cache of its own beside the server's data (a cache kept for the same
    address by an earlier server, of fewer kinds, would make kubectl look for the JobSet's
    schema where it is not). A request that never reached the server (a TLS handshake timed out
    on a loaded machine, and kubectl's schema download with it) is made again, twice at most."""
    cache = kubeconfig.parent / "kube-cache"
    for attempt in range(3):
        try:
            return test_job_controller.kubectl(
                kubeconfig, "--cache-dir", str(cache), *args, stdin=stdin
            )
        except AssertionError as exc:
            if attempt == 2 or not any(words in str(exc) for words in UNREACHED):
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def get(kubeconfig: Path, *args: str) -> Any:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))


def jobset_yaml(
    name: str,
    *,
    annotations: str = "",
    spec: str = "",
    ps_run: str = "600",
    worker_run: str = "2",
    worker_code: str = "0",
    gpus: int = 0,
) -> str:
    resources = f"nvidia.com/gpu: {gpus}" if gpus else 'cpu: "1", memory: 1Gi'
    limits = f"limits: {{{resources}}}" if gpus else f"requests: {{{resources}}}"

    def role(role: str, replicas: int, run: str, code: str) -> str:
        return f"""
  - name: {role}
    replicas: {replicas}
    template:
      spec:
        backoffLimit: 0
        template:
          metadata:
            annotations:
              tessera.io/run-seconds: "{run}"
              tessera.io/exit-code: "{code}"
          spec:
            restartPolicy: Never
            containers:
            - name: main
              image: busybox
              resources: {{{limits}}}"""

    return f"""
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {name}
  annotations: {{{annotations}}}
spec:
{spec}
  replicatedJobs:{role("ps", 1, ps_run, "0")}{role("workers", 3, worker_run, worker_code)}
"""


def pods_of(kubeconfig: Path, jobset: str) -> list[dict[str, Any]]:
    items = get(kubeconfig, "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={jobset}")["items"]
    return sorted(items, key=lambda p: p["spec"].get("hostname") or "")


def jobs_of(kubeconfig: Path, jobset: str) -> list[dict[str, Any]]:
    items = get(kubeconfig, "jobs", "-l", f"jobset.sigs.k8s.io/jobset-name={jobset}")["items"]
    return sorted(items, key=lambda j: j["metadata"]["name"])


def pod_group(kubeconfig: Path, name: str) -> dict[str, Any] | None:
    items = get(kubeconfig, "podgroups.tessera.io")["items"]
    return next((g for g in items if g["metadata"]["name"] == name), None)


def test_a_jobset_is_one_gang_and_completes_when_its_workers_do(demo: Path) -> None:
    spec = "  successPolicy: {operator: All, targetReplicatedJobs: [workers]}"
    kubectl(
        demo,
        "apply",
        "-f",
        "-",
        stdin=jobset_yaml("gang", annotations="tessera.io/topology-required: node", spec=spec),
    )
    jobset = get(demo, "jobset", "gang")
    pods = eventually(
        lambda: len(made := pods_of(demo, "gang")) == 4 and made, "4 pods", seconds=180
    )
    assert [p["spec"]["hostname"] for p in pods] == [
        "gang-ps-0-0",
        "gang-workers-0-0",
        "gang-workers-1-0",
        "gang-workers-2-0",
    ]
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert pod["spec"]["subdomain"] == "gang"
        assert labels["tessera.io/pod-group"] == "gang"
        assert labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
        assert labels["jobset.sigs.k8s.io/jobset-uid"] == jobset["metadata"]["uid"]
    jobs = jobs_of(demo, "gang")
    assert [j["metadata"]["name"] for j in jobs] == [
        "gang-ps-0",
        "gang-workers-0",
        "gang-workers-1",
        "gang-workers-2",
    ]
    for job in jobs:
        (owner,) = job["metadata"]["ownerReferences"]
        assert owner["kind"] == "JobSet" and owner["uid"] == jobset["metadata"]["uid"]
        assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
    group = pod_group(demo, "gang")
    assert group is not None
    assert group["spec"] == {"minMember": 4, "topology": {"required": "node"}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == jobset["metadata"]["uid"]

    # the gang: all on one node (required: node)
    def every_pod_bound() -> list[dict[str, Any]] | None:
        made = pods_of(demo, "gang")
        return made if made and all(p["spec"].get("nodeName") for p in made) else None

    bound = eventually(every_pod_bound, "every pod bound", seconds=180)
    assert len({p["spec"]["nodeName"] for p in bound}) == 1

    kubectl(demo, "wait", "--for=condition=completed", "jobset/gang", "--timeout=180s")
    status = get(demo, "jobset", "gang")["status"]
    assert status["terminalState"] == "Completed"
    completed = next(c for c in status["conditions"] if c["type"] == "Completed")
    assert completed["reason"] == "AllJobsCompleted"
    workers = next(r for r in status["replicatedJobsStatus"] if r["name"] == "workers")
    assert workers["succeeded"] == 3
    row = kubectl(demo, "get", "jobsets", "--no-headers").split("\n")
    (row_gang,) = [r.split() for r in row if r.startswith("gang ")]
    assert row_gang[:5] == ["gang", "Completed", "0", "True", "false"]
    described = eventually(
        lambda: (
            (out := kubectl(demo, "describe", "jobset", "gang"))
            and "AllJobsCompleted" in out
            and "SuccessfulCreate" in out
            and out
        ),
        "the JobSet's events",
    )
    assert "jobset completed successfully" in described
    # the Jobs it made together, named in one SuccessfulCreate (each Job in exactly one)
    selector = "involvedObject.kind=JobSet,involvedObject.name=gang"
    created = named(get(demo, "events", "--field-selector", selector)["items"], "SuccessfulCreate")
    assert_each_named_once(created, ["gang-ps-0", *(f"gang-workers-{i}" for i in range(3))])
    # the parameter server, still running when the workers were done, is ended with its Job
    eventually(
        lambda: "gang-ps-0" not in [j["metadata"]["name"] for j in jobs_of(demo, "gang")],
        "the ps Job deleted once the set completed",
    )

    # deleting the JobSet deletes its Jobs, their pods and its PodGroup
    kubectl(demo, "delete", "jobset", "gang")
    eventually(lambda: not jobs_of(demo, "gang"), "the Jobs deleted")
    eventually(lambda: not pods_of(demo, "gang"), "the pods deleted")
    eventually(lambda: pod_group(demo, "gang") is None, "the PodGroup deleted")


def test_a_set_too_large_for_its_domain_binds_none(demo: Path) -> None:
    """4 pods of 4 GPUs within one NVLink domain (8 GPUs): each would fit alone, the set does
    not, so none is bound."""
    kubectl(
        demo,
        "apply",
        "-f",
        "-",
        stdin=jobset_yaml("big", annotations="tessera.io/topology-required: nvlink", gpus=4),
    )

    def told() -> list[dict[str, Any]] | None:
        pods = pods_of(demo, "big")
        if len(pods) < 4:
            return None
        reasons = [
            c
            for p in pods
            for c in p["status"].get("conditions") or []
            if c["type"] == "PodScheduled"
            and c["status"] == "False"
            and "gang needs" in (c.get("message") or "")  # the verdict, not the wait for pods
        ]
        return pods if len(reasons) == 4 else None

    pods = eventually(told, "the gang's pods told why they wait", seconds=180)
    for pod in pods:
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert cond["reason"] == "Unschedulable"
        assert "gang needs 4 pods" in cond["message"], cond
        assert (
            "within one NVLink domain; the roomiest NVLink domain holds only 2" in cond["message"]
        )
    time.sleep(2)  # several scheduling cycles later: still none bound
    assert not any(p["spec"].get("nodeName") for p in pods_of(demo, "big"))
    kubectl(demo, "delete", "jobset", "big")
    eventually(lambda: not pods_of(demo, "big"), "the pods deleted")


def test_failure_policy_restarts_the_whole_set(demo: Path) -> None:
    """Every worker fails: the set is recreated once (maxRestarts 1), then fails. At no time
    do two live pods have one hostname, nor pods of two attempts live together."""
    kubectl(
        demo,
        "apply",
        "-f",
        "-",
        stdin=jobset_yaml("flaky", spec="  failurePolicy: {maxRestarts: 1}", worker_code="1"),
    )
    attempts_seen: set[str] = set()

    def failed() -> bool:
        live = [p for p in pods_of(demo, "flaky") if not p["metadata"].get("deletionTimestamp")]
        hostnames = [p["spec"]["hostname"] for p in live]
        assert len(hostnames) == len(set(hostnames)), hostnames
        attempts = {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in live}
        assert len(attempts) <= 1, attempts
        attempts_seen.update(attempts)
        conditions = get(demo, "jobset", "flaky").get("status", {}).get("conditions") or []
        return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)

    eventually(failed, "the JobSet failed after its restart", seconds=360)
    assert attempts_seen == {"0", "1"}
    status = get(demo, "jobset", "flaky")["status"]
    assert status["restarts"] == 1 and status["restartsCountTowardsMax"] == 1
    (cond,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "ReachedMaxRestarts"
    jobs = jobs_of(demo, "flaky")
    assert {j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for j in jobs} == {"1"}
    row = kubectl(demo, "get", "jobset", "flaky", "--no-headers").split()
    assert row[1:3] == ["Failed", "1"]
    eventually(
        lambda: (
            (out := kubectl(demo, "describe", "jobset", "flaky"))
            and "Restarting" in out
            and "restarting jobset, attempt 1" in out
            and "ReachedMaxRestarts" in out
        ),
        "the JobSet's restart and failure events",
    )
    kubectl(demo, "delete", "jobset", "flaky")
    eventually(lambda: not pods_of(demo, "flaky"), "the pods deleted")
    eventually(lambda: not jobs_of(demo, "flaky"), "the Jobs deleted")


def small_jobset(name: str, *, run: str, hold: bool = False) -> str:
    """Two worker Jobs of one pod each (held by the test's finalizer when `hold`)."""
    finalizers = f"\n            finalizers: [{test_job_controller.HOLD}]" if hold else ""
    return f"""
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {name}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        template:
          metadata:{finalizers}
            annotations:
              tessera.io/run-seconds: "{run}"
          spec:
            restartPolicy: Never
            nodeSelector: {{tessera.io/runtime: virtual}}  # run-seconds is the virtual's
            containers:
            - name: main
              image: busybox
              resources: {{requests: {{cpu: "1", memory: 1Gi}}}}
"""


def names(kubeconfig: Path, resource: str) -> list[str]:
    return [i["metadata"]["name"] for i in get(kubeconfig, resource)["items"]]


def running(kubeconfig: Path, jobset: str, count: int) -> list[dict[str, Any]] | None:
    pods = pods_of(kubeconfig, jobset)
    ran = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(ran) == count == len(pods) else None


def test_deleting_a_jobset_foreground_and_orphan(demo: Path) -> None:
    """The two JobSets at once: the orphans run to their end while the other is deleted."""
    marked = test_job_controller.marked
    kubectl(demo, "apply", "-f", "-", stdin=small_jobset("jso", run="15"))
    kubectl(demo, "apply", "-f", "-", stdin=small_jobset("jsf", run="600", hold=True))

    # Orphan: its Jobs (and their pods) and its PodGroup stay, on their own, and run to the end
    eventually(lambda: running(demo, "jso", 2), "two pods running", seconds=240)
    kubectl(demo, "delete", "jobset", "jso", "--cascade=orphan")
    assert "jso" not in names(demo, "jobsets")
    jobs = jobs_of(demo, "jso")
    assert [j["metadata"]["name"] for j in jobs] == ["jso-workers-0", "jso-workers-1"]
    assert all(not j["metadata"].get("ownerReferences") for j in jobs)
    group = pod_group(demo, "jso")
    assert group is not None and not group["metadata"].get("ownerReferences")
    assert not get(demo, "service", "jso")["metadata"].get("ownerReferences")

    # Foreground: the JobSet waits for its Jobs, which wait for their pods
    before = eventually(lambda: running(demo, "jsf", 2), "two pods running", seconds=240)
    # its headless Service, named as the pods' subdomain, lists them by hostname
    jobset = get(demo, "jobset", "jsf")
    service = get(demo, "service", "jsf")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": "jsf"}
    assert service["spec"]["publishNotReadyAddresses"] is True
    (owner,) = service["metadata"]["ownerReferences"]
    assert owner["kind"] == "JobSet" and owner["uid"] == jobset["metadata"]["uid"]

    def endpoints() -> list[tuple[str, str]] | None:
        slices = get(demo, "endpointslices", "-l", "kubernetes.io/service-name=jsf")["items"]
        listed = sorted(
            (e.get("hostname", ""), e["targetRef"]["name"])
            for s in slices
            for e in s.get("endpoints") or []
        )
        return listed if len(listed) == 2 else None

    assert eventually(endpoints, "the pods in the Service's EndpointSlice") == [
        ("jsf-workers-0-0", before[0]["metadata"]["name"]),
        ("jsf-workers-1-0", before[1]["metadata"]["name"]),
    ]
    assert [p["spec"]["subdomain"] for p in before] == ["jsf", "jsf"]
    kubectl(demo, "delete", "jobset", "jsf", "--cascade=foreground", "--wait=false")
    held = eventually(lambda: marked(pods_of(demo, "jsf"), 2), "its pods being deleted")
    assert [p["metadata"]["name"] for p in held] == [p["metadata"]["name"] for p in before]
    jobset = get(demo, "jobset", "jsf")
    assert "foregroundDeletion" in jobset["metadata"]["finalizers"]
    assert marked(jobs_of(demo, "jsf"), 2)  # deleted in the foreground too: still there
    test_job_controller.release(demo, held)
    eventually(lambda: not get(demo, "jobsets")["items"], "the JobSet gone at last")
    assert jobs_of(demo, "jsf") == [] and pods_of(demo, "jsf") == []
    assert pod_group(demo, "jsf") is None
    eventually(lambda: "jsf" not in names(demo, "services"), "its Service gone with it")
    eventually(lambda: "jsf" not in names(demo, "endpointslices"), "and its EndpointSlice")

    # the orphans, left alone through all of it, ran to their end
    kubectl(
        demo,
        "wait",
        "--for=condition=complete",
        "job/jso-workers-0",
        "job/jso-workers-1",
        "--timeout=80s",
    )
    assert [p["status"]["phase"] for p in pods_of(demo, "jso")] == ["Succeeded"] * 2
    kubectl(demo, "delete", "jobs", "jso-workers-0", "jso-workers-1")
    kubectl(demo, "delete", "podgroups.tessera.io", "jso")
    kubectl(demo, "delete", "service", "jso")
    eventually(lambda: not pods_of(demo, "jso"), "the pods deleted with their Jobs")


def test_the_example_runs_in_one_rack(demo: Path) -> None:
    """examples/jobset.yaml: one gang of a 1-GPU parameter server and eight 4-GPU workers,
    bound together in one rack, done when the workers are."""
    example = Path(__file__).resolve().parents[2] / "examples" / "jobset.yaml"
    kubectl(demo, "apply", "-f", str(example))
    group = eventually(lambda: pod_group(demo, "train"), "the PodGroup", seconds=120)
    assert group["spec"] == {"minMember": 9, "topology": {"required": "rack"}}

    def bound() -> list[dict[str, Any]] | None:
        pods = pods_of(demo, "train")
        placed = [p for p in pods if p["spec"].get("nodeName")]
        assert len(placed) in (0, len(pods)) or len(pods) < 9, "a gang bound in part"
        return pods if len(pods) == 9 and len(placed) == 9 else None

    pods = eventually(bound, "the 9 pods bound", seconds=240)
    assert [p["spec"]["hostname"] for p in pods] == ["train-ps-0-0"] + [
        f"train-workers-{i}-0" for i in range(8)
    ]
    racks = {
        get(demo, "node", p["spec"]["nodeName"])["metadata"]["labels"]["tessera.io/rack"]
        for p in pods
    }
    assert len(racks) == 1, racks
    kubectl(demo, "wait", "--for=condition=completed", "jobset/train", "--timeout=180s")
    kubectl(demo, "delete", "-f", str(example))
    eventually(lambda: not pods_of(demo, "train"), "the pods deleted", seconds=120)
