"""Every way kubectl changes a pod, on a Pending, a Running and a Succeeded pod.

Updates are compared with the stored pod: what the server filled in (nodeName, priority, the
defaults) is no change when a client sends it back or leaves it out, and a real change to a
field a pod cannot change is refused naming that field alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Kubectl, Process
from tests.e2e.lifecycle import PHASES, bring_to, manifest


def read(kubectl: Kubectl, name: str) -> dict:
    return json.loads(kubectl("get", "pod", name, "-o", "json"))


@pytest.mark.parametrize("phase", PHASES)
def test_kubectl_changes_a_pod_in_every_phase(
    phase: str,
    tenant_kubectl,
    admin_kubectl: Kubectl,
    tessera: Process,
    database_url: str,
    tmp_path: Path,
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    original = manifest("web", "v1")
    assert kubectl("apply", "-f", "-", stdin=original).strip() == "pod/web created"
    before = bring_to(
        phase,
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name="web",
    )
    assert ("nodeName" in before["spec"]) == (phase != "Pending")

    # Client-side apply: the same manifest again changes nothing, a new label is configured.
    assert kubectl("apply", "-f", "-", stdin=original).strip() == "pod/web unchanged"
    assert (
        read(kubectl, "web")["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    )
    # Quantities written as numbers are the same quantities: kubectl sends them, nothing changes.
    numbers = original.replace('"1"', "1").replace('"10"', "10")
    kubectl("apply", "-f", "-", stdin=numbers)
    assert read(kubectl, "web")["spec"] == before["spec"]
    assert kubectl("apply", "-f", "-", stdin=manifest("web", "v2")).strip() == "pod/web configured"
    assert read(kubectl, "web")["metadata"]["labels"]["app"] == "v2"

    # diff: nothing against the applied manifest (exit 0), the label against a changed one.
    assert kubectl.run("diff", "-f", "-", stdin=manifest("web", "v2")).returncode == 0
    changed = kubectl.run("diff", "-f", "-", stdin=manifest("web", "v3"), check=False)
    assert changed.returncode == 1, changed.stderr
    assert "+    app: v3" in changed.stdout and "-    app: v2" in changed.stdout
    assert read(kubectl, "web")["metadata"]["labels"]["app"] == "v2"  # diff is a dry run

    # Server-side apply, twice.
    for _ in range(2):
        out = kubectl("apply", "--server-side", "-f", "-", stdin=manifest("web", "v3"))
        assert out.strip() == "pod/web serverside-applied"
    assert read(kubectl, "web")["metadata"]["labels"]["app"] == "v3"

    assert kubectl("label", "pod", "web", "team=a").strip() == "pod/web labeled"
    assert kubectl("label", "pod", "web", "team=b", "--overwrite").strip() == "pod/web labeled"
    assert kubectl("annotate", "pod", "web", "note=hi").strip() == "pod/web annotated"
    merge = kubectl(
        "patch", "pod", "web", "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}'
    )
    assert merge.strip() == "pod/web patched"
    strategic = kubectl("patch", "pod", "web", "-p", '{"metadata":{"annotations":{"s":"1"}}}')
    assert strategic.strip() == "pod/web patched"
    kubectl(
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        '[{"op": "add", "path": "/metadata/labels/j", "value": "1"}]',
    )
    deadline = kubectl(
        "patch", "pod", "web", "--type=merge", "-p", '{"spec":{"activeDeadlineSeconds":3600}}'
    )
    assert deadline.strip() == "pod/web patched"

    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/team: b/team: edited/' \"$1\"\n")
    editor.chmod(0o755)
    edited = kubectl.run("edit", "pod", "web", env={"KUBE_EDITOR": str(editor)})
    assert edited.stdout.strip() == "pod/web edited", edited.stderr

    pod = read(kubectl, "web")
    labels = pod["metadata"]["labels"]
    assert labels == {"app": "v3", "team": "edited", "m": "1", "j": "1"}
    assert pod["metadata"]["annotations"]["note"] == "hi"
    assert pod["metadata"]["annotations"]["s"] == "1"
    assert pod["spec"]["activeDeadlineSeconds"] == 3600
    # What the server owns is as it was: the binding, the sold spec, the phase.
    assert pod["spec"].get("nodeName") == before["spec"].get("nodeName")
    assert pod["status"]["phase"] == phase
    for key in ("tessera.io/pod-use-spec", "tessera.io/gpu-allocation"):
        assert pod["metadata"]["annotations"].get(key) == before["metadata"]["annotations"].get(key)

    # replace with the original manifest: it names none of the server's fields, changes nothing
    # but the metadata it carries. A deadline once set is never removed (Kubernetes' rule), so
    # the manifest must carry it.
    removed = kubectl.fails("replace", "-f", "-", stdin=original)
    assert "spec.activeDeadlineSeconds: Invalid value" in removed
    original = original.replace("spec:\n", "spec:\n  activeDeadlineSeconds: 3600\n", 1)
    replaced = kubectl("replace", "-f", "-", stdin=original)
    assert replaced.strip() == "pod/web replaced"
    pod = read(kubectl, "web")
    assert pod["metadata"]["labels"] == {"app": "v1"}
    assert pod["spec"].get("nodeName") == before["spec"].get("nodeName")
    # ... and replace with what was read back, server fields and all, works too.
    assert kubectl("replace", "-f", "-", stdin=json.dumps(pod)).strip() == "pod/web replaced"

    # An image may change (kubectl set image); a real change to the rest of the spec is refused
    # naming that field and no other.
    assert kubectl("set", "image", "pod/web", "main=registry.example/app:2.0").strip() == (
        "pod/web image updated"
    )
    assert read(kubectl, "web")["spec"]["containers"][0]["image"] == "registry.example/app:2.0"
    refused = kubectl.fails(
        "patch",
        "pod",
        "web",
        "-p",
        '{"spec":{"containers":[{"name":"main","command":["sleep","1"]}]}}',
    )
    assert "spec.containers[0].command: Forbidden" in refused
    assert "nodeName" not in refused and "schedulerName" not in refused
    refused = kubectl.fails(
        "replace", "-f", "-", stdin=original.replace("name: main", "name: other")
    )
    assert "spec.containers[0].name: Forbidden" in refused and "nodeName" not in refused
    moved = kubectl.fails(
        "patch", "pod", "web", "--type=merge", "-p", '{"spec":{"nodeName":"elsewhere"}}'
    )
    assert "spec.nodeName: Forbidden: Tessera chooses where a pod runs" in moved

    kubectl("delete", "pod", "web", "--grace-period=1")
    assert "NotFound" in kubectl.fails("get", "pod", "web")


def test_a_finalizer_holds_a_deleted_running_pod_until_its_owner_removes_it(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl(
        "create", "-f", "-", stdin=manifest("held", extra_meta="finalizers: [example.com/hold]")
    )
    pod = bring_to(
        "Running",
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name="held",
    )
    gpu = json.loads(pod["metadata"]["annotations"]["tessera.io/gpu-allocation"])[0]["gpu"]

    def holders() -> list[str]:
        device = json.loads(admin_kubectl("get", "gpu", gpu, "-o", "json"))
        return [h["name"] for h in device["status"].get("pods") or []]

    assert "held" in holders()
    kubectl("delete", "pod", "held", "--grace-period=1", "--wait=false")
    time.sleep(2)  # past the grace period: the node has stopped it, the finalizer holds it
    deleting = read(kubectl, "held")
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["finalizers"] == ["example.com/hold"]
    # No new finalizer on a pod being deleted.
    added = kubectl.fails(
        "patch",
        "pod",
        "held",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["a/b","example.com/hold"]}}',
    )
    assert "metadata.finalizers: Forbidden: no new finalizers" in added
    kubectl("label", "pod", "held", "still=here")  # other updates still work
    kubectl(
        "patch",
        "pod",
        "held",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )
    kubectl("wait", "--for=delete", "pod/held", "--timeout=30s")
    assert "held" not in holders()  # its GPU slice is free again


def test_force_delete_of_a_pod_with_finalizers_says_it_waits_for_them(
    tenant_kubectl, admin_kubectl: Kubectl, tessera: Process, database_url: str
) -> None:
    kubectl: Kubectl = tenant_kubectl()
    kubectl(
        "create", "-f", "-", stdin=manifest("forced", extra_meta="finalizers: [example.com/hold]")
    )
    bring_to(
        "Running",
        kubectl=kubectl,
        admin=admin_kubectl,
        tessera=tessera,
        database_url=database_url,
        name="forced",
    )
    # As against Kubernetes, kubectl would wait for the finalizer to go: do not wait.
    done = admin_kubectl.run(
        "delete",
        "pod",
        "forced",
        "-n",
        str(kubectl.namespace),
        "--grace-period=0",
        "--force",
        "--wait=false",
    )
    assert "has finalizers example.com/hold: it is marked for deletion" in done.stderr
    pod = read(kubectl, "forced")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 0
    kubectl("patch", "pod", "forced", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    # The grace period is over: the pod goes as soon as its last finalizer does.
    assert "NotFound" in kubectl.fails("get", "pod", "forced")
