"""The official `kubernetes` Python client against a real `tessera serve` over HTTPS."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from app.db.engine import Database
from app.watch import log as change_log
from tests.conftest import unique
from tests.e2e.conftest import Process


def pod(name: str, labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {"app": "py"}),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.example/app:1.0",
                    resources=client.V1ResourceRequirements(
                        requests={"cpu": "1", "memory": "2Gi"},
                        limits={"tessera.io/gpu-memory": "10Gi", "tessera.io/gpu-core": "10"},
                    ),
                )
            ]
        ),
    )


@pytest.fixture
def core(tessera: Process) -> Iterator[tuple[client.CoreV1Api, str]]:
    name = unique("py")
    tessera.create_tenant(name)
    api_client = config.new_client_from_config(config_file=str(tessera.kubeconfig(name)))
    yield client.CoreV1Api(api_client), name
    api_client.close()


def test_create_read_list_patch_delete(core) -> None:
    api, ns = core
    created = api.create_namespaced_pod(ns, pod("alpha", {"app": "a"}))
    assert created.metadata.annotations["tessera.io/pod-use-spec"] == "1-2Gi"
    assert created.status.phase == "Pending" and created.metadata.uid
    api.create_namespaced_pod(ns, pod("beta", {"app": "b"}))
    read = api.read_namespaced_pod("alpha", ns)
    assert read.spec.containers[0].resources.limits["tessera.io/gpu-memory"] == "10Gi"
    assert [p.metadata.name for p in api.list_namespaced_pod(ns, label_selector="app=b").items] == [
        "beta"
    ]
    page = api.list_namespaced_pod(ns, limit=1)
    assert len(page.items) == 1 and page.metadata._continue
    rest = api.list_namespaced_pod(ns, limit=1, _continue=page.metadata._continue)
    assert {page.items[0].metadata.name, rest.items[0].metadata.name} == {"alpha", "beta"}
    patched = api.patch_namespaced_pod("alpha", ns, {"metadata": {"labels": {"stage": "prod"}}})
    assert patched.metadata.labels["stage"] == "prod"
    assert int(patched.metadata.resource_version) > int(read.metadata.resource_version)
    api.delete_namespaced_pod("alpha", ns)
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("alpha", ns)
    assert missing.value.status == 404


def test_errors_carry_kubernetes_status_codes(core, tessera: Process) -> None:
    api, ns = core
    api.create_namespaced_pod(ns, pod("taken"))
    expectations = [
        (lambda: api.create_namespaced_pod(ns, pod("taken")), 409, "AlreadyExists"),
        (lambda: api.read_namespaced_pod("nope", ns), 404, "NotFound"),
        (lambda: api.list_namespaced_pod("kube-system"), 403, "Forbidden"),
        (
            lambda: api.create_namespaced_pod(
                ns,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name="x"),
                    spec=client.V1PodSpec(
                        containers=[
                            client.V1Container(
                                name="c",
                                image="i",
                                resources=client.V1ResourceRequirements(requests={"cpu": "65"}),
                            )
                        ]
                    ),
                ),
            ),
            422,
            "Invalid",
        ),
        (
            lambda: api.patch_namespaced_pod(
                "taken", ns, {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
            ),
            409,
            "Conflict",
        ),
    ]
    for call, status, reason in expectations:
        with pytest.raises(ApiException) as error:
            call()
        assert error.value.status == status
        assert json.loads(error.value.body)["reason"] == reason
    configuration = client.Configuration(host=tessera.url)
    configuration.ssl_ca_cert = str(tessera.ca)
    anonymous = client.CoreV1Api(client.ApiClient(configuration))
    with pytest.raises(ApiException) as unauthorized:
        anonymous.list_namespaced_pod(ns)
    assert unauthorized.value.status == 401


def test_watch_stream_and_resume(core) -> None:
    api, ns = core
    start = api.list_namespaced_pod(ns).metadata.resource_version
    seen: list[tuple[str, str]] = []

    def watch_pods() -> None:
        stream = watch.Watch()
        for event in stream.stream(
            api.list_namespaced_pod, ns, resource_version=start, timeout_seconds=15
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                stream.stop()

    thread = threading.Thread(target=watch_pods)
    thread.start()
    api.create_namespaced_pod(ns, pod("watched"))
    api.patch_namespaced_pod("watched", ns, {"metadata": {"labels": {"step": "2"}}})
    api.delete_namespaced_pod("watched", ns)
    thread.join(timeout=20)
    assert seen == [("ADDED", "watched"), ("MODIFIED", "watched"), ("DELETED", "watched")]

    # Resuming from the version of the MODIFIED event replays only what came after it.
    resumed = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            api.list_namespaced_pod, ns, resource_version=start, timeout_seconds=2
        )
    ]
    assert resumed == seen


def test_a_selected_watch_sees_objects_enter_and_leave_the_selection(core) -> None:
    """As in Kubernetes: a pod relabelled into a watch's selector is ADDED, relabelled out of it
    DELETED (so an informer's cache of matching pods stays right), and never seen otherwise."""
    api, ns = core
    start = api.list_namespaced_pod(ns).metadata.resource_version
    api.create_namespaced_pod(ns, pod("mover", {"app": "b"}))
    api.create_namespaced_pod(ns, pod("bystander", {"app": "b"}))
    api.patch_namespaced_pod("mover", ns, {"metadata": {"labels": {"app": "a"}}})
    api.patch_namespaced_pod("mover", ns, {"metadata": {"labels": {"step": "2"}}})
    api.patch_namespaced_pod("mover", ns, {"metadata": {"labels": {"app": "c"}}})
    api.patch_namespaced_pod("bystander", ns, {"metadata": {"labels": {"step": "2"}}})
    api.delete_namespaced_pod("mover", ns)
    events = list(
        watch.Watch().stream(
            api.list_namespaced_pod,
            ns,
            label_selector="app=a",
            resource_version=start,
            timeout_seconds=2,
        )
    )
    mine = ("app", "step")
    seen = [
        (
            e["type"],
            e["object"].metadata.name,
            {k: v for k, v in e["object"].metadata.labels.items() if k in mine},
        )
        for e in events
    ]
    assert seen == [
        ("ADDED", "mover", {"app": "a"}),
        ("MODIFIED", "mover", {"app": "a", "step": "2"}),
        ("DELETED", "mover", {"app": "a", "step": "2"}),  # its last state inside the selection
    ]
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(set(versions))  # the DELETED carries the relabelling's version


def test_bookmarks(core) -> None:
    api, ns = core
    start = api.list_namespaced_pod(ns).metadata.resource_version
    stream = watch.Watch()
    for event in stream.stream(
        api.list_namespaced_pod,
        ns,
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=10,
    ):
        if event["type"] == "BOOKMARK":
            assert int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(start)
            stream.stop()
            break
    else:
        pytest.fail("no BOOKMARK arrived")


def test_too_old_resource_version_is_410_gone(core, database_url: str) -> None:
    api, ns = core
    old = api.create_namespaced_pod(ns, pod("old")).metadata.resource_version
    api.create_namespaced_pod(ns, pod("newer"))
    db = Database(database_url)
    db.write(lambda s: change_log.compact(s, keep=0))  # every change so far is gone
    db.dispose()
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(
            api.list_namespaced_pod, ns, resource_version=old, timeout_seconds=5
        ):
            pass
    assert gone.value.status == 410


def test_exec_through_the_client_stream_of_a_pod_on_no_node_is_refused_in_words(core) -> None:
    from kubernetes.stream import stream

    api, ns = core
    api.create_namespaced_pod(ns, pod("shell"))
    with pytest.raises(ApiException) as refused:
        stream(
            api.connect_get_namespaced_pod_exec,
            "shell",
            ns,
            command=["ls"],
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
        )
    assert "Handshake status 400" in str(refused.value)
    assert "does not have a host assigned" in str(refused.value)
