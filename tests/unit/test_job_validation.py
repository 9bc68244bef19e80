"""What the Job and CronJob strategies refuse (app/registry/kinds/jobs.py, cronjobs.py), with
Kubernetes' field paths."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.registry.kinds.cronjobs import CronJobStrategy
from app.registry.kinds.jobs import JobStrategy, intervals_text, parse_intervals

Obj = dict[str, Any]


def job(**spec: Any) -> Obj:
    obj: Obj = {
        "metadata": {"name": "j", "uid": "u1"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "b"}]}
            },
            **spec,
        },
    }
    JobStrategy().prepare_create(obj)
    return obj


def paths(obj: Obj) -> list[str]:
    return [c.field for c in JobStrategy().validate(obj)]


def test_defaults_and_generated_selector() -> None:
    obj = job()
    spec = obj["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}}
    assert obj["metadata"]["labels"]["job-name"] == "j"
    assert paths(obj) == []
    # parallelism alone: a work queue, completions stay unset
    assert job(parallelism=3)["spec"].get("completions") is None


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"parallelism": -1}, "spec.parallelism"),
        ({"completions": -1}, "spec.completions"),
        ({"backoffLimit": -1}, "spec.backoffLimit"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
        ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
        ({"completionMode": "Indexed", "completions": None, "parallelism": 2}, "spec.completions"),
        ({"completionMode": "Indexed", "completions": 100_001}, "spec.completions"),
        ({"backoffLimitPerIndex": 1}, "spec.backoffLimitPerIndex"),
        (
            {"maxFailedIndexes": 1, "completionMode": "Indexed", "completions": 2},
            "spec.maxFailedIndexes",
        ),
        (
            {"successPolicy": {"rules": [{"succeededCount": 1}]}},
            "spec.successPolicy",
        ),
        (
            {
                "completionMode": "Indexed",
                "completions": 3,
                "successPolicy": {"rules": [{"succeededIndexes": "0-5"}]},
            },
            "spec.successPolicy.rules[0].succeededIndexes",
        ),
        (
            {
                "podFailurePolicy": {
                    "rules": [
                        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}
                    ]
                }
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
        ),
        (
            {
                "podFailurePolicy": {
                    "rules": [
                        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3, 2]}}
                    ]
                }
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.values[1]",
        ),
        (
            {
                "podFailurePolicy": {
                    "rules": [
                        {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [2]}}
                    ]
                }
            },
            "spec.podFailurePolicy.rules[0].action",
        ),
        (
            {
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Count",
                            "onExitCodes": {"containerName": "x", "operator": "In", "values": [2]},
                        }
                    ]
                }
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.containerName",
        ),
        ({"selector": {"matchLabels": {"a": "b"}}}, "spec.selector"),
    ],
)
def test_refused(spec: Obj, path: str) -> None:
    obj = job(**{k: v for k, v in spec.items() if v is not None})
    if spec.get("completions", 0) is None:
        obj["spec"].pop("completions", None)
    assert path in paths(obj)


def test_restart_policy_always_is_refused_and_on_failure_conflicts_with_pod_failure_policy() -> (
    None
):
    obj = job()
    obj["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert "spec.template.spec.restartPolicy" in paths(obj)
    obj = job(
        podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": [{"type": "X"}]}]}
    )
    assert paths(obj) == []
    obj["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    assert "spec.template.spec.restartPolicy" in paths(obj)


def test_what_an_update_may_change() -> None:
    old = job(completions=3, parallelism=3, completionMode="Indexed", suspend=True)
    s = JobStrategy()

    def update_paths(change: Any) -> list[str]:
        new = copy.deepcopy(old)
        change(new["spec"])
        return [c.field for c in s.validate_update(new, old)]

    assert update_paths(lambda spec: spec.update(parallelism=1)) == []
    assert update_paths(lambda spec: spec.update(suspend=False)) == []
    # elastic Indexed: completions may change with parallelism
    assert update_paths(lambda spec: spec.update(completions=5, parallelism=5)) == []
    assert update_paths(lambda spec: spec.update(completions=5)) == ["spec.completions"]
    assert update_paths(lambda spec: spec.update(completionMode="NonIndexed")) == [
        "spec.completionMode"
    ]
    # a suspended Job that never started may change its scheduling directives, nothing else
    assert update_paths(lambda spec: spec["template"]["spec"].update(nodeSelector={"a": "b"})) == []
    image = lambda spec: spec["template"]["spec"]["containers"][0].update(image="c")  # noqa: E731
    assert update_paths(image) == ["spec.template"]


def test_intervals() -> None:
    assert intervals_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert parse_intervals("0-2,5") == [(0, 2), (5, 5)]
    for bad in ("2-1", "1,1", "a", "3,1"):
        with pytest.raises(ValueError):
            parse_intervals(bad)


def test_cronjob_checks() -> None:
    s = CronJobStrategy()

    def cj(**spec: Any) -> Obj:
        obj: Obj = {
            "metadata": {"name": spec.pop("name", "c"), "uid": "u"},
            "spec": {
                "schedule": "@daily",
                "jobTemplate": {"spec": job()["spec"] | {"selector": None}},
                **spec,
            },
        }
        obj["spec"]["jobTemplate"]["spec"].pop("selector")
        s.prepare_create(obj)
        return obj

    ok = cj()
    assert s.validate(ok) == []
    assert ok["spec"]["concurrencyPolicy"] == "Allow"
    for spec, path in (
        ({"schedule": "99 * * * *"}, "spec.schedule"),
        ({"timeZone": "Nowhere/Land"}, "spec.timeZone"),
        ({"startingDeadlineSeconds": -1}, "spec.startingDeadlineSeconds"),
        ({"successfulJobsHistoryLimit": -1}, "spec.successfulJobsHistoryLimit"),
        ({"name": "x" * 53}, "metadata.name"),
    ):
        assert path in [c.field for c in s.validate(cj(**spec))], spec
