"""Jobs and CronJobs run by their controllers: a real `tessera dev` (the API, the scheduler, the
virtual node agent and the controller manager in one process) on SQLite and on PostgreSQL,
driven with the real kubectl. The virtual runtime runs a container for
`tessera.io/run-seconds` and exits with `tessera.io/exit-code` (agent/runtime.py)."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import (
    BACKENDS,
    IN_CI,
    drop_postgres_database,
    free_port,
    migrated_url,
)
from tests.events import assert_each_named_once, named
from tests.test_dev_server import TESSERA, DevServer

KUBECTL = shutil.which("kubectl")


class Dev(DevServer):
    """`tessera dev` on a database of the backend asked for (None: its own SQLite)."""

    def __init__(self, data_dir: Path, port: int, database_url: str | None) -> None:
        super().__init__(data_dir, port)
        self.database_url = database_url

    def start(self) -> None:
        env = {**os.environ, "TESSERA_DATA_DIR": str(self.data_dir), "TESSERA_PORT": str(self.port)}
        env.pop("TESSERA_DATABASE_URL", None)
        # the virtual pool alone: these pods end by their run-seconds, which a docker node of
        # this host (added when an engine answers) would not honour
        env["TESSERA_DEV_DOCKER_NODE"] = "false"
        if self.database_url is not None:
            env["TESSERA_DATABASE_URL"] = self.database_url
        self.log = self.data_dir.parent / "dev.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [TESSERA, "dev"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        deadline = time.monotonic() + 180  # a loaded machine starts it slowly
        ca = self.data_dir / "tls" / "ca.crt"
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            if ca.exists():
                try:
                    ready = httpx.get(
                        f"https://127.0.0.1:{self.port}/readyz",
                        verify=ssl.create_default_context(cafile=str(ca)),
                        timeout=1,
                    )
                    if ready.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise AssertionError("tessera dev did not become ready: " + self.log.read_text())


@pytest.fixture(scope="module", params=BACKENDS)
def demo(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The demo tenant's kubeconfig of a running `tessera dev` on each database."""
    if KUBECTL is None:
        if IN_CI:
            pytest.fail("kubectl is not installed: CI must run the Job controller's tests with it")
        pytest.skip("kubectl is not installed")
    directory = tmp_path_factory.mktemp(f"jobs-{request.param}")
    # On PostgreSQL a migrated copy of the template (`tessera dev` finds nothing to migrate).
    url, name = (
        (None, None) if request.param == "sqlite" else migrated_url(request.param, directory)
    )
    server = Dev(directory / "data", free_port(), url)
    try:
        server.start()
        yield server.data_dir / "kubeconfig-demo"
    finally:
        server.stop()
        if name is not None:
            drop_postgres_database(name)


