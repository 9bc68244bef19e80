"""batch/v1 Jobs and CronJobs with the real kubectl against a real `tessera serve`: the kinds
as a user meets them (`kubectl create job | cronjob`, `--from=cronjob/...`, get's columns,
`get all`, apply, the checks Kubernetes makes)."""

from __future__ import annotations

import json

import yaml

from tests.e2e.conftest import Kubectl

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  completions: 3
  parallelism: 2
  completionMode: Indexed
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "echo $JOB_COMPLETION_INDEX"]
"""


def header(output: str) -> list[str]:
    return output.splitlines()[0].split()


def rows(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in output.splitlines()[1:] if line.strip()}


def test_kubectl_create_job_and_cronjob(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    made = kubectl("create", "job", "once", "--image=busybox", "--", "sh", "-c", "exit 0")
    assert made.strip() == "job.batch/once created"
    job = json.loads(kubectl("get", "job", "once", "-o", "json"))
    uid = job["metadata"]["uid"]
    # the selector and labels Kubernetes generates
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["batch.kubernetes.io/job-name"] == "once" and labels["job-name"] == "once"
    assert labels["batch.kubernetes.io/controller-uid"] == uid == labels["controller-uid"]
    assert job["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "once"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["sh", "-c", "exit 0"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1, 1)
    assert (job["spec"]["backoffLimit"], job["spec"]["completionMode"]) == (6, "NonIndexed")

    table = kubectl("get", "jobs")
    assert header(table) == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert rows(table)["once"][1:3] == ["Running", "0/1"]
    wide = kubectl("get", "jobs", "-o", "wide")
    assert header(wide)[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert rows(wide)["once"][-1] == f"batch.kubernetes.io/controller-uid={uid}"

    made = kubectl(
        "create", "cronjob", "nightly", "--image=busybox", "--schedule=0 3 * * *", "--", "date"
    )
    assert made.strip() == "cronjob.batch/nightly created"
    table = kubectl("get", "cronjobs")
    assert header(table) == [
        "NAME",
        "SCHEDULE",
        "TIMEZONE",
        "SUSPEND",
        "ACTIVE",
        "LAST",
        "SCHEDULE",
        "AGE",
    ]
    assert rows(table)["nightly"][1:9] == ["0", "3", "*", "*", "*", "<none>", "False", "0"]
    assert rows(kubectl("get", "cj"))["nightly"]  # the short name
    cronjob = json.loads(kubectl("get", "cronjob", "nightly", "-o", "json"))
    assert cronjob["spec"]["concurrencyPolicy"] == "Allow"
    assert cronjob["spec"]["successfulJobsHistoryLimit"] == 3
    assert cronjob["spec"]["failedJobsHistoryLimit"] == 1

    # a Job from the CronJob's template, as `kubectl create job --from` makes it
    made = kubectl("create", "job", "by-hand", "--from=cronjob/nightly")
    assert made.strip() == "job.batch/by-hand created"
    manual = json.loads(kubectl("get", "job", "by-hand", "-o", "json"))
    assert manual["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    owner = manual["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "CronJob",
        "nightly",
        cronjob["metadata"]["uid"],
    )
    assert manual["spec"]["template"]["spec"]["containers"][0]["command"] == ["date"]
    assert manual["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"

    # `kubectl get all` lists both kinds
    everything = kubectl("get", "all")
    assert "job.batch/once" in everything and "cronjob.batch/nightly" in everything

    refused = kubectl.fails("create", "cronjob", "bad", "--image=busybox", "--schedule=61 * * * *")
    assert "spec.schedule" in refused and "above maximum" in refused
    assert "deleted" in kubectl("delete", "cronjob", "nightly")
    assert "deleted" in kubectl("delete", "job", "once", "by-hand")


def test_job_apply_and_what_kubernetes_refuses(tenant_kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    assert kubectl("apply", "-f", "-", stdin=JOB).strip() == "job.batch/pi created"
    assert rows(kubectl("get", "jobs"))["pi"][1:3] == ["Suspended", "0/3"]
    # applied again unchanged: unchanged (the generated fields are the server's)
    assert kubectl("apply", "-f", "-", stdin=JOB).strip() == "job.batch/pi unchanged"
    # parallelism may change; completions of a non-elastic job, and the template, may not
    assert "configured" in kubectl(
        "apply", "-f", "-", stdin=JOB.replace("parallelism: 2", "parallelism: 1")
    )
    refused = kubectl.fails(
        "apply", "-f", "-", stdin=JOB.replace("completions: 3", "completions: 4")
    )
    assert "spec.completions" in refused and "immutable" in refused
    refused = kubectl.fails("apply", "-f", "-", stdin=JOB.replace("busybox", "alpine"))
    assert "spec.template" in refused and "immutable" in refused
    as_yaml = yaml.safe_load(kubectl("get", "job", "pi", "-o", "yaml"))
    assert as_yaml["spec"]["parallelism"] == 1 and as_yaml["metadata"]["generation"] == 2

    bad = JOB.replace("name: pi", "name: bad").replace(
        "restartPolicy: Never", "restartPolicy: Always"
    )
    refused = kubectl.fails("apply", "-f", "-", stdin=bad)
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Always"' in refused
    bad = JOB.replace("name: pi", "name: bad").replace("  completions: 3\n", "")
    refused = kubectl.fails("apply", "-f", "-", stdin=bad)
    assert "spec.completions: Required value: when completion mode is Indexed" in refused
    assert "deleted" in kubectl("delete", "job", "pi")
