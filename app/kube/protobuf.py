"""Kubernetes' protobuf encoding of request bodies (`application/vnd.kubernetes.protobuf`).

kubectl's typed commands (`kubectl create namespace`, `kubectl auth can-i`, `kubectl auth
whoami`) send their object in protobuf and do not retry in JSON when refused. Such a body is the
four bytes `k8s\\0` followed by a `runtime.Unknown` message whose `raw` field holds the object.

The messages below carry the names and field numbers of the published Kubernetes `.proto`
definitions (k8s.io/api and k8s.io/apimachinery, proto2); the protobuf library builds them and does
the decoding. Only the kinds Tessera takes in protobuf are described, and of those only the fields
Tessera reads: protobuf skips the others as unknown fields. Any other kind is refused with 415,
which says to send JSON.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from app.errors import BadRequest, UnsupportedMediaType

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_PACKAGE = "tessera.kubernetes"

F = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, INT64, INT32, BOOL, MESSAGE = (
    F.TYPE_STRING,
    F.TYPE_BYTES,
    F.TYPE_INT64,
    F.TYPE_INT32,
    F.TYPE_BOOL,
    F.TYPE_MESSAGE,
)
MAP = "map"  # map<string, string>
MAP_BYTES = "map-bytes"  # map<string, bytes> (base64 in JSON)
# message -> [(field, number, type or message name, repeated)]
_MESSAGES: dict[str, list[tuple[str, int, Any, bool]]] = {
    # k8s.io/apimachinery/pkg/runtime
    "TypeMeta": [("apiVersion", 1, STRING, False), ("kind", 2, STRING, False)],
    "Unknown": [
        ("typeMeta", 1, "TypeMeta", False),
        ("raw", 2, BYTES, False),
        ("contentEncoding", 3, STRING, False),
        ("contentType", 4, STRING, False),
    ],
    # k8s.io/apimachinery/pkg/apis/meta/v1
    "Time": [("seconds", 1, INT64, False), ("nanos", 2, INT32, False)],
    "OwnerReference": [
        ("kind", 1, STRING, False),
        ("name", 3, STRING, False),
        ("uid", 4, STRING, False),
        ("apiVersion", 5, STRING, False),
        ("controller", 6, BOOL, False),
        ("blockOwnerDeletion", 7, BOOL, False),
    ],
    "ObjectMeta": [
        ("name", 1, STRING, False),
        ("generateName", 2, STRING, False),
        ("namespace", 3, STRING, False),
        ("uid", 5, STRING, False),
        ("resourceVersion", 6, STRING, False),
        ("labels", 11, MAP, False),
        ("annotations", 12, MAP, False),
        ("ownerReferences", 13, "OwnerReference", True),
        ("finalizers", 14, STRING, True),
    ],
    # k8s.io/api/core/v1
    "NamespaceSpec": [("finalizers", 1, STRING, True)],
    "Namespace": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "NamespaceSpec", False)],
    # `kubectl create configmap` and `kubectl create secret`
    "ConfigMap": [
        ("metadata", 1, "ObjectMeta", False),
        ("data", 2, MAP, False),
        ("binaryData", 3, MAP_BYTES, False),
        ("immutable", 4, BOOL, False),
    ],
    "Secret": [
        ("metadata", 1, "ObjectMeta", False),
        ("data", 2, MAP_BYTES, False),
        ("type", 3, STRING, False),
        ("stringData", 4, MAP, False),
        ("immutable", 5, BOOL, False),
    ],
    # `kubectl create service`
    "IntOrString": [
        ("type", 1, INT64, False),
        ("intVal", 2, INT32, False),
        ("strVal", 3, STRING, False),
    ],
    "ServicePort": [
        ("name", 1, STRING, False),
        ("protocol", 2, STRING, False),
        ("port", 3, INT32, False),
        ("targetPort", 4, "IntOrString", False),
        ("nodePort", 5, INT32, False),
        ("appProtocol", 6, STRING, False),
    ],
    "ServiceSpec": [
        ("ports", 1, "ServicePort", True),
        ("selector", 2, MAP, False),
        ("clusterIP", 3, STRING, False),
        ("type", 4, STRING, False),
        ("externalIPs", 5, STRING, True),
        ("sessionAffinity", 7, STRING, False),
        ("externalName", 10, STRING, False),
        ("publishNotReadyAddresses", 13, BOOL, False),
        ("ipFamilyPolicy", 17, STRING, False),
        ("clusterIPs", 18, STRING, True),
        ("ipFamilies", 19, STRING, True),
        ("internalTrafficPolicy", 22, STRING, False),
    ],
    "Service": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "ServiceSpec", False)],
    # `kubectl create deployment` (k8s.io/api/apps/v1 and the parts of core/v1 it sets)
    "LabelSelectorRequirement": [
        ("key", 1, STRING, False),
        ("operator", 2, STRING, False),
        ("values", 3, STRING, True),
    ],
    "LabelSelector": [
        ("matchLabels", 1, MAP, False),
        ("matchExpressions", 2, "LabelSelectorRequirement", True),
    ],
    "ContainerPort": [
        ("name", 1, STRING, False),
        ("hostPort", 2, INT32, False),
        ("containerPort", 3, INT32, False),
        ("protocol", 4, STRING, False),
        ("hostIP", 5, STRING, False),
    ],
    "EnvVar": [("name", 1, STRING, False), ("value", 2, STRING, False)],
    "Container": [
        ("name", 1, STRING, False),
        ("image", 2, STRING, False),
        ("command", 3, STRING, True),
        ("args", 4, STRING, True),
        ("workingDir", 5, STRING, False),
        ("ports", 6, "ContainerPort", True),
        ("env", 7, "EnvVar", True),
        ("imagePullPolicy", 14, STRING, False),
    ],
    "PodSpec": [
        ("containers", 2, "Container", True),
        ("restartPolicy", 3, STRING, False),
        ("nodeSelector", 7, MAP, False),
    ],
    "PodTemplateSpec": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "PodSpec", False)],
    "DeploymentStrategy": [("type", 1, STRING, False)],
    "DeploymentSpec": [
        ("replicas", 1, INT32, False),
        ("selector", 2, "LabelSelector", False),
        ("template", 3, "PodTemplateSpec", False),
        ("strategy", 4, "DeploymentStrategy", False),
        ("minReadySeconds", 5, INT32, False),
        ("revisionHistoryLimit", 6, INT32, False),
        ("paused", 7, BOOL, False),
        ("progressDeadlineSeconds", 9, INT32, False),
    ],
    "Deployment": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "DeploymentSpec", False)],
    # k8s.io/api/authorization/v1
    "ResourceAttributes": [
        ("namespace", 1, STRING, False),
        ("verb", 2, STRING, False),
        ("group", 3, STRING, False),
        ("version", 4, STRING, False),
        ("resource", 5, STRING, False),
        ("subresource", 6, STRING, False),
        ("name", 7, STRING, False),
    ],
    "NonResourceAttributes": [("path", 1, STRING, False), ("verb", 2, STRING, False)],
    "SelfSubjectAccessReviewSpec": [
        ("resourceAttributes", 1, "ResourceAttributes", False),
        ("nonResourceAttributes", 2, "NonResourceAttributes", False),
    ],
    "SelfSubjectAccessReview": [
        ("metadata", 1, "ObjectMeta", False),
        ("spec", 2, "SelfSubjectAccessReviewSpec", False),
    ],
    "SelfSubjectRulesReviewSpec": [("namespace", 1, STRING, False)],
    "SelfSubjectRulesReview": [
        ("metadata", 1, "ObjectMeta", False),
        ("spec", 2, "SelfSubjectRulesReviewSpec", False),
    ],
    # k8s.io/api/authentication/v1
    "SelfSubjectReview": [("metadata", 1, "ObjectMeta", False)],
}
# (apiVersion, kind) Tessera takes in protobuf -> message.
KINDS = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "Service"): "Service",
    ("apps/v1", "Deployment"): "Deployment",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview",
}


# Pointers in Kubernetes' Go types, where a zero is not the same as no value.
KEEP_ZERO = frozenset({"replicas"})


@cache
def _classes() -> dict[str, type[Message]]:
    file = descriptor_pb2.FileDescriptorProto(
        name="tessera/kubernetes.proto", package=_PACKAGE, syntax="proto2"
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            entry = message.field.add(name=field, number=number, json_name=field)
            is_map = kind in (MAP, MAP_BYTES)
            entry.label = F.LABEL_REPEATED if repeated or is_map else F.LABEL_OPTIONAL
            if is_map:
                map_entry = message.nested_type.add(name=f"{field[0].upper()}{field[1:]}Entry")
                map_entry.options.map_entry = True
                map_entry.field.add(name="key", number=1, type=STRING, label=F.LABEL_OPTIONAL)
                value_type = BYTES if kind == MAP_BYTES else STRING
                map_entry.field.add(name="value", number=2, type=value_type, label=F.LABEL_OPTIONAL)
                entry.type = MESSAGE
                entry.type_name = f".{_PACKAGE}.{name}.{map_entry.name}"
            elif isinstance(kind, str):
                entry.type = MESSAGE
                entry.type_name = f".{_PACKAGE}.{kind}"
            else:
                entry.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def supported_kinds() -> str:
    return ", ".join(f"{kind} ({version})" for version, kind in KINDS)


def decode(body: bytes) -> dict[str, Any]:
    """The object in a protobuf body, as the JSON document of the same object."""
    if not body.startswith(MAGIC):
        raise BadRequest(
            f"the request body is not Kubernetes protobuf ({MEDIA_TYPE} bodies start with the "
            "bytes k8s\\x00): send application/json instead"
        )
    classes = _classes()
    try:
        envelope = classes["Unknown"].FromString(body[len(MAGIC) :])
    except DecodeError as exc:
        raise BadRequest(f"the protobuf request body cannot be decoded: {exc}") from exc
    type_meta = envelope.typeMeta
    api_version, kind = type_meta.apiVersion, type_meta.kind
    message = KINDS.get((api_version, kind))
    if message is None:
        raise UnsupportedMediaType(
            f"Tessera reads {MEDIA_TYPE} bodies only for {supported_kinds()}; send this {kind or 'object'} "
            'as application/json (kubectl does for "kubectl apply" and "kubectl create -f")'
        )
    if envelope.contentEncoding:
        raise UnsupportedMediaType(
            f"the protobuf body is encoded as {envelope.contentEncoding!r}: send it unencoded"
        )
    try:
        obj = classes[message].FromString(envelope.raw)
    except DecodeError as exc:
        raise BadRequest(f"the protobuf {kind} cannot be decoded: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **_document(obj)}


def _repeated(field: Any) -> bool:
    if hasattr(type(field), "is_repeated"):  # protobuf 6 and later
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _document(message: Message) -> dict[str, Any]:
    """Set fields as JSON, leaving out empty values as Kubernetes' JSON does (`omitempty`)."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if value:
                out[field.name] = {
                    k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
                    for k, v in value.items()
                }
        elif _repeated(field):
            if value:
                out[field.name] = [
                    _document(v) if field.message_type is not None else v for v in value
                ]
        elif field.message_type is not None and field.message_type.name == "Time":
            if value.seconds or value.nanos:
                out[field.name] = datetime.fromtimestamp(value.seconds, UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
        elif field.message_type is not None and field.message_type.name == "IntOrString":
            out[field.name] = value.strVal if value.type == 1 else value.intVal
        elif field.message_type is not None:
            out[field.name] = _document(value)
        elif value not in ("", 0, False, b"") or field.name in KEEP_ZERO:
            out[field.name] = value
    return out
