"""Updates of a bound pod compare against the stored pod (real HTTP, SQLite and PostgreSQL)."""

from __future__ import annotations

from tests.conftest import unique
from tests.factories import gpu_node, pod

JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def bound_pod(tenant, admin, name: str, **labels: str) -> dict:
    """A whole-GPU pod (`nvidia.com/gpu: 1`, a number) bound to a fresh node."""
    node = unique("upd-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    ns = tenant.tenant
    created = tenant.post(
        f"/api/v1/namespaces/{ns}/pods",
        json=pod(name, cpu="4", memory="16Gi", gpus=1, labels=labels or None),
    )
    assert created.status_code == 201, created.text
    binding = {
        "metadata": {
            "name": name,
            "annotations": {
                "tessera.io/gpu-allocation": f'[{{"gpu": "{node}-gpu0", "memoryMiB": 81920, "corePercent": 100}}]'
            },
        },
        "target": {"kind": "Node", "name": node},
    }
    bound = admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json=binding)
    assert bound.status_code == 201, bound.text
    return tenant.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()


def test_a_bound_pod_sent_back_as_read_or_as_written_is_no_change(tenant, admin) -> None:
    ns = tenant.tenant
    current = bound_pod(tenant, admin, "same")
    url = f"/api/v1/namespaces/{ns}/pods/same"
    assert current["spec"]["nodeName"] and current["spec"]["schedulerName"] == "tessera"
    # Sent back exactly as read (nodeName, priority, defaults): nothing changes.
    again = tenant.put(url, json=current)
    assert again.status_code == 200, again.text
    assert again.json()["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    # The manifest as written (no server fields, the GPU count as a string): nothing changes.
    written = pod("same", cpu="4", memory="16Gi", gpus=1)
    written["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    as_written = tenant.put(url, json=written)
    assert as_written.status_code == 200, as_written.text
    assert (
        as_written.json()["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    )
    assert as_written.json()["spec"]["nodeName"] == current["spec"]["nodeName"]
    # The GPU allocation and the sold spec survive a replace that leaves them out.
    annotations = as_written.json()["metadata"]["annotations"]
    assert (
        annotations["tessera.io/gpu-allocation"]
        == current["metadata"]["annotations"]["tessera.io/gpu-allocation"]
    )
    assert annotations["tessera.io/pod-use-spec"] == "4-16Gi"


def test_a_real_change_names_only_the_field_that_changed(tenant, admin) -> None:
    ns = tenant.tenant
    current = bound_pod(tenant, admin, "strict")
    url = f"/api/v1/namespaces/{ns}/pods/strict"
    changed = {**current, "spec": {**current["spec"], "restartPolicy": "Never"}}
    refused = tenant.put(url, json=changed)
    assert refused.status_code == 422
    causes = refused.json()["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.restartPolicy"]
    assert causes[0]["reason"] == "FieldValueForbidden"
    more = tenant.patch(
        url,
        json=[
            {
                "op": "replace",
                "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu",
                "value": 2,
            },
            {"op": "replace", "path": "/spec/nodeName", "value": "other"},
        ],
        headers=JSON_PATCH,
    )
    assert more.status_code == 422
    fields = sorted(c["field"] for c in more.json()["details"]["causes"])
    assert fields == ["spec.containers[0].resources.limits.nvidia.com/gpu", "spec.nodeName"]
    stolen = tenant.patch(
        url,
        json={"metadata": {"annotations": {"tessera.io/pod-use-spec": "1-2Gi"}}},
        headers=MERGE_PATCH,
    )
    assert stolen.status_code == 422
    assert [c["field"] for c in stolen.json()["details"]["causes"]] == [
        "metadata.annotations.tessera.io/pod-use-spec"
    ]
    # None of it was written.
    after = tenant.get(url).json()
    assert after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]


def test_the_spec_changes_kubernetes_allows_on_a_running_pod(tenant, admin) -> None:
    """Tolerations added, activeDeadlineSeconds set then lowered, an image changed (`kubectl
    set image`): accepted, written, and the generation moves; removing a toleration, raising
    or removing the deadline, or emptying an image is refused, writing nothing."""
    ns = tenant.tenant
    current = bound_pod(tenant, admin, "mutable")
    url = f"/api/v1/namespaces/{ns}/pods/mutable"
    generation = current["metadata"]["generation"]
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    added = tenant.patch(
        url,
        json=[{"op": "add", "path": "/spec/tolerations/-", "value": toleration}],
        headers=JSON_PATCH,
    )
    assert added.status_code == 200, added.text
    assert toleration in added.json()["spec"]["tolerations"]
    assert added.json()["metadata"]["generation"] == generation + 1
    image = tenant.patch(
        url,
        json={"spec": {"containers": [{"name": "main", "image": "registry.example/app:2.0"}]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert image.status_code == 200, image.text
    assert image.json()["spec"]["containers"][0]["image"] == "registry.example/app:2.0"
    for deadline in (600, 300):
        lowered = tenant.patch(
            url, json={"spec": {"activeDeadlineSeconds": deadline}}, headers=MERGE_PATCH
        )
        assert lowered.status_code == 200, lowered.text
        assert lowered.json()["spec"]["activeDeadlineSeconds"] == deadline
    after = tenant.get(url).json()
    assert after["metadata"]["generation"] == generation + 4
    assert after["spec"]["nodeName"] == current["spec"]["nodeName"]

    def refused(body: object, headers: dict[str, str], field: str) -> None:
        answer = tenant.patch(url, json=body, headers=headers)
        assert answer.status_code == 422, answer.text
        assert field in [c["field"] for c in answer.json()["details"]["causes"]]

    refused({"spec": {"activeDeadlineSeconds": 900}}, MERGE_PATCH, "spec.activeDeadlineSeconds")
    refused({"spec": {"activeDeadlineSeconds": None}}, MERGE_PATCH, "spec.activeDeadlineSeconds")
    tolerations = after["spec"]["tolerations"]
    refused(
        {"spec": {"tolerations": [t for t in tolerations if t != toleration]}},
        MERGE_PATCH,
        f"spec.tolerations[{tolerations.index(toleration)}]",
    )
    refused(
        [{"op": "replace", "path": "/spec/containers/0/image", "value": ""}],
        JSON_PATCH,
        "spec.containers[0].image",
    )
    assert (
        tenant.get(url).json()["metadata"]["resourceVersion"]
        == (after["metadata"]["resourceVersion"])
    )


def test_labels_are_what_the_user_wrote(tenant, admin) -> None:
    ns = tenant.tenant
    plain = tenant.post(f"/api/v1/namespaces/{ns}/pods", json=pod("plain")).json()
    assert "labels" not in plain["metadata"]
    assert plain["metadata"]["annotations"]["tessera.io/compute-class"] == "general-purpose"
    replaced = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/plain",
        json=[{"op": "add", "path": "/metadata/labels", "value": {"app": "a"}}],
        headers=JSON_PATCH,
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["metadata"]["labels"] == {"app": "a"}
    # Setting the class label to the class the pod has is no change of class ...
    same = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/plain",
        json={"metadata": {"labels": {"tessera.io/compute-class": "general-purpose"}}},
        headers=MERGE_PATCH,
    )
    assert same.status_code == 200, same.text
    # ... another class is refused: it decided placement and price.
    other = tenant.patch(
        f"/api/v1/namespaces/{ns}/pods/plain",
        json={"metadata": {"labels": {"tessera.io/compute-class": "performance"}}},
        headers=MERGE_PATCH,
    )
    assert other.status_code == 422
    # A class the user sets is honoured, and kept in the labels.
    chosen = tenant.post(
        f"/api/v1/namespaces/{ns}/pods",
        json=pod("fast", labels={"tessera.io/compute-class": "performance"}),
    ).json()
    assert chosen["metadata"]["labels"] == {"tessera.io/compute-class": "performance"}
    assert chosen["metadata"]["annotations"]["tessera.io/compute-class"] == "performance"


def test_finalizers_of_a_deleted_bound_pod(tenant, admin) -> None:
    ns = tenant.tenant
    current = bound_pod(tenant, admin, "held")
    url = f"/api/v1/namespaces/{ns}/pods/held"
    added = tenant.patch(
        url, json={"metadata": {"finalizers": ["example.com/hold"]}}, headers=MERGE_PATCH
    )
    assert added.status_code == 200, added.text
    node = current["spec"]["nodeName"]
    deleting = tenant.delete(url, params={"gracePeriodSeconds": 0})
    assert deleting.status_code == 200
    assert deleting.json()["metadata"]["deletionGracePeriodSeconds"] == 0
    assert "has finalizers example.com/hold" in deleting.headers["Warning"]
    assert tenant.get(url).status_code == 200  # held by the finalizer, with its GPU
    gpu = tenant.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu0").json()
    assert [p["name"] for p in gpu["status"]["pods"]] == ["held"]
    refused = tenant.patch(
        url,
        json={"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}},
        headers=MERGE_PATCH,
    )
    assert refused.status_code == 422
    assert refused.json()["details"]["causes"][0]["field"] == "metadata.finalizers"
    removed = tenant.patch(url, json={"metadata": {"finalizers": None}}, headers=MERGE_PATCH)
    assert removed.status_code == 200, removed.text
    assert tenant.get(url).status_code == 404
    gpu = tenant.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu0").json()
    assert gpu["status"]["pods"] == [] and gpu["status"]["free"]["corePercent"] == 100


def test_a_second_delete_shortens_the_grace_period(tenant, admin) -> None:
    ns = tenant.tenant
    bound_pod(tenant, admin, "slow")
    url = f"/api/v1/namespaces/{ns}/pods/slow"
    first = tenant.delete(url, params={"gracePeriodSeconds": 600}).json()
    longer = tenant.delete(url, params={"gracePeriodSeconds": 900}).json()
    assert longer["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
    shorter = tenant.delete(url, params={"gracePeriodSeconds": 60}).json()
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 60
    assert shorter["metadata"]["deletionTimestamp"] < first["metadata"]["deletionTimestamp"]
    assert tenant.delete(url, params={"gracePeriodSeconds": 0}).status_code == 200
    assert tenant.get(url).status_code == 404
