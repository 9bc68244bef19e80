"""Deployments and ReplicaSets end to end: real `tessera serve`, scheduler, node loop and
controller manager processes, the real kubectl, on both databases (tests/e2e/workloads.py).

A Deployment's whole life through kubectl; the controller manager SIGKILLed mid-rollout and
another started (no pod lost or doubled: every pod the API ever created is counted); two
managers, of which only the Lease's holder ever acts."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest

from tests.conftest import BACKENDS, migrated_database, unique
from tests.e2e.conftest import Kubectl
from tests.e2e.workloads import Stack, start_stack, wait_for
from tests.events import assert_each_named_once, named

APPS = "/apis/apps/v1"

MANIFEST = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: NAME
spec:
  replicas: REPLICAS
  minReadySeconds: MIN_READY
  selector:
    matchLabels: {app: NAME}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: NAME}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: app
          image: busybox:1
          command: ["sleep", "3600"]
"""


def manifest(name: str, replicas: int, min_ready: int = 0) -> str:
    return (
        MANIFEST.replace("NAME", name)
        .replace("REPLICAS", str(replicas))
        .replace("MIN_READY", str(min_ready))
    )


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with migrated_database(request.param, tmp_path_factory) as url:
        running = start_stack(tmp_path_factory.mktemp("workloads"), url, unique("zone-"))
        running.start_manager("first")
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture
def tenant(stack: Stack, kubectl_binary: str) -> tuple[Kubectl, httpx.Client]:
    name = unique("wl")
    stack.server.create_tenant(name)
    return Kubectl(stack.server.kubeconfig(name), name), stack.server.admin()


def pods_of(admin: httpx.Client, ns: str, app: str) -> list[dict[str, Any]]:
    found = admin.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"app={app}"})
    assert found.status_code == 200, found.text
    return list(found.json()["items"])