# What a client sees of a server slowed by a loaded machine (kubectl then falls back from the
# OpenAPI v3 document to v2, which Tessera does not serve): tried again, at most twice.
TRANSIENT = ("TLS handshake timeout", "failed to download openapi", "context deadline exceeded")


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: int = 90) -> str:
    assert KUBECTL is not None
    for attempt in range(3):
        done = subprocess.run(
            [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode == 0 or attempt == 2:
            break
        if not any(t in done.stderr for t in TRANSIENT):
            break
        time.sleep(1)
    assert done.returncode == 0, f"kubectl {' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def get(kubeconfig: Path, *args: str) -> Any:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))


def pods_of(kubeconfig: Path, job: str) -> list[dict[str, Any]]:
    items = get(kubeconfig, "pods", "-l", f"batch.kubernetes.io/job-name={job}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def eventually(check: Any, what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)


HOLD = "example.com/hold"  # a finalizer the test takes off its pods: they wait, marked, until then


def job_yaml(
    name: str, *, spec: str = "", run: str = "1", code: str = "0", hold: bool = False
) -> str:
    finalizers = f"\n      finalizers: [{HOLD}]" if hold else ""
    return f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
spec:
{spec}
  template:
    metadata:{finalizers}
      annotations:
        tessera.io/run-seconds: "{run}"
        tessera.io/exit-code: "{code}"
    spec:
      restartPolicy: Never
      nodeSelector: {{tessera.io/runtime: virtual}}  # run-seconds and exit-code are its
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "echo $JOB_COMPLETION_INDEX"]
        resources: {{requests: {{cpu: "1", memory: 1Gi}}}}
"""


# The CronJob of the schedule test fires once, at a whole minute chosen when the module's server
# has started (the first at least MINUTE_MARGIN seconds away, time to create it): that minute
# passes while the module's other tests run, and the test of it, the module's last, finds its
# Job made, where waiting for the next minute in the test itself cost 30 s on average.
MINUTE_MARGIN = 30
TICKS = "demo-ticks"  # a namespace of its own: the other tests count the CronJobs and Jobs of demo


@dataclass(frozen=True)
class Tick:
    kubeconfig: Path
    cronjob: dict[str, Any]
    minute: datetime  # the one time its schedule names (UTC)
    failed: str | None = None  # why it could not be made


@pytest.fixture(scope="module", autouse=True)
def tick(demo: Path) -> Tick:
    """`kubectl create cronjob` for `MM * * * *`, MM the first whole minute at least
    MINUTE_MARGIN seconds from now; its Jobs' pods run 1 s on the virtual runtime. A failure
    is the schedule test's to report (an autouse fixture's error would be every test's)."""
    minute = (datetime.now(UTC) + timedelta(seconds=MINUTE_MARGIN + 60)).replace(
        second=0, microsecond=0
    )
    try:
        return make_tick(demo, minute)
    except AssertionError as exc:
        return Tick(demo, {}, minute, failed=str(exc))


def make_tick(demo: Path, minute: datetime) -> Tick:
    kubectl(demo, "create", "namespace", TICKS)
    kubectl(
        demo,
        "create",
        "cronjob",
        "tick",
        "-n",
        TICKS,
        "--image=busybox",
        f"--schedule={minute.minute} * * * *",
        "--",
        "date",
    )
    kubectl(
        demo,
        "patch",
        "cronjob",
        "tick",
        "-n",
        TICKS,
        "--type=merge",
        "-p",
        '{"spec":{"jobTemplate":{"spec":{"template":{"metadata":{"annotations":'
        '{"tessera.io/run-seconds":"1"}},"spec":{"nodeSelector":{"tessera.io/runtime":"virtual"},'
        '"containers":[{"name":"tick","image":"busybox","command":["date"],'
        '"resources":{"requests":{"cpu":"1","memory":"1Gi"}}}]}}}}}}',
    )
    return Tick(demo, get(demo, "cronjob", "tick", "-n", TICKS), minute)


def test_a_job_runs_to_completion_and_kubectl_wait_returns(demo: Path) -> None:
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("once", spec="  completions: 2"))
    out = kubectl(demo, "wait", "--for=condition=complete", "job/once", "--timeout=80s")
    assert "condition met" in out
    job = get(demo, "job", "once")
    status = job["status"]
    assert status["succeeded"] == 2 and "active" not in status
    assert status["startTime"] <= status["completionTime"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Complete"]["status"] == "True"
    assert conditions["SuccessCriteriaMet"]["reason"] == "CompletionsReached"
    pods = pods_of(demo, "once")
    assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]  # kept
    for pod in pods:
        (owner,) = pod["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "once",
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    row = kubectl(demo, "get", "job", "once", "--no-headers").split()
    assert row[1:3] == ["Complete", "2/2"]
    # the Job controller's events: each pod named in the one SuccessfulCreate of its slow-start
    # step (a parallelism of 1: a pod a step, told as Kubernetes tells it)
    created = told(demo, "once", "SuccessfulCreate", len(pods))
    assert_each_named_once(created, names(pods))
    assert len(created) == 2
    shown = [f"Created pod: {name}" for name in names(pods)]
    described = described_with(demo, "job/once", "Job completed", *shown)
    assert "SuccessfulCreate" in described and "Completed" in described

    # deleting the Job deletes its pods
    kubectl(demo, "delete", "job", "once")
    eventually(lambda: not pods_of(demo, "once"), "the Job's pods deleted")


def test_an_indexed_job(demo: Path) -> None:
    spec = "  completions: 3\n  parallelism: 3\n  completionMode: Indexed"
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("idx", spec=spec))
    kubectl(demo, "wait", "--for=condition=complete", "job/idx", "--timeout=80s")
    assert get(demo, "job", "idx")["status"]["completedIndexes"] == "0-2"
    pods = pods_of(demo, "idx")
    indexes = sorted(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods
    )
    assert indexes == ["0", "1", "2"]
    for pod in pods:
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        assert pod["metadata"]["name"].startswith(f"idx-{index}-")
        assert pod["spec"]["hostname"] == f"idx-{index}"
        env = pod["spec"]["containers"][0]["env"]
        assert {"name": "JOB_COMPLETION_INDEX", "value": index} in env
    # its 3 pods made in the steps 1 and 2: two events, each pod named in one
    created = told(demo, "idx", "SuccessfulCreate", 3)
    assert_each_named_once(created, names(pods))
    assert sorted(map(len, created)) == [1, 2]
    kubectl(demo, "delete", "job", "idx")


def test_a_failing_job_backoff_limit_and_pod_failure_policy(demo: Path) -> None:
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("fails", spec="  backoffLimit: 0", code="1"))
    kubectl(demo, "wait", "--for=condition=failed", "job/fails", "--timeout=80s")
    status = get(demo, "job", "fails")["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and status["failed"] == 1
    assert "completionTime" not in status
    described = described_with(demo, "job/fails", "BackoffLimitExceeded")
    assert "Job has reached the specified backoff limit" in described
    assert "Warning" in described

    spec = """  backoffLimit: 6
  podFailurePolicy:
    rules:
    - action: FailJob
      onExitCodes: {operator: In, values: [42]}"""
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("policy", spec=spec, code="42"))
    kubectl(demo, "wait", "--for=condition=failed", "job/policy", "--timeout=80s")
    status = get(demo, "job", "policy")["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert "exit code 42 matching FailJob rule at index 0" in failed["message"]
    assert len(pods_of(demo, "policy")) == 1  # failed at once, not retried 6 times
    kubectl(demo, "delete", "job", "fails", "policy")


def test_suspend_and_resume(demo: Path) -> None:
    spec = "  suspend: true\n  completions: 1"
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("later", spec=spec, run="600"))
    kubectl(demo, "wait", "--for=condition=suspended", "job/later", "--timeout=60s")
    assert pods_of(demo, "later") == []
    assert kubectl(demo, "get", "job", "later", "--no-headers").split()[1] == "Suspended"
    kubectl(demo, "patch", "job", "later", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    eventually(
        lambda: [p for p in pods_of(demo, "later") if p["status"].get("phase") == "Running"],
        "a pod running once resumed",
    )
    conditions = {c["type"]: c for c in get(demo, "job", "later")["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "False"
    assert conditions["Suspended"]["reason"] == "JobResumed"
    # suspended again: its running pod is deleted, and not counted as a failure
    kubectl(demo, "patch", "job", "later", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    eventually(lambda: not pods_of(demo, "later"), "the pod deleted on suspension")
    status = get(demo, "job", "later")["status"]
    assert "failed" not in status and "active" not in status
    kubectl(demo, "delete", "job", "later")


def test_ttl_after_finished_deletes_the_job_and_its_pods(demo: Path) -> None:
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("brief", spec="  ttlSecondsAfterFinished: 0"))
    eventually(
        lambda: "brief" not in kubectl(demo, "get", "jobs", "-o", "name"),
        "the Job deleted after it finished",
    )
    eventually(lambda: not pods_of(demo, "brief"), "its pods deleted")


def described_with(kubeconfig: Path, what: str, *words: str, namespace: str | None = None) -> str:
    """`kubectl describe` of `what` once it shows every one of `words` (its events are sent
    beside the controller's writes)."""
    where = ("-n", namespace) if namespace else ()

    def shown() -> str | None:
        out = kubectl(kubeconfig, "describe", what, *where)
        return out if all(w in out for w in words) else None

    return str(eventually(shown, f"{what} described with {words}"))


def told(kubeconfig: Path, job: str, reason: str, count: int) -> list[list[str]]:
    """The names the Job's `reason` events list, once they name `count` pods (events are sent
    beside the controller's writes)."""

    def found() -> list[list[str]] | None:
        selector = f"involvedObject.kind=Job,involvedObject.name={job}"
        events = get(kubeconfig, "events", "--field-selector", selector)["items"]
        lists = named(events, reason)
        return lists if sum(map(len, lists)) >= count else None

    return list(eventually(found, f"{count} pods told in the {reason} events of {job}"))


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items)


def job_names(kubeconfig: Path) -> list[str]:
    return names(get(kubeconfig, "jobs")["items"])


def running(kubeconfig: Path, job: str, count: int) -> list[dict[str, Any]] | None:
    """The Job's pods once `count` of them run (and no other)."""
    pods = pods_of(kubeconfig, job)
    ran = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(ran) == count == len(pods) else None


def started(kubeconfig: Path, job: str, count: int) -> list[dict[str, Any]] | None:
    """The Job's pods once `count` of them have started (running or run to their end)."""
    pods = pods_of(kubeconfig, job)
    ran = [p for p in pods if p["status"].get("phase") in ("Running", "Succeeded")]
    return pods if len(ran) == count == len(pods) else None


def release(kubeconfig: Path, pods: list[dict[str, Any]]) -> None:
    """Take the test's finalizer off pods: those being deleted go."""
    for pod in pods:
        kubectl(
            kubeconfig,
            "patch",
            "pod",
            pod["metadata"]["name"],
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )


def marked(items: list[dict[str, Any]], count: int) -> list[dict[str, Any]] | None:
    """`items` once there are `count` of them, each being deleted."""
    ok = len(items) == count and all(i["metadata"].get("deletionTimestamp") for i in items)
    return items if ok else None


def test_deleting_a_job_with_each_propagation_policy(demo: Path) -> None:
    """The three Jobs at once: the orphans run to their end while the other two are deleted."""
    spec = "  completions: 2\n  parallelism: 2"
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("orph", spec=spec, run="10"))
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("fore", spec=spec, run="600", hold=True))
    kubectl(demo, "apply", "-f", "-", stdin=job_yaml("back", spec=spec, run="600"))

    # Orphan: the Job goes, its pods stay, without their owner, and run to their end
    # (a slow start makes the second pod a step after the first: on a loaded machine the
    # first may have run its 10 s before the second runs)
    orphans = eventually(lambda: started(demo, "orph", 2), "two pods started", seconds=120)
    kubectl(demo, "delete", "job", "orph", "--cascade=orphan")
    assert "orph" not in job_names(demo)
    pods = pods_of(demo, "orph")
    assert names(pods) == names(orphans)
    assert all(not p["metadata"].get("ownerReferences") for p in pods)

    # Foreground: the Job stays, marked, while the collector deletes its pods; none is replaced
    before = eventually(lambda: running(demo, "fore", 2), "two pods running")
    kubectl(demo, "delete", "job", "fore", "--cascade=foreground", "--wait=false")
    held = eventually(lambda: marked(pods_of(demo, "fore"), 2), "its pods being deleted")
    assert names(held) == names(before)  # the same two: the Job controller made no others
    job = get(demo, "job", "fore")
    assert job["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in job["metadata"]["finalizers"]
    release(demo, held)
    eventually(lambda: "fore" not in job_names(demo), "the Job gone once its pods are")
    assert pods_of(demo, "fore") == []

    # Background (kubectl's default): the Job goes at once, then its pods
    eventually(lambda: running(demo, "back", 2), "two pods running")
    kubectl(demo, "delete", "job", "back")
    assert "back" not in job_names(demo)
    eventually(lambda: not pods_of(demo, "back"), "its pods deleted after it")

    def finished() -> list[dict[str, Any]] | None:
        pods = pods_of(demo, "orph")
        ended = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        return pods if len(ended) == len(pods) else None

    done = eventually(finished, "the orphans run to their end")
    assert names(done) == names(orphans)  # neither deleted nor adopted, nor joined by others
    assert all(not p["metadata"].get("ownerReferences") for p in done)
    kubectl(demo, "delete", "pods", *names(done))


def cronjob_yaml(name: str, *, run: str, hold: bool = False) -> str:
    """A suspended CronJob: its Jobs are made by hand (`kubectl create job --from`)."""
    finalizers = f"\n          finalizers: [{HOLD}]" if hold else ""
    return f"""
apiVersion: batch/v1
kind: CronJob
metadata:
  name: {name}
spec:
  schedule: "*/1 * * * *"
  suspend: true
  jobTemplate:
    spec:
      template:
        metadata:{finalizers}
          annotations:
            tessera.io/run-seconds: "{run}"
        spec:
          restartPolicy: Never
          nodeSelector: {{tessera.io/runtime: virtual}}
          containers:
          - name: main
            image: busybox
            resources: {{requests: {{cpu: "1", memory: 1Gi}}}}
"""


BILLS = "demo-bills"
BATCH_SPEC = "  completions: 2\n  parallelism: 2"  # the usage test's namespace: its report holds its own pods alone
WORKLOADS = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeSelector: {{tessera.io/runtime: virtual}}
      containers:
      - {{name: app, image: busybox, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}
---
{job_yaml("batch", spec=BATCH_SPEC, run="2")}
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {{name: train}}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        template:
          metadata: {{annotations: {{tessera.io/run-seconds: "2"}}}}
          spec:
            restartPolicy: Never
            nodeSelector: {{tessera.io/runtime: virtual}}
            containers:
            - {{name: main, image: busybox, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: solo, annotations: {{tessera.io/run-seconds: "2"}}}}
spec:
  restartPolicy: Never
  nodeSelector: {{tessera.io/runtime: virtual}}
  containers:
  - {{name: main, image: busybox, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}
"""


def usage(kubeconfig: Path, namespace: str, group_by: str, since: datetime) -> list[Any]:
    """The namespace's usage report by day from `since`, grouped by `group_by`: its rows."""
    start = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    path = f"/apis/billing.tessera.io/v1/namespaces/{namespace}/usage"
    query = f"?granularity=day&from={start}&groupBy={group_by}"
    return list(json.loads(kubectl(kubeconfig, "get", "--raw", path + query))["items"])


def test_usage_by_workload_outlives_the_workloads(demo: Path) -> None:
    """A Deployment's, a Job's and a JobSet's pods and a bare pod run; the workloads are deleted
    with their pods; then the namespace's usage grouped by workload names each of them (the pod
    with no controller under none), and each one's usage is exactly that of its pods."""
    since = datetime.now(UTC) - timedelta(minutes=1)
    kubectl(demo, "create", "namespace", BILLS)
    kubectl(demo, "apply", "-n", BILLS, "-f", "-", stdin=WORKLOADS)
    kubectl(demo, "wait", "-n", BILLS, "--for=condition=complete", "job/batch", "--timeout=80s")

    def settled() -> list[dict[str, Any]] | None:
        pods = get(demo, "pods", "-n", BILLS)["items"]
        phases = [p["status"].get("phase") for p in pods]
        done = phases.count("Succeeded") == 5 and phases.count("Running") == 2
        return pods if done and len(pods) == 7 else None

    pods = eventually(settled, "2 web pods running; the Job's, the JobSet's and solo done")
    expected = {
        f"{BILLS}/{p['metadata']['name']}": {
            "web": "Deployment/web",
            "batch": "Job/batch",
            "train": "JobSet/train",
            "solo": None,
        }[p["metadata"]["name"].split("-")[0]]
        for p in pods
    }
    time.sleep(1.5)  # the web pods run a whole second more
    for workload in ("deployment/web", "job/batch", "jobset/train"):
        kubectl(demo, "delete", "-n", BILLS, workload, "--wait=false")
    eventually(
        lambda: (
            [p["metadata"]["name"] for p in get(demo, "pods", "-n", BILLS)["items"]] == ["solo"]
        ),
        "the workloads' pods deleted",
    )

    by_pod = usage(demo, BILLS, "pod", since)
    assert {row["pod"] for row in by_pod} == set(expected), "every pod billed"
    want: dict[str | None, dict[str, Decimal]] = {}
    for row in by_pod:
        into = want.setdefault(expected[row["pod"]], {})
        for resource, value in row["quantities"].items():
            into[resource] = into.get(resource, Decimal(0)) + Decimal(value)
    by_workload = usage(demo, BILLS, "workload", since)
    got = {
        row["workload"]: {r: Decimal(v) for r, v in row["quantities"].items()}
        for row in by_workload
    }
    assert got == want
    assert set(got) == {"Deployment/web", "Job/batch", "JobSet/train", None}
    assert got["Deployment/web"]["vcpu"] >= 2 * 2  # two pods, at least two seconds each

    # kubectl get usage NAME: the report grouped by what the name says
    table = kubectl(demo, "get", "usage", "workload", "-n", BILLS, "--no-headers")
    assert sorted(line.split()[2] for line in table.splitlines() if line.strip()) == [
        "<none>",
        "Deployment/web",
        "Job/batch",
        "JobSet/train",
    ]
    assert kubectl(demo, "get", "usage/workload", "-n", BILLS).split()[:3] == [
        "START",
        "END",
        "WORKLOAD",
    ]


def test_deleting_a_cronjob_foreground_and_orphan(demo: Path) -> None:
    # Foreground: the CronJob waits for its Job, which waits for its pod
    kubectl(demo, "apply", "-f", "-", stdin=cronjob_yaml("cjf", run="600", hold=True))
    kubectl(demo, "create", "job", "cjf-now", "--from=cronjob/cjf")
    (owner,) = get(demo, "job", "cjf-now")["metadata"]["ownerReferences"]
    assert owner["kind"] == "CronJob" and owner["name"] == "cjf"
    eventually(lambda: running(demo, "cjf-now", 1), "its Job's pod running")
    kubectl(demo, "delete", "cronjob", "cjf", "--cascade=foreground", "--wait=false")
    held = eventually(lambda: marked(pods_of(demo, "cjf-now"), 1), "the pod being deleted")
    job = get(demo, "job", "cjf-now")
    assert job["metadata"]["deletionTimestamp"]  # deleted in the foreground too
    cronjob = get(demo, "cronjob", "cjf")
    assert cronjob["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in cronjob["metadata"]["finalizers"]
    release(demo, held)
    eventually(lambda: not get(demo, "cronjobs")["items"], "the CronJob gone at last")
    assert "cjf-now" not in job_names(demo) and pods_of(demo, "cjf-now") == []

    # Orphan: the Job stays, on its own, and runs to its end
    kubectl(demo, "apply", "-f", "-", stdin=cronjob_yaml("cjo", run="3"))
    kubectl(demo, "create", "job", "cjo-now", "--from=cronjob/cjo")
    kubectl(demo, "delete", "cronjob", "cjo", "--cascade=orphan")
    assert not get(demo, "cronjobs")["items"]
    job = get(demo, "job", "cjo-now")
    assert not job["metadata"].get("ownerReferences")
    kubectl(demo, "wait", "--for=condition=complete", "job/cjo-now", "--timeout=80s")
    assert [p["status"]["phase"] for p in pods_of(demo, "cjo-now")] == ["Succeeded"]
    kubectl(demo, "delete", "job", "cjo-now")
    eventually(lambda: not pods_of(demo, "cjo-now"), "its pod deleted with it")


EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def test_the_examples_run(demo: Path) -> None:
    for example in ("job.yaml", "indexed-job.yaml", "cronjob.yaml"):
        kubectl(demo, "apply", "-f", str(EXAMPLES / example))
    kubectl(demo, "create", "job", "report-now", "--from=cronjob/report")
    out = kubectl(
        demo,
        "wait",
        "--for=condition=complete",
        "job/pi",
        "job/shards",
        "job/report-now",
        "--timeout=120s",
        timeout=150,
    )
    assert out.count("condition met") == 3
    assert get(demo, "job", "shards")["status"]["completedIndexes"] == "0-7"
    for example in ("job.yaml", "indexed-job.yaml", "cronjob.yaml"):
        kubectl(demo, "delete", "-f", str(EXAMPLES / example))
    # the Job made --from the CronJob is owned by it: it goes with it
    eventually(
        lambda: "report-now" not in kubectl(demo, "get", "jobs", "-o", "name"),
        "the CronJob's manual Job deleted with it",
    )


def test_a_cronjob_makes_jobs_on_schedule(tick: Tick) -> None:
    """The Job of the one minute the schedule names, made at that minute and no other (the
    schedule's arithmetic is tests/unit/test_cronjob_sync.py's). The module's last test: its
    CronJob was made as the module began."""
    assert tick.failed is None, tick.failed
    demo, cronjob = tick.kubeconfig, tick.cronjob
    created = datetime.fromisoformat(cronjob["metadata"]["creationTimestamp"])
    assert created < tick.minute, f"made at {created}, after the minute it names ({tick.minute})"

    def made() -> list[dict[str, Any]]:
        return [
            j
            for j in get(demo, "jobs", "-n", TICKS)["items"]
            if any(
                r["uid"] == cronjob["metadata"]["uid"]
                for r in j["metadata"].get("ownerReferences") or []
            )
        ]

    wait = (tick.minute - datetime.now(UTC)).total_seconds()
    (job,) = eventually(made, f"a Job at {tick.minute}", seconds=max(0, wait) + 75)
    scheduled = job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
    assert scheduled == tick.minute.strftime("%Y-%m-%dT%H:%M:%SZ")
    name = job["metadata"]["name"]
    assert name == f"tick-{int(tick.minute.timestamp()) // 60}"
    assert job["metadata"]["creationTimestamp"] >= scheduled  # made at its minute, not before
    kubectl(demo, "wait", "-n", TICKS, "--for=condition=complete", f"job/{name}", "--timeout=60s")
    status = eventually(
        lambda: (
            (seen := get(demo, "cronjob", "tick", "-n", TICKS)["status"]).get("lastSuccessfulTime")
            and seen
        ),
        "the CronJob saw its Job complete",
    )
    assert status["lastScheduleTime"] == scheduled
    assert "active" not in status
    described_with(
        demo,
        "cronjob/tick",
        "SuccessfulCreate",
        f"Created job {name}",
        "SawCompletedJob",
        f"Saw completed job: {name}, status: Complete",
        namespace=TICKS,
    )
    # deleting the CronJob deletes its Jobs (and they their pods)
    kubectl(demo, "delete", "cronjob", "tick", "-n", TICKS)
    eventually(lambda: not made(), "the CronJob's Jobs deleted")
    eventually(
        lambda: (
            not get(demo, "pods", "-n", TICKS, "-l", f"batch.kubernetes.io/job-name={name}")[
                "items"
            ]
        ),
        "their pods deleted",
    )
    # their usage is the CronJob's, after the CronJob, its Job and their pods are gone
    (row,) = usage(demo, TICKS, "workload", tick.minute - timedelta(minutes=1))
    assert row["workload"] == "CronJob/tick" and Decimal(row["quantities"]["vcpu"]) >= 1
