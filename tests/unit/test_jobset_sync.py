"""The JobSet kind's defaults and checks (app/registry/kinds/jobsets.py) and the JobSet
controller's decisions (app/controllers/jobset_sync.py): pure, so every case is a JobSet, its
Jobs, their pods, its PodGroup and a time."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.controllers.jobset_sync import sync_jobset
from app.kube.meta import timestamp
from app.registry.kinds.jobsets import (
    EXCLUSIVE_TOPOLOGY,
    JOB_INDEX,
    JOBSET_NAME,
    REPLICATED_JOB_NAME,
    RESTART_ATTEMPT,
    JobSet,
    JobSetStrategy,
    topology_of,
)

T0 = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)
Obj = dict[str, Any]
STRATEGY = JobSetStrategy()


def rjob(name: str, replicas: int = 1, *, pods: int = 1, **job_spec: Any) -> Obj:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": pods,
                "completions": pods,
                **job_spec,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            }
        },
    }


def make_jobset(*rjobs: Obj, annotations: dict[str, str] | None = None, **spec: Any) -> Obj:
    obj: Obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "uid": "js-uid",
            "creationTimestamp": timestamp(T0),
            "annotations": annotations or {},
        },
        "spec": {"replicatedJobs": list(rjobs or (rjob("ps"), rjob("workers", 3))), **spec},
    }
    STRATEGY.prepare_create(obj)
    assert STRATEGY.validate(obj) == [], STRATEGY.validate(obj)
    JobSet.model_validate(obj)  # what the server stores, its defaults included, is a JobSet
    return obj


class World:
    """A JobSet, its Jobs, pods and PodGroup, advanced by applying the decisions as the
    controller would."""

    def __init__(self, jobset: Obj) -> None:
        self.jobset = jobset
        self.jobs: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        self.group: Obj | None = None
        self.service: Obj | None = None
        self.made = 0

    def sync(self, now: datetime = T0) -> Any:
        d = sync_jobset(
            copy.deepcopy(self.jobset),
            list(copy.deepcopy(self.jobs).values()),
            list(copy.deepcopy(self.pods).values()),
            copy.deepcopy(self.group),
            now,
            service=copy.deepcopy(self.service),
        )
        self.jobset["status"] = d.status
        if d.service is not None:
            assert self.service is None, "a Service made twice"
            self.service = copy.deepcopy(d.service)
        for job in d.delete:
            self.jobs.pop(job["metadata"]["name"], None)
        for pod in d.delete_pods:
            self.pods.pop(pod["metadata"]["name"], None)
        if d.pod_group is not None:
            self.group = copy.deepcopy(d.pod_group)
        for body in d.create:
            assert body["metadata"]["name"] not in self.jobs, "a Job made twice"
            self.made += 1
            job = copy.deepcopy(body)
            job["metadata"]["uid"] = f"job-{self.made}"
            job["status"] = {}
            self.jobs[job["metadata"]["name"]] = job
        for job in d.suspend:
            self.jobs[job["metadata"]["name"]]["spec"]["suspend"] = True
        for job in d.resume:
            self.jobs[job["metadata"]["name"]]["spec"]["suspend"] = False
        return d

    def finish(self, name: str, kind: str, reason: str = "BackoffLimitExceeded") -> None:
        self.jobs[name]["status"] = {
            "conditions": [
                {"type": kind, "status": "True", "reason": reason, "message": "it ended"}
            ]
        }

    def ready(self, name: str) -> None:
        self.jobs[name]["status"] = {"active": 1, "ready": 1}

    def pod_of(self, job: str) -> None:
        labels = self.jobs[job]["spec"]["template"]["metadata"]["labels"]
        self.pods[f"{job}-0-x"] = {"metadata": {"name": f"{job}-0-x", "labels": labels}}


def cond(obj: Obj, kind: str) -> Obj:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


# --- the kind ---------------------------------------------------------------------------------


def test_defaults_are_jobsets() -> None:
    js = make_jobset()
    spec = js["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["suspend"] is False
    job_spec = spec["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["completionMode"] == "Indexed"
    bare = {
        "metadata": {"name": "x", "uid": "u"},
        "spec": {
            "replicatedJobs": [
                {"name": "w", "template": {"spec": {"template": {"spec": {"containers": []}}}}}
            ]
        },
    }
    STRATEGY.prepare_create(bare)
    (w,) = bare["spec"]["replicatedJobs"]
    assert w["replicas"] == 1 and w["groupName"] == "default"
    assert w["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            lambda s: s["successPolicy"].update(targetReplicatedJobs=["nope"]),
            "spec.successPolicy.targetReplicatedJobs[0]",
            "no replicated job",
        ),
        (
            lambda s: s.update(failurePolicy={"rules": [{"name": "r", "action": "RestartJob"}]}),
            "spec.failurePolicy.rules[0].action",
            "one Job alone is never recreated",
        ),
        (
            lambda s: s["replicatedJobs"][0].update(name="Bad_Name"),
            "spec.replicatedJobs[0].name",
            "RFC 1035",
        ),
        (
            lambda s: s["replicatedJobs"].append(copy.deepcopy(s["replicatedJobs"][0])),
            "spec.replicatedJobs[2].name",
            "Duplicate",
        ),
        (
            lambda s: s["replicatedJobs"][1].update(replicas=4097),
            "spec.replicatedJobs",
            "one gang of at most 4096 pods",
        ),
        (
            lambda s: s["replicatedJobs"][0]["template"]["spec"]["template"].update(
                metadata={"labels": {"tessera.io/pod-group": "other"}}
            ),
            "spec.replicatedJobs[0].template.spec.template.metadata.labels[tessera.io/pod-group]",
            "one gang of their own",
        ),
        (
            lambda s: s["replicatedJobs"][0]["template"].update(
                metadata={"annotations": {EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"}}
            ),
            f"spec.replicatedJobs[0].template.metadata[{EXCLUSIVE_TOPOLOGY}]",
            "supported node labels",
        ),
        (
            lambda s: s["replicatedJobs"][0].update(name="a" * 60),
            "spec.replicatedJobs[0].name",
            "longer than 63 characters",
        ),
    ],
)
def test_what_a_jobset_may_not_be(change: Any, field: str, words: str) -> None:
    js = make_jobset()
    change(js["spec"])
    causes = STRATEGY.validate(js)
    assert any(c.field == field and words in c.message for c in causes), causes


def test_the_spec_is_immutable_but_suspend() -> None:
    old = make_jobset()
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    assert STRATEGY.validate_update(new, old) == []
    new["spec"]["replicatedJobs"][1]["replicas"] = 5
    assert [c.field for c in STRATEGY.validate_update(new, old)] == ["spec.replicatedJobs"]


@pytest.mark.parametrize(
    ("annotations", "rjob_annotation", "expected"),
    [
        ({}, None, (None, None)),
        ({EXCLUSIVE_TOPOLOGY: "kubernetes.io/hostname"}, None, ("node", None)),
        ({}, "tessera.io/rack", ("rack", None)),
        ({"tessera.io/topology-required": "zone"}, "tessera.io/nvlink-domain", ("nvlink", None)),
        (
            {"tessera.io/topology-required": "rack", "tessera.io/topology-preferred": "node"},
            None,
            ("rack", "node"),
        ),
        (
            {"tessera.io/topology-required": "node", "tessera.io/topology-preferred": "rack"},
            None,
            ("node", None),
        ),
    ],
)
def test_the_topology_the_gang_gets(
    annotations: dict[str, str], rjob_annotation: str | None, expected: tuple[Any, Any]
) -> None:
    workers = rjob("workers", 3)
    if rjob_annotation:
        workers["template"]["metadata"] = {"annotations": {EXCLUSIVE_TOPOLOGY: rjob_annotation}}
    js = make_jobset(rjob("ps"), workers, annotations=annotations)
    assert topology_of(js) == expected


# --- the controller's decisions ---------------------------------------------------------------


def test_one_gang_of_every_pod_and_the_jobs_jobset_makes() -> None:
    js = make_jobset(
        rjob("ps"), rjob("workers", 3, pods=2), annotations={"tessera.io/topology-required": "rack"}
    )
    world = World(js)
    d = world.sync()
    assert world.group is not None and d.create_pod_group
    assert world.group["spec"] == {"minMember": 1 + 3 * 2, "topology": {"required": "rack"}}
    assert world.group["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "name": "train",
            "uid": "js-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert sorted(world.jobs) == [
        "train-ps-0",
        "train-workers-0",
        "train-workers-1",
        "train-workers-2",
    ]
    job = world.jobs["train-workers-2"]
    labels = job["metadata"]["labels"]
    assert labels[JOBSET_NAME] == "train" and labels[REPLICATED_JOB_NAME] == "workers"
    assert labels[JOB_INDEX] == "2" and labels[RESTART_ATTEMPT] == "0"
    assert labels["jobset.sigs.k8s.io/job-global-index"] == "3"
    assert labels["jobset.sigs.k8s.io/global-replicas"] == "4"
    assert len(labels["jobset.sigs.k8s.io/job-key"]) == 40
    assert job["metadata"]["annotations"][JOB_INDEX] == "2"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "js-uid"
    pod_template = job["spec"]["template"]
    assert pod_template["metadata"]["labels"]["tessera.io/pod-group"] == "train"
    assert pod_template["metadata"]["labels"][RESTART_ATTEMPT] == "0"
    assert pod_template["spec"]["subdomain"] == "train"
    assert job["spec"]["completionMode"] == "Indexed"
    # level-triggered: the same world decides nothing more
    again = world.sync()
    assert again.create == [] and again.pod_group is None and again.delete == []
    assert [r["name"] for r in world.jobset["status"]["replicatedJobsStatus"]] == ["ps", "workers"]


def test_success_all_of_the_target_replicated_jobs_ends_the_rest() -> None:
    world = World(
        make_jobset(successPolicy={"operator": "All", "targetReplicatedJobs": ["workers"]})
    )
    world.sync()
    world.ready("train-ps-0")
    for i in range(3):
        world.finish(f"train-workers-{i}", "Complete", "CompletionsReached")
        if i < 2:
            assert "terminalState" not in world.sync().status
    d = world.sync()
    assert d.status["terminalState"] == "Completed"
    assert cond(world.jobset, "Completed")["reason"] == "AllJobsCompleted"
    assert [j["metadata"]["name"] for j in d.delete] == ["train-ps-0"]
    workers = next(r for r in d.status["replicatedJobsStatus"] if r["name"] == "workers")
    assert workers["succeeded"] == 3


def test_success_any() -> None:
    world = World(make_jobset(successPolicy={"operator": "Any"}))
    world.sync()
    world.finish("train-workers-1", "Complete", "CompletionsReached")
    assert world.sync().status["terminalState"] == "Completed"


def test_a_failed_job_without_failure_policy_fails_the_set() -> None:
    world = World(make_jobset())
    world.sync()
    world.finish("train-workers-0", "Failed")
    d = world.sync()
    assert cond(world.jobset, "Failed")["reason"] == "FailedJobs"
    assert d.status["terminalState"] == "Failed"
    assert sorted(j["metadata"]["name"] for j in d.delete) == [
        "train-ps-0",
        "train-workers-1",
        "train-workers-2",
    ]


def test_restart_recreates_every_job_once_the_last_attempt_is_gone() -> None:
    world = World(make_jobset(failurePolicy={"maxRestarts": 1}))
    world.sync()
    for name in list(world.jobs):
        world.pod_of(name)
    world.finish("train-workers-1", "Failed")
    d = world.sync()
    assert d.status["restarts"] == 1 and d.status["restartsCountTowardsMax"] == 1
    assert len(d.delete) == 4 and d.create == []
    assert d.events[0][:2] == ("Warning", "Restarting")
    # the Jobs are gone, their pods not yet: nothing is made beside them
    d = world.sync()
    assert d.create == [] and sorted(p["metadata"]["name"] for p in d.delete_pods) == sorted(
        f"{j}-0-x" for j in ("train-ps-0", "train-workers-0", "train-workers-1", "train-workers-2")
    )
    assert world.pods == {}
    d = world.sync()
    assert len(d.create) == 4
    assert {j["metadata"]["labels"][RESTART_ATTEMPT] for j in world.jobs.values()} == {"1"}
    # failing again: maxRestarts reached
    world.finish("train-ps-0", "Failed")
    world.sync()
    assert cond(world.jobset, "Failed")["reason"] == "ReachedMaxRestarts"
    assert world.jobset["status"]["restarts"] == 1


def test_failure_policy_rules() -> None:
    policy = {
        "maxRestarts": 0,
        "rules": [
            {"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            {"action": "RestartJobSetAndIgnoreMaxRestarts", "targetReplicatedJobs": ["workers"]},
        ],
    }
    world = World(make_jobset(failurePolicy=policy))
    assert world.jobset["spec"]["failurePolicy"]["rules"][0]["name"] == "failurePolicyRule0"
    world.sync()
    world.finish("train-workers-0", "Failed", "BackoffLimitExceeded")
    d = world.sync()  # the second rule: restarts past maxRestarts 0
    assert d.status["restarts"] == 1 and "restartsCountTowardsMax" not in d.status
    world.sync()
    world.finish("train-workers-0", "Failed", "PodFailurePolicy")
    world.sync()
    assert cond(world.jobset, "Failed")["reason"] == "FailJobSetFailurePolicyAction"
    # a failure no rule matches restarts, within maxRestarts (0 here: fails)
    other = World(make_jobset(failurePolicy=policy))
    other.sync()
    other.finish("train-ps-0", "Failed")
    other.sync()
    assert cond(other.jobset, "Failed")["reason"] == "ReachedMaxRestarts"


def test_in_order_startup_grows_the_gang_before_each_replicated_job() -> None:
    world = World(
        make_jobset(rjob("ps"), rjob("workers", 3), startupPolicy={"startupPolicyOrder": "InOrder"})
    )
    world.sync()
    assert sorted(world.jobs) == ["train-ps-0"]
    assert world.group is not None and world.group["spec"]["minMember"] == 1
    assert cond(world.jobset, "StartupPolicyInProgress")["status"] == "True"
    assert world.sync().create == []  # the ps not ready yet
    world.ready("train-ps-0")
    d = world.sync()
    assert d.pod_group is not None and d.pod_group["spec"]["minMember"] == 4
    assert len(d.create) == 3
    for i in range(3):
        world.ready(f"train-workers-{i}")
    world.sync()
    assert cond(world.jobset, "StartupPolicyCompleted")["reason"] == "InOrderStartupPolicyCompleted"
    assert cond(world.jobset, "StartupPolicyInProgress")["status"] == "False"


def test_suspend_and_resume() -> None:
    world = World(make_jobset(suspend=True))
    world.sync()
    assert all(j["spec"]["suspend"] for j in world.jobs.values())
    assert cond(world.jobset, "Suspended")["reason"] == "SuspendedJobs"
    world.jobset["spec"]["suspend"] = False
    d = world.sync()
    assert len(d.resume) == 4
    assert cond(world.jobset, "Suspended") | {"lastTransitionTime": None} == {
        "type": "Suspended",
        "status": "False",
        "reason": "ResumeJobs",
        "message": "jobset is resumed",
        "lastTransitionTime": None,
    }


def test_a_pod_group_of_that_name_not_its_own_stops_it() -> None:
    world = World(make_jobset())
    world.group = {"metadata": {"name": "train"}, "spec": {"minMember": 2}}
    d = world.sync()
    assert d.pod_group_conflict and d.create == []


def test_ttl_after_finished() -> None:
    world = World(make_jobset(ttlSecondsAfterFinished=30))
    world.sync()
    for name in list(world.jobs):
        world.finish(name, "Complete", "CompletionsReached")
    d = world.sync()
    assert d.requeue_after == 30 and not d.delete_jobset
    assert world.sync(T0 + timedelta(seconds=10)).requeue_after == 20
    assert world.sync(T0 + timedelta(seconds=31)).delete_jobset


def test_a_jobset_managed_by_another_controller_is_left_alone() -> None:
    world = World(make_jobset(managedBy="kueue.x-k8s.io/multikueue"))
    d = world.sync()
    assert d.create == [] and d.pod_group is None and world.jobset["status"] == {}


def test_the_headless_service_of_the_subdomain() -> None:
    world = World(make_jobset())
    d = world.sync()
    assert d.service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "labels": {JOBSET_NAME: "train"},
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "train",
                    "uid": "js-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOBSET_NAME: "train"},
            "publishNotReadyAddresses": True,
        },
    }
    assert world.sync().service is None  # there: not made again
    # its pods' hostnames and subdomain name them in it
    specs = [j["spec"]["template"]["spec"] for j in world.jobs.values()]
    assert {s["subdomain"] for s in specs} == {"train"}

    named = World(make_jobset(network={"subdomain": "net"}))
    assert named.sync().service["metadata"]["name"] == "net"  # type: ignore[index]
    off = World(make_jobset(network={"enableDNSHostnames": False}))
    assert off.sync().service is None
    # a Service of that name, whoever's, is left as it is
    taken = World(make_jobset())
    taken.service = {"metadata": {"name": "train"}, "spec": {"clusterIP": "None"}}
    assert taken.sync().service is None
