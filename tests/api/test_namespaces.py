"""Namespaces as kubectl makes and changes them (real HTTP, SQLite and PostgreSQL)."""

from __future__ import annotations

from tests.conftest import unique
from tests.factories import gpu_node, pod

MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
PROTOBUF = {"Content-Type": "application/vnd.kubernetes.protobuf"}


def protobuf_namespace(name: str) -> bytes:
    """The body `kubectl create namespace NAME` sends (kubectl 1.32, recorded byte for byte
    with a 5-character name and the name's bytes spliced in)."""
    assert len(name) < 128
    meta = bytes([0x0A, len(name)]) + name.encode() + bytes.fromhex("12001a0022002a00320038004200")
    raw = bytes([0x0A, len(meta)]) + meta + bytes.fromhex("12001a020a00")
    type_meta = bytes.fromhex("0a0f0a0276311209") + b"Namespace"
    return b"k8s\x00" + type_meta + bytes([0x12, len(raw)]) + raw + bytes.fromhex("1a002200")


def test_kubectl_protobuf_namespace_is_created(tenant) -> None:
    name = f"{tenant.tenant}-pb"
    created = tenant.post("/api/v1/namespaces", content=protobuf_namespace(name), headers=PROTOBUF)
    assert created.status_code == 201, created.text
    assert created.json()["metadata"]["name"] == name
    assert tenant.get(f"/api/v1/namespaces/{name}").json()["status"]["phase"] == "Active"


def test_unsupported_bodies_are_415_naming_what_is_read(tenant) -> None:
    pod_in_protobuf = (
        b"k8s\x00" + bytes.fromhex("0a090a0276311203") + b"Pod" + bytes.fromhex("1200")
    )
    refused = tenant.post(
        f"/api/v1/namespaces/{tenant.tenant}/pods", content=pod_in_protobuf, headers=PROTOBUF
    )
    assert refused.status_code == 415, refused.text
    assert refused.json()["reason"] == "UnsupportedMediaType"
    assert "only for Namespace (v1)" in refused.json()["message"]
    assert "send this Pod as application/json" in refused.json()["message"]
    cbor = tenant.post(
        "/api/v1/namespaces", content=b"\xa0", headers={"Content-Type": "application/cbor"}
    )
    assert cbor.status_code == 415
    assert "application/json" in cbor.json()["message"]
    assert "application/yaml" in cbor.json()["message"]
    garbage = tenant.post("/api/v1/namespaces", content=b"k8s\x00\xff\xff", headers=PROTOBUF)
    assert garbage.status_code == 400


def test_a_missing_namespace_of_ones_own_is_404_anyone_elses_403(tenant, make_tenant) -> None:
    other = make_tenant("nso")
    mine = tenant.get(f"/api/v1/namespaces/{tenant.tenant}-later")
    assert mine.status_code == 404 and mine.json()["reason"] == "NotFound"
    for name in (f"{other.tenant}-later", other.tenant, unique("nobody")):
        theirs = tenant.get(f"/api/v1/namespaces/{name}")
        assert theirs.status_code == 403, name


def test_labels_and_annotations_of_a_namespace_are_patched(tenant, make_tenant) -> None:
    name = f"{tenant.tenant}-lab"
    url = f"/api/v1/namespaces/{name}"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201
    merged = tenant.patch(url, json={"metadata": {"labels": {"team": "a"}}}, headers=MERGE)
    assert merged.status_code == 200, merged.text
    assert merged.json()["metadata"]["labels"] == {
        "kubernetes.io/metadata.name": name,
        "team": "a",
    }
    strategic = tenant.patch(
        url, json={"metadata": {"annotations": {"owner": "x"}}}, headers=STRATEGIC
    )
    assert strategic.json()["metadata"]["annotations"] == {"owner": "x"}
    rv = strategic.json()["metadata"]["resourceVersion"]
    removed = tenant.patch(
        url, json=[{"op": "remove", "path": "/metadata/labels/team"}], headers=JSON_PATCH
    )
    assert removed.json()["metadata"]["labels"] == {"kubernetes.io/metadata.name": name}
    # The label naming the namespace is the server's: removing it keeps it.
    kept = tenant.patch(url, json={"metadata": {"labels": None}}, headers=MERGE)
    assert kept.json()["metadata"]["labels"] == {"kubernetes.io/metadata.name": name}
    bad = tenant.patch(url, json={"metadata": {"labels": {"bad key!": "v"}}}, headers=MERGE)
    assert bad.status_code == 422
    stale = tenant.patch(
        url, json={"metadata": {"resourceVersion": rv, "labels": {"b": "1"}}}, headers=MERGE
    )
    assert stale.status_code == 409
    unknown = tenant.patch(
        url, params={"fieldValidation": "Strict"}, json={"spec": {"oops": 1}}, headers=MERGE
    )
    assert unknown.status_code == 400
    assert 'unknown field "spec.oops"' in unknown.json()["message"]
    after = tenant.get(url).json()
    assert after["metadata"]["labels"] == {"kubernetes.io/metadata.name": name}  # nothing written
    # PUT of what was read, with a label more.
    after["metadata"]["labels"]["env"] = "dev"
    replaced = tenant.put(url, json=after)
    assert replaced.status_code == 200 and replaced.json()["metadata"]["labels"]["env"] == "dev"
    other = make_tenant("nsp")
    assert (
        other.patch(url, json={"metadata": {"labels": {"x": "y"}}}, headers=MERGE).status_code
        == 403
    )


