"""The Job controller's decisions (app/controllers/job_sync.py): pure, so every case is a Job,
its pods and a time."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from app.controllers.job_sync import INDEX_FAILURE_COUNT, sync_job
from app.kube.meta import timestamp
from app.registry.kinds.jobs import COMPLETION_INDEX, JobStrategy

T0 = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)
Obj = dict[str, Any]


def make_job(**spec: Any) -> Obj:
    job: Obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "work",
            "namespace": "ns",
            "uid": "job-uid",
            "creationTimestamp": timestamp(T0),
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": spec.pop("restartPolicy", "Never"),
                    "containers": [{"name": "main", "image": "busybox"}],
                }
            },
            **spec,
        },
    }
    JobStrategy().prepare_create(job)  # the server's defaults and generated selector
    assert JobStrategy().validate(job) == [], JobStrategy().validate(job)
    return job


class World:
    """A Job and its pods, advanced by applying the decisions as the controller would."""

    def __init__(self, job: Obj) -> None:
        self.job = job
        self.pods: dict[str, Obj] = {}
        self.made = 0

    def sync(self, now: datetime = T0, **kw: Any) -> Any:
        d = sync_job(copy.deepcopy(self.job), list(copy.deepcopy(self.pods).values()), now, **kw)
        for name in d.delete:
            self.pods.pop(name)
        for body in d.create:
            self.made += 1
            pod = copy.deepcopy(body)
            pod["metadata"]["name"] = f"{body['metadata']['generateName']}{self.made:05d}"
            pod["metadata"]["creationTimestamp"] = timestamp(now)
            pod["status"] = {"phase": "Pending"}
            self.pods[pod["metadata"]["name"]] = pod
        self.job["status"] = d.status
        return d

    def active(self) -> list[Obj]:
        return [p for p in self.pods.values() if p["status"]["phase"] in ("Pending", "Running")]

    def finish(self, pod: Obj, code: int = 0, at: datetime = T0, **extra: Any) -> None:
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "finishedAt": timestamp(at)}},
                }
            ],
            **extra,
        }

    def conditions(self) -> dict[str, tuple[str, str]]:
        return {
            c["type"]: (c["status"], c.get("reason", ""))
            for c in self.job["status"].get("conditions") or []
        }


def test_a_job_makes_its_pod_and_completes_when_it_succeeds() -> None:
    w = World(make_job())
    d = w.sync()
    assert len(d.create) == 1
    pod = d.create[0]
    assert pod["metadata"]["generateName"] == "work-"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "work",
            "uid": "job-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    labels = pod["metadata"]["labels"]
    assert labels["batch.kubernetes.io/controller-uid"] == "job-uid"
    assert labels["batch.kubernetes.io/job-name"] == "work"
    assert w.job["status"]["active"] == 1 and w.job["status"]["startTime"] == timestamp(T0)
    assert "conditions" not in w.job["status"]

    # the same state again: nothing new (pods in flight are not made twice)
    assert w.sync().create == []
    w.finish(w.active()[0])
    d = w.sync(T0 + timedelta(seconds=5))
    assert d.create == [] and d.delete == []
    assert w.conditions() == {
        "SuccessCriteriaMet": ("True", "CompletionsReached"),
        "Complete": ("True", "CompletionsReached"),
    }
    status = w.job["status"]
    assert status["succeeded"] == 1 and "active" not in status and status["ready"] == 0
    assert status["completionTime"] == timestamp(T0 + timedelta(seconds=5))
    assert len(w.pods) == 1  # the finished pod is kept
    # finished: nothing more, and no TTL means the Job stays
    d = w.sync(T0 + timedelta(days=3))
    assert d.create == [] and d.delete == [] and not d.delete_job and d.requeue_after is None


def test_completions_and_parallelism() -> None:
    w = World(make_job(completions=5, parallelism=2))
    assert len(w.sync().create) == 2
    for pod in w.active():
        w.finish(pod)
    assert len(w.sync().create) == 2
    assert w.job["status"]["succeeded"] == 2
    for pod in w.active():
        w.finish(pod)
    assert len(w.sync().create) == 1  # only one left to do
    assert w.job["status"]["succeeded"] == 4 and w.job["status"]["active"] == 1
    w.finish(w.active()[0])
    w.sync()
    assert w.conditions()["Complete"][0] == "True"
    assert w.job["status"]["succeeded"] == 5


def test_parallelism_down_deletes_the_newest_pending_pods_first() -> None:
    w = World(make_job(completions=6, parallelism=3))
    w.sync()
    names = sorted(w.pods)
    w.pods[names[0]]["status"] = {"phase": "Running"}
    w.job["spec"]["parallelism"] = 1
    d = w.sync()
    assert sorted(d.delete) == names[1:] and w.job["status"]["active"] == 1


def test_work_queue_without_completions_ends_when_one_succeeded_and_none_runs() -> None:
    w = World(make_job(parallelism=3))
    assert w.job["spec"].get("completions") is None
    assert len(w.sync().create) == 3
    first, *rest = w.active()
    w.finish(first)
    d = w.sync()
    assert d.create == [] and d.delete == []  # the others finish their work
    assert "Complete" not in w.conditions()
    for pod in rest:
        w.finish(pod)
    w.sync()
    assert w.conditions()["Complete"] == ("True", "CompletionsReached")


def test_indexed_pods_carry_their_index() -> None:
    w = World(make_job(completions=3, parallelism=3, completionMode="Indexed"))
    d = w.sync()
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in d.create] == ["0", "1", "2"]
    for i, pod in enumerate(d.create):
        assert pod["metadata"]["labels"][COMPLETION_INDEX] == str(i)
        assert pod["metadata"]["generateName"] == f"work-{i}-"
        assert pod["spec"]["hostname"] == f"work-{i}"
        assert pod["spec"]["containers"][0]["env"][0] == {
            "name": "JOB_COMPLETION_INDEX",
            "value": str(i),
        }
    by_index = {p["metadata"]["annotations"][COMPLETION_INDEX]: p for p in w.active()}
    w.finish(by_index["0"])
    w.finish(by_index["2"])
    w.sync()
    assert w.job["status"]["completedIndexes"] == "0,2"
    # index 1 fails: only index 1 is made again (after the back-off)
    w.finish(by_index["1"], code=1, at=T0)
    d = w.sync(T0 + timedelta(seconds=1))
    assert d.create == [] and d.requeue_after == 9.0
    d = w.sync(T0 + timedelta(seconds=10))
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in d.create] == ["1"]
    w.finish(w.active()[0])
    w.sync(T0 + timedelta(seconds=20))
    assert w.job["status"]["completedIndexes"] == "0-2"
    assert w.conditions()["Complete"][0] == "True"
    assert w.job["status"]["succeeded"] == 3 and w.job["status"]["failed"] == 1


def test_a_deleted_finished_pod_is_still_counted() -> None:
    w = World(make_job(completions=2, parallelism=1, completionMode="Indexed"))
    w.sync()
    w.finish(w.active()[0])
    d = w.sync()
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in d.create] == ["1"]
    done = next(n for n, p in w.pods.items() if p["status"]["phase"] == "Succeeded")
    del w.pods[done]  # deleted by hand
    d = w.sync()
    assert d.create == [] and w.job["status"]["completedIndexes"] == "0"
    assert w.job["status"]["succeeded"] == 1


def test_backoff_limit_fails_the_job_and_replacements_back_off() -> None:
    w = World(make_job(backoffLimit=2))
    w.sync()
    at = T0
    for attempt in range(3):
        w.finish(w.active()[0], code=1, at=at)
        delay = 10 * 2**attempt
        d = w.sync(at + timedelta(seconds=1))
        if attempt < 2:
            assert d.create == [] and d.requeue_after == delay - 1
            at = at + timedelta(seconds=delay)
            assert len(w.sync(at).create) == 1
    assert w.conditions() == {
        "FailureTarget": ("True", "BackoffLimitExceeded"),
        "Failed": ("True", "BackoffLimitExceeded"),
    }
    assert w.job["status"]["failed"] == 3 and "completionTime" not in w.job["status"]
    assert len(w.pods) == 3  # failed pods are kept


def test_backoff_limit_zero_fails_at_the_first_failure() -> None:
    w = World(make_job(backoffLimit=0))
    w.sync()
    w.finish(w.active()[0], code=3)
    w.sync()
    assert w.conditions()["Failed"] == ("True", "BackoffLimitExceeded")


def test_on_failure_restarts_count_towards_the_backoff_limit() -> None:
    w = World(make_job(backoffLimit=1, restartPolicy="OnFailure"))
    w.sync()
    pod = w.active()[0]
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "main", "restartCount": 2}]}
    d = w.sync()
    assert w.conditions()["FailureTarget"] == ("True", "BackoffLimitExceeded")
    assert d.delete == [pod["metadata"]["name"]]
    assert "Failed" not in w.conditions()  # not until the pod is gone
    w.sync()
    assert w.conditions()["Failed"] == ("True", "BackoffLimitExceeded")


def test_pod_failure_policy() -> None:
    policy = {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [42]}},
        ]
    }
    w = World(make_job(backoffLimit=5, podFailurePolicy=policy))
    w.sync()
    # a disrupted pod is ignored: not counted, replaced at once
    w.finish(
        w.active()[0],
        code=137,
        conditions=[{"type": "DisruptionTarget", "status": "True"}],
    )
    d = w.sync()
    assert len(d.create) == 1 and "failed" not in w.job["status"]
    # exit code 1: counted
    w.finish(w.active()[0], code=1)
    w.sync(T0 + timedelta(seconds=30))
    assert w.job["status"]["failed"] == 1 and not w.conditions()
    # exit code 42: the Job fails at once
    w.finish(w.active()[0], code=42)
    w.sync(T0 + timedelta(seconds=60))
    assert w.conditions()["Failed"] == ("True", "PodFailurePolicy")
    failed = next(c for c in w.job["status"]["conditions"] if c["type"] == "Failed")
    assert "failed with exit code 42 matching FailJob rule at index 1" in failed["message"]


def test_backoff_limit_per_index_and_max_failed_indexes() -> None:
    w = World(
        make_job(
            completions=4,
            parallelism=4,
            completionMode="Indexed",
            backoffLimitPerIndex=1,
            maxFailedIndexes=1,
        )
    )
    assert w.job["spec"]["backoffLimit"] == 2**31 - 1
    w.sync()
    by_index = {p["metadata"]["annotations"][COMPLETION_INDEX]: p for p in w.active()}
    assert by_index["0"]["metadata"]["annotations"][INDEX_FAILURE_COUNT] == "0"
    w.finish(by_index["0"], code=1)
    w.finish(by_index["1"])
    d = w.sync(T0 + timedelta(minutes=1))
    again = [p for p in d.create]
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in again] == ["0"]
    assert again[0]["metadata"]["annotations"][INDEX_FAILURE_COUNT] == "1"
    assert w.job["status"]["failedIndexes"] == ""
    # index 0 fails again: over its limit of 1, index 0 is failed, not made again
    retry = next(p for p in w.active() if p["metadata"]["annotations"][COMPLETION_INDEX] == "0")
    w.finish(retry, code=1)
    d = w.sync(T0 + timedelta(minutes=2))
    assert d.create == [] and w.job["status"]["failedIndexes"] == "0"
    assert "FailureTarget" not in w.conditions()
    # a second failed index passes maxFailedIndexes
    for index in ("2", "3"):
        w.finish(by_index[index], code=1)
    w.sync(T0 + timedelta(minutes=3))
    for pod in w.active():
        w.finish(pod, code=1)
    w.sync(T0 + timedelta(minutes=4))
    assert w.conditions()["FailureTarget"] == ("True", "MaxFailedIndexesExceeded")


def test_failed_indexes_fail_the_job_when_every_index_is_done() -> None:
    w = World(
        make_job(completions=2, parallelism=2, completionMode="Indexed", backoffLimitPerIndex=0)
    )
    w.sync()
    a, b = sorted(w.active(), key=lambda p: p["metadata"]["annotations"][COMPLETION_INDEX])
    w.finish(a, code=1)
    w.finish(b)
    w.sync()
    assert w.job["status"]["failedIndexes"] == "0"
    assert w.job["status"]["completedIndexes"] == "1"
    assert w.conditions()["Failed"] == ("True", "FailedIndexes")


def test_success_policy_ends_an_indexed_job_early() -> None:
    w = World(
        make_job(
            completions=4,
            parallelism=4,
            completionMode="Indexed",
            successPolicy={"rules": [{"succeededIndexes": "0"}]},
        )
    )
    w.sync()
    leader = next(p for p in w.active() if p["metadata"]["annotations"][COMPLETION_INDEX] == "0")
    w.finish(leader)
    d = w.sync()
    assert len(d.delete) == 3  # the others are stopped
    assert w.conditions() == {"SuccessCriteriaMet": ("True", "SuccessPolicy")}
    w.sync()
    assert w.conditions()["Complete"] == ("True", "SuccessPolicy")


def test_active_deadline() -> None:
    w = World(make_job(activeDeadlineSeconds=30))
    d = w.sync()
    assert d.requeue_after == 30
    d = w.sync(T0 + timedelta(seconds=30))
    assert len(d.delete) == 1
    assert w.conditions()["FailureTarget"] == ("True", "DeadlineExceeded")
    w.sync(T0 + timedelta(seconds=31))
    assert w.conditions()["Failed"] == ("True", "DeadlineExceeded")


def test_suspend_and_resume() -> None:
    w = World(make_job(completions=2, parallelism=2, suspend=True))
    d = w.sync()
    assert d.create == [] and w.conditions() == {"Suspended": ("True", "JobSuspended")}
    assert "startTime" not in w.job["status"]
    w.job["spec"]["suspend"] = False
    later = T0 + timedelta(minutes=5)
    d = w.sync(later)
    assert len(d.create) == 2
    assert w.conditions() == {"Suspended": ("False", "JobResumed")}
    assert w.job["status"]["startTime"] == timestamp(later)
    w.job["spec"]["suspend"] = True
    d = w.sync(later)
    assert len(d.delete) == 2 and w.conditions()["Suspended"] == ("True", "JobSuspended")
    assert "failed" not in w.job["status"]  # pods deleted for suspension are not failures


def test_ttl_after_finished_deletes_the_job() -> None:
    w = World(make_job(ttlSecondsAfterFinished=60))
    w.sync()
    w.finish(w.active()[0])
    w.sync()
    d = w.sync(T0 + timedelta(seconds=20))
    assert not d.delete_job and d.requeue_after == 40
    assert w.sync(T0 + timedelta(seconds=60)).delete_job


def test_a_job_being_deleted_is_left_alone() -> None:
    w = World(make_job())
    w.job["metadata"]["deletionTimestamp"] = timestamp(T0)
    d = w.sync()
    assert d.create == [] and d.delete == []
