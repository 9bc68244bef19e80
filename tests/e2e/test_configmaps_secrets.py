"""ConfigMaps and Secrets with the real kubectl against a real `tessera serve`: the generic
registry's kinds as a user meets them (create, get in every format, apply, edit, watch,
delete)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import yaml
from kubernetes import client, config, watch

from tests.conftest import unique
from tests.e2e.conftest import Kubectl, Process

CONFIGMAP = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels: {app: web}
data:
  mode: MODE
"""


def rows(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in output.splitlines()[1:] if line.strip()}


def test_configmaps_through_kubectl(tenant_kubectl, tmp_path: Path) -> None:
    kubectl: Kubectl = tenant_kubectl()
    made = kubectl("create", "configmap", "app", "--from-literal=mode=fast", "--from-literal=n=3")
    assert made.strip() == "configmap/app created"
    table = kubectl("get", "configmaps")
    assert table.splitlines()[0].split() == ["NAME", "DATA", "AGE"]
    assert rows(table)["app"][1] == "2"
    assert rows(kubectl("get", "cm"))["app"][1] == "2"  # the short name
    as_yaml = yaml.safe_load(kubectl("get", "configmap", "app", "-o", "yaml"))
    assert as_yaml["kind"] == "ConfigMap" and as_yaml["data"] == {"mode": "fast", "n": "3"}

    # client-side apply: created, then configured
    applied = kubectl("apply", "-f", "-", stdin=CONFIGMAP.replace("MODE", "a"))
    assert applied.strip() == "configmap/settings created"
    applied = kubectl("apply", "-f", "-", stdin=CONFIGMAP.replace("MODE", "b"))
    assert applied.strip() == "configmap/settings configured"
    assert kubectl("get", "cm", "settings", "-o", "jsonpath={.data.mode}") == "b"
    unknown = CONFIGMAP.replace("MODE", "c").replace("\ndata:", "\nsurprise: 1\ndata:")
    refused = kubectl.fails("apply", "-f", "-", stdin=unknown)
    assert 'unknown field "surprise"' in refused
    # server-side apply
    ssa = kubectl("apply", "--server-side", "-f", "-", stdin=CONFIGMAP.replace("MODE", "d"))
    assert "serverside-applied" in ssa
    assert kubectl("get", "cm", "settings", "-o", "jsonpath={.data.mode}") == "d"

    # edit
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/mode: fast/mode: edited/' \"$1\"\n")
    editor.chmod(0o755)
    edited = kubectl.run("edit", "configmap", "app", env={"KUBE_EDITOR": str(editor)})
    assert edited.stdout.strip() == "configmap/app edited", edited.stderr
    assert kubectl("get", "cm", "app", "-o", "jsonpath={.data.mode}") == "edited"

    # watch: ADDED, MODIFIED, DELETED
    watcher = subprocess.Popen(
        [
            "kubectl",
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "get",
            "configmaps",
            "app",
            "-w",
            "--output-watch-events",
            "--request-timeout=20s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().split()[:2] == ["EVENT", "NAME"]
        assert watcher.stdout.readline().split()[:2] == ["ADDED", "app"]
        kubectl("label", "configmap", "app", "stage=two")
        assert watcher.stdout.readline().split()[:2] == ["MODIFIED", "app"]
        assert kubectl("delete", "configmap", "app").strip() == 'configmap "app" deleted'
        assert watcher.stdout.readline().split()[:2] == ["DELETED", "app"]
    finally:
        watcher.kill()
        watcher.wait()
    assert "NotFound" in kubectl.fails("get", "configmap", "app")
    dry = kubectl("delete", "configmap", "settings", "--dry-run=server")
    assert "server dry run" in dry
    assert "settings" in kubectl("get", "configmaps")


def test_secrets_through_kubectl(tenant_kubectl, admin_kubectl: Kubectl) -> None:
    kubectl: Kubectl = tenant_kubectl()
    other: Kubectl = tenant_kubectl()
    made = kubectl("create", "secret", "generic", "db", "--from-literal=password=hunter2")
    assert made.strip() == "secret/db created"
    registry = kubectl(
        "create",
        "secret",
        "docker-registry",
        "pull",
        "--docker-server=registry.example",
        "--docker-username=robot",
        "--docker-password=s3cret",
    )
    assert registry.strip() == "secret/pull created"
    table = rows(kubectl("get", "secrets"))
    assert table["db"][1:3] == ["Opaque", "1"]
    assert table["pull"][1:3] == ["kubernetes.io/dockerconfigjson", "1"]
    value = kubectl("get", "secret", "db", "-o", "jsonpath={.data.password}")
    assert base64.b64decode(value) == b"hunter2"
    config = json.loads(
        base64.b64decode(
            json.loads(kubectl("get", "secret", "pull", "-o", "json"))["data"][".dockerconfigjson"]
        )
    )
    assert config["auths"]["registry.example"]["username"] == "robot"
    assert "Forbidden" in other.fails("get", "secret", "db", "-n", kubectl.namespace or "")
    assert "db" not in other("get", "secrets")
    assert "db" in admin_kubectl("get", "secrets", "-A")
    assert kubectl("delete", "secret", "db").strip() == 'secret "db" deleted'
    assert "NotFound" in kubectl.fails("get", "secret", "db")


def test_the_official_client_uses_configmaps_and_secrets(tessera: Process) -> None:
    """The `kubernetes` Python client's typed calls: create, read, list, patch, replace,
    watch, delete, delete_collection."""
    name = unique("pycm")
    tessera.create_tenant(name)
    api_client = config.new_client_from_config(config_file=str(tessera.kubeconfig(name)))
    try:
        api = client.CoreV1Api(api_client)
        made = api.create_namespaced_config_map(
            name,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="conf", labels={"app": "py"}),
                data={"a": "1"},
            ),
        )
        assert made.data == {"a": "1"} and made.metadata.uid
        start = made.metadata.resource_version
        patched = api.patch_namespaced_config_map("conf", name, {"data": {"b": "2"}})
        assert patched.data == {"a": "1", "b": "2"}
        patched.data = {"c": "3"}
        replaced = api.replace_namespaced_config_map("conf", name, patched)
        assert replaced.data == {"c": "3"}
        listed = api.list_namespaced_config_map(name, label_selector="app=py")
        assert [c.metadata.name for c in listed.items] == ["conf"]

        secret = api.create_namespaced_secret(
            name,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="token"), string_data={"token": "abc"}
            ),
        )
        assert base64.b64decode(secret.data["token"]) == b"abc" and secret.type == "Opaque"
        assert api.read_namespaced_secret("token", name).data == secret.data

        api.delete_namespaced_config_map("conf", name)
        seen = [
            (event["type"], event["object"].metadata.name)
            for event in watch.Watch().stream(
                api.list_namespaced_config_map,
                name,
                resource_version=start,
                timeout_seconds=1,
            )
        ]
        assert seen == [("MODIFIED", "conf"), ("MODIFIED", "conf"), ("DELETED", "conf")]
        api.delete_collection_namespaced_secret(name)
        assert api.list_namespaced_secret(name).items == []
    finally:
        api_client.close()