def test_server_side_apply_creates_then_updates_a_namespace(tenant) -> None:
    name = f"{tenant.tenant}-ssa"
    url = f"/api/v1/namespaces/{name}"
    apply = {"Content-Type": "application/apply-patch+yaml"}
    body = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels: {{a: '1'}}\n"
    created = tenant.patch(url, params={"fieldManager": "t"}, content=body, headers=apply)
    assert created.status_code == 201, created.text
    again = tenant.patch(
        url, params={"fieldManager": "t"}, content=body.replace("'1'", "'2'"), headers=apply
    )
    assert again.status_code == 200 and again.json()["metadata"]["labels"]["a"] == "2"
    elsewhere = tenant.patch(
        "/api/v1/namespaces/not-mine",
        params={"fieldManager": "t"},
        content=body.replace(name, "not-mine"),
        headers=apply,
    )
    assert elsewhere.status_code == 403


def test_deleting_a_namespace_deletes_its_pods_then_itself(tenant, admin) -> None:
    name = f"{tenant.tenant}-gone"
    url = f"/api/v1/namespaces/{name}"
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201
    node = unique("nsdel-")
    assert admin.post("/api/v1/nodes", json=gpu_node(node, gpus=1)).status_code == 201
    tenant.post(f"{url}/pods", json=pod("waiting"))
    tenant.post(f"{url}/pods", json=pod("running", gpus=1, cpu="4", memory="16Gi"))
    binding = {
        "metadata": {
            "name": "running",
            "annotations": {
                "tessera.io/gpu-allocation": f'[{{"gpu": "{node}-gpu0", "memoryMiB": 81920, "corePercent": 100}}]'
            },
        },
        "target": {"kind": "Node", "name": node},
    }
    assert admin.post(f"{url}/pods/running/binding", json=binding).status_code == 201

    deleting = tenant.delete(url)
    assert deleting.status_code == 200, deleting.text
    assert deleting.json()["status"]["phase"] == "Terminating"
    assert deleting.json()["metadata"]["deletionTimestamp"]
    # The pod never placed is gone; the running one is stopping within its grace period.
    assert tenant.get(f"{url}/pods/waiting").status_code == 404
    stopping = tenant.get(f"{url}/pods/running").json()
    assert stopping["metadata"]["deletionGracePeriodSeconds"] == 30
    assert tenant.get(url).json()["status"]["phase"] == "Terminating"
    late = tenant.post(f"{url}/pods", json=pod("late"))
    assert late.status_code == 403 and "being terminated" in late.json()["message"]
    assert tenant.delete(url).status_code == 200  # deleting again changes nothing
    # The node stops the pod (here: at once); the namespace goes with it, the GPU is free.
    assert tenant.delete(f"{url}/pods/running", params={"gracePeriodSeconds": 0}).status_code == 200
    assert tenant.get(url).status_code == 404
    gpu = tenant.get(f"/apis/tessera.io/v1/gpudevices/{node}-gpu0").json()
    assert gpu["status"]["pods"] == []
    assert tenant.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201


def test_namespace_dry_run_writes_nothing(tenant) -> None:
    name = f"{tenant.tenant}-dry"
    dry = tenant.post(
        "/api/v1/namespaces", params={"dryRun": "All"}, json={"metadata": {"name": name}}
    )
    assert dry.status_code == 201
    assert tenant.get(f"/api/v1/namespaces/{name}").status_code == 404