def active(admin: httpx.Client, ns: str, app: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods_of(admin, ns, app)
        if not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


def sets_of(admin: httpx.Client, ns: str, app: str) -> dict[str, dict[str, Any]]:
    found = admin.get(f"{APPS}/namespaces/{ns}/replicasets", params={"labelSelector": f"app={app}"})
    return {rs["metadata"]["name"]: rs for rs in found.json()["items"]}


def deployment(admin: httpx.Client, ns: str, name: str) -> dict[str, Any]:
    return dict(admin.get(f"{APPS}/namespaces/{ns}/deployments/{name}").json())


def images(pods: list[dict[str, Any]]) -> set[str]:
    return {c["image"] for p in pods for c in p["spec"]["containers"]}


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


class PodLog:
    """Every pod event of one app from now on (a watch in a thread): which pods were ever
    created, and the most that were active at once."""

    def __init__(self, admin: httpx.Client, ns: str, app: str) -> None:
        listed = admin.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"app={app}"})
        self.created: dict[str, str] = {}  # pod -> its ReplicaSet
        self.live: set[str] = {
            p["metadata"]["name"]
            for p in listed.json()["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        self.most = len(self.live)
        self.stop = threading.Event()
        self.admin, self.ns, self.app = admin, ns, app
        self.version = listed.json()["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():  # a watch the server ends is taken up where it ended
            params = {
                "labelSelector": f"app={self.app}",
                "watch": "true",
                "resourceVersion": self.version,
                "timeoutSeconds": "300",
            }
            path = f"/api/v1/namespaces/{self.ns}/pods"
            with self.admin.stream("GET", path, params=params) as response:
                for line in response.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.strip():
                        self._see(json.loads(line))

    def _see(self, event: dict[str, Any]) -> None:
        pod = event["object"]
        self.version = pod["metadata"].get("resourceVersion", self.version)
        if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name = pod["metadata"]["name"]
        if event["type"] == "ADDED":
            self.created[name] = pod["metadata"]["ownerReferences"][0]["name"]
        if event["type"] == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            self.live.discard(name)
        else:
            self.live.add(name)
        self.most = max(self.most, len(self.live))

    def close(self) -> None:
        self.stop.set()


def test_a_deployments_whole_life(stack: Stack, tenant) -> None:
    kubectl, admin = tenant
    ns = kubectl.namespace
    assert kubectl("apply", "-f", "-", stdin=manifest("web", 3)).strip() == (
        "deployment.apps/web created"
    )
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")
    pods = wait_for(
        "3 running pods", lambda: len(active(admin, ns, "web")) == 3 and active(admin, ns, "web")
    )
    (rs_name,) = sets_of(admin, ns, "web")
    for pod in pods:  # type: ignore[union-attr]
        owner = pod["metadata"]["ownerReferences"]
        assert owner[0]["kind"] == "ReplicaSet" and owner[0]["name"] == rs_name
        assert owner[0]["controller"] is True
        assert pod["metadata"]["name"].startswith(f"{rs_name}-")
        assert pod["metadata"]["labels"]["pod-template-hash"] == rs_name.rsplit("-", 1)[1]
        assert pod["status"]["phase"] == "Running"
    table = rows(kubectl("get", "deploy"))
    assert table[0] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert table[1][:4] == ["web", "3/3", "3", "3"]
    table = rows(kubectl("get", "rs"))
    assert table[0] == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert table[1][:4] == [rs_name, "3", "3", "3"]
    everything = kubectl("get", "all")
    assert "deployment.apps/web" in everything and f"replicaset.apps/{rs_name}" in everything
    kubectl("wait", "--for=condition=Available", "deploy/web", "--timeout=60s")
    kubectl("create", "deployment", "plain", "--image=busybox", "--replicas=2")
    kubectl("rollout", "status", "deploy/plain", "--timeout=120s")
    assert len(active(admin, ns, "plain")) == 2

    # scale up and down
    assert kubectl("scale", "deploy/web", "--replicas=5").strip() == "deployment.apps/web scaled"
    wait_for("5 pods", lambda: len(active(admin, ns, "web")) == 5)
    kubectl("scale", "deploy/web", "--replicas=2")
    wait_for("2 pods", lambda: len(active(admin, ns, "web")) == 2)
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")

    # the controllers' events, as kubectl describe shows them
    def described(what: str, *words: str) -> str | None:
        out = kubectl("describe", what)
        return out if all(w in out for w in words) else None

    wait_for(
        "the Deployment's events",
        lambda: described(
            "deploy/web",
            "ScalingReplicaSet",
            f"Scaled up replica set {rs_name} from 0 to 3",
            f"Scaled up replica set {rs_name} from 3 to 5",
            f"Scaled down replica set {rs_name} from 5 to 2",
        ),
    )
    # the ReplicaSet's: one SuccessfulCreate per slow-start step naming its pods (the first 3
    # in steps of 1 and 2, the 2 of the scale up in steps of 1), one SuccessfulDelete for the 3
    # pods the scale down deleted together
    made = {p["metadata"]["name"] for p in pods}  # type: ignore[union-attr]

    def told(reason: str, count: int) -> list[list[str]] | None:
        listed = admin.get(
            f"/api/v1/namespaces/{ns}/events",
            params={
                "fieldSelector": f"involvedObject.kind=ReplicaSet,involvedObject.name={rs_name}"
            },
        ).json()["items"]
        found = named(listed, reason)
        return found if sum(map(len, found)) >= count else None

    created = cast(
        list[list[str]],
        wait_for("the ReplicaSet's creates told", lambda: told("SuccessfulCreate", 5)),
    )
    ever = {n for one in created for n in one}
    assert_each_named_once(created, ever)  # none told twice
    assert len(ever) == 5 and made <= ever
    assert sorted(map(len, created)) == [1, 1, 1, 2]  # one event per step
    assert sorted(len(one) for one in created if set(one) & made) == [1, 2]
    (deleted,) = cast(
        list[list[str]],
        wait_for("the ReplicaSet's deletes told", lambda: told("SuccessfulDelete", 3)),
    )
    assert len(deleted) == 3 and set(deleted) <= ever
    wait_for(
        "the ReplicaSet's events described",
        lambda: described(
            f"rs/{rs_name}",
            "SuccessfulCreate",
            "SuccessfulDelete",
            "Created pods: ",
            "Deleted pods: ",
        ),
    )

    # set image: a new ReplicaSet, the old one scaled to 0
    kubectl("set", "image", "deploy/web", "app=busybox:2")
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")
    wait_for("the new image", lambda: images(active(admin, ns, "web")) == {"busybox:2"})
    sets = sets_of(admin, ns, "web")
    assert len(sets) == 2 and sets[rs_name]["spec"]["replicas"] == 0
    history = rows(kubectl("rollout", "history", "deploy/web"))
    assert [r[0] for r in history[2:]] == ["1", "2"]

    # undo: the first ReplicaSet again, as revision 3
    kubectl("rollout", "undo", "deploy/web")
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")
    wait_for("the old image", lambda: images(active(admin, ns, "web")) == {"busybox:1"})
    sets = sets_of(admin, ns, "web")
    assert len(sets) == 2 and sets[rs_name]["spec"]["replicas"] == 2
    assert sets[rs_name]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"
    assert [r[0] for r in rows(kubectl("rollout", "history", "deploy/web"))[2:]] == ["2", "3"]

    # pause: a new template is not rolled out until resumed
    kubectl("rollout", "pause", "deploy/web")
    kubectl("set", "image", "deploy/web", "app=busybox:3")

    def observed() -> dict[str, Any] | None:
        d = deployment(admin, ns, "web")
        return d if d["status"].get("observedGeneration") == d["metadata"]["generation"] else None

    paused = wait_for("the paused template observed", observed)
    progressing = {c["type"]: c for c in paused["status"]["conditions"]}["Progressing"]  # type: ignore[index]
    assert progressing["reason"] == "DeploymentPaused"
    assert len(sets_of(admin, ns, "web")) == 2
    assert images(active(admin, ns, "web")) == {"busybox:1"}
    kubectl("rollout", "resume", "deploy/web")
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")
    wait_for("the resumed image", lambda: images(active(admin, ns, "web")) == {"busybox:3"})
    assert len(sets_of(admin, ns, "web")) == 3

    # restart: a new ReplicaSet of the same image
    kubectl("rollout", "restart", "deploy/web")
    kubectl("rollout", "status", "deploy/web", "--timeout=120s")
    sets = sets_of(admin, ns, "web")
    assert len(sets) == 4
    conditions = {c["type"]: c for c in deployment(admin, ns, "web")["status"]["conditions"]}
    assert conditions["Available"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "NewReplicaSetAvailable"

    # delete: its ReplicaSets and their pods go
    kubectl("delete", "deploy", "web")
    wait_for("no ReplicaSet", lambda: not sets_of(admin, ns, "web"))
    wait_for("no pod", lambda: not pods_of(admin, ns, "web"))


def leader(stack: Stack, admin: httpx.Client) -> str:
    """The manager holding the lease, once one does (a manager just started takes it within
    a lease's time; until then there is no Lease, or no holder)."""

    def holder() -> str:
        lease = admin.get(
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-controllers"
        )
        assert lease.status_code in (200, 404), lease.text
        if lease.status_code == 404:
            return ""
        return str(lease.json()["spec"].get("holderIdentity") or "")

    return str(wait_for("a manager holding the lease", holder))


def test_the_manager_killed_mid_rollout(stack: Stack, tenant) -> None:
    kubectl, admin = tenant
    ns = kubectl.namespace
    kubectl("apply", "-f", "-", stdin=manifest("roll", 6, min_ready=1))
    kubectl("rollout", "status", "deploy/roll", "--timeout=120s")
    wait_for("6 pods", lambda: len(active(admin, ns, "roll")) == 6)
    (first,) = sets_of(admin, ns, "roll")
    log = PodLog(admin, ns, "roll")
    try:
        kubectl("set", "image", "deploy/roll", "app=busybox:2")

        def midway() -> bool:
            sets = sets_of(admin, ns, "roll")
            new = [rs for name, rs in sets.items() if name != first]
            return (
                bool(new)
                and new[0]["spec"]["replicas"] >= 2
                and sets[first]["spec"]["replicas"] > 0
            )

        wait_for("the rollout midway", midway)
        killed = leader(stack, admin)
        stack.managers[killed].send_signal(signal.SIGKILL)
        stack.managers[killed].wait(timeout=30)
        stack.start_manager("after-kill")
        wait_for("the new manager leading", lambda: leader(stack, admin) == "after-kill")
        kubectl("rollout", "status", "deploy/roll", "--timeout=180s")
        wait_for(
            "6 new pods",
            lambda: (
                images(active(admin, ns, "roll")) == {"busybox:2"}
                and len(active(admin, ns, "roll")) == 6
            ),
        )
    finally:
        log.close()
    (new,) = [name for name in sets_of(admin, ns, "roll") if name != first]
    made = [pod for pod, rs in log.created.items() if rs == new]
    assert len(made) == 6, log.created  # no pod created twice, none lost
    assert not [pod for pod, rs in log.created.items() if rs == first]
    assert log.most <= 7  # replicas + maxSurge, across the kill
    assert len(active(admin, ns, "roll")) == 6


def test_two_managers_never_both_act(stack: Stack, tenant) -> None:
    kubectl, admin = tenant
    ns = kubectl.namespace
    holder = leader(stack, admin)
    stack.start_manager("standby")
    renewals = set()

    def renewed_twice() -> bool:
        lease = admin.get(
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera-controllers"
        ).json()
        renewals.add(lease["spec"]["renewTime"])
        assert lease["spec"]["holderIdentity"] == holder
        return len(renewals) >= 3

    log = PodLog(admin, ns, "pair")
    try:
        kubectl("apply", "-f", "-", stdin=manifest("pair", 4))
        kubectl("rollout", "status", "deploy/pair", "--timeout=120s")
        wait_for("the leader renewing beside a standby", renewed_twice)
        assert "informers synced" not in stack.log("controllers-standby")
        # the leader stops (SIGTERM): it gives the lease up, the standby takes over
        stack.managers[holder].send_signal(signal.SIGTERM)
        assert stack.managers[holder].wait(timeout=30) == 0
        wait_for("the standby leading", lambda: leader(stack, admin) == "standby")
        kubectl("scale", "deploy/pair", "--replicas=5")
        wait_for("5 pods", lambda: len(active(admin, ns, "pair")) == 5)
        kubectl("rollout", "status", "deploy/pair", "--timeout=120s")
    finally:
        log.close()
    assert len(log.created) == 5, log.created  # each pod made once, by one manager
    assert "standby leads the controllers" in stack.log("controllers-standby")
    assert "gave the lease up" in stack.log(f"controllers-{holder}")
