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
MAP_QUANTITY = "map-quantity"  # map<string, resource.Quantity> (the quantity's text in JSON)
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
    "LabelSelectorRequirement": [
        ("key", 1, STRING, False),
        ("operator", 2, STRING, False),
        ("values", 3, STRING, True),
    ],
    "LabelSelector": [
        ("matchLabels", 1, MAP, False),
        ("matchExpressions", 2, "LabelSelectorRequirement", True),
    ],
    # k8s.io/apimachinery/pkg/api/resource
    "Quantity": [("string", 1, STRING, False)],
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
    # the pod template of `kubectl create job | cronjob` (and of the CronJob a Job is made
    # `--from`): the fields a template of those commands or of a typical manifest holds
    "LocalObjectReference": [("name", 1, STRING, False)],
    "ObjectFieldSelector": [("apiVersion", 1, STRING, False), ("fieldPath", 2, STRING, False)],
    "KeySelector": [
        ("localObjectReference", 1, "LocalObjectReference", False),
        ("key", 2, STRING, False),
        ("optional", 3, BOOL, False),
    ],
    "EnvVarSource": [
        ("fieldRef", 1, "ObjectFieldSelector", False),
        ("configMapKeyRef", 3, "KeySelector", False),
        ("secretKeyRef", 4, "KeySelector", False),
    ],
    "EnvVar": [
        ("name", 1, STRING, False),
        ("value", 2, STRING, False),
        ("valueFrom", 3, "EnvVarSource", False),
    ],
    "ContainerPort": [
        ("name", 1, STRING, False),
        ("hostPort", 2, INT32, False),
        ("containerPort", 3, INT32, False),
        ("protocol", 4, STRING, False),
        ("hostIP", 5, STRING, False),
    ],
    "ResourceRequirements": [
        ("limits", 1, MAP_QUANTITY, False),
        ("requests", 2, MAP_QUANTITY, False),
    ],
    "Container": [
        ("name", 1, STRING, False),
        ("image", 2, STRING, False),
        ("command", 3, STRING, True),
        ("args", 4, STRING, True),
        ("workingDir", 5, STRING, False),
        ("ports", 6, "ContainerPort", True),
        ("env", 7, "EnvVar", True),
        ("resources", 8, "ResourceRequirements", False),
        ("terminationMessagePath", 13, STRING, False),
        ("imagePullPolicy", 14, STRING, False),
        ("stdin", 16, BOOL, False),
        ("stdinOnce", 17, BOOL, False),
        ("tty", 18, BOOL, False),
        ("terminationMessagePolicy", 20, STRING, False),
    ],
    "PodSpec": [
        ("containers", 2, "Container", True),
        ("restartPolicy", 3, STRING, False),
        ("terminationGracePeriodSeconds", 4, INT64, False),
        ("activeDeadlineSeconds", 5, INT64, False),
        ("dnsPolicy", 6, STRING, False),
        ("nodeSelector", 7, MAP, False),
        ("serviceAccountName", 8, STRING, False),
        ("imagePullSecrets", 15, "LocalObjectReference", True),
        ("hostname", 16, STRING, False),
        ("subdomain", 17, STRING, False),
        ("schedulerName", 19, STRING, False),
        ("initContainers", 20, "Container", True),
        ("priorityClassName", 24, STRING, False),
    ],
    "PodTemplateSpec": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "PodSpec", False)],
    # k8s.io/api/batch/v1: `kubectl create job` and `kubectl create cronjob`
    "PodFailurePolicyOnExitCodesRequirement": [
        ("containerName", 1, STRING, False),
        ("operator", 2, STRING, False),
        ("values", 3, INT32, True),
    ],
    "PodFailurePolicyOnPodConditionsPattern": [
        ("type", 1, STRING, False),
        ("status", 2, STRING, False),
    ],
    "PodFailurePolicyRule": [
        ("action", 1, STRING, False),
        ("onExitCodes", 2, "PodFailurePolicyOnExitCodesRequirement", False),
        ("onPodConditions", 3, "PodFailurePolicyOnPodConditionsPattern", True),
    ],
    "PodFailurePolicy": [("rules", 1, "PodFailurePolicyRule", True)],
    "SuccessPolicyRule": [
        ("succeededIndexes", 1, STRING, False),
        ("succeededCount", 2, INT32, False),
    ],
    "SuccessPolicy": [("rules", 1, "SuccessPolicyRule", True)],
    "JobSpec": [
        ("parallelism", 1, INT32, False),
        ("completions", 2, INT32, False),
        ("activeDeadlineSeconds", 3, INT64, False),
        ("selector", 4, "LabelSelector", False),
        ("manualSelector", 5, BOOL, False),
        ("template", 6, "PodTemplateSpec", False),
        ("backoffLimit", 7, INT32, False),
        ("ttlSecondsAfterFinished", 8, INT32, False),
        ("completionMode", 9, STRING, False),
        ("suspend", 10, BOOL, False),
        ("podFailurePolicy", 11, "PodFailurePolicy", False),
        ("backoffLimitPerIndex", 12, INT32, False),
        ("maxFailedIndexes", 13, INT32, False),
        ("podReplacementPolicy", 14, STRING, False),
        ("managedBy", 15, STRING, False),
        ("successPolicy", 16, "SuccessPolicy", False),
    ],
    "Job": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "JobSpec", False)],
    "JobTemplateSpec": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "JobSpec", False)],
    "CronJobSpec": [
        ("schedule", 1, STRING, False),
        ("startingDeadlineSeconds", 2, INT64, False),
        ("concurrencyPolicy", 3, STRING, False),
        ("suspend", 4, BOOL, False),
        ("jobTemplate", 5, "JobTemplateSpec", False),
        ("successfulJobsHistoryLimit", 6, INT32, False),
        ("failedJobsHistoryLimit", 7, INT32, False),
        ("timeZone", 8, STRING, False),
    ],
    "CronJob": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "CronJobSpec", False)],
    # k8s.io/api/apps/v1: `kubectl create deployment`
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
# Integer fields that are pointers in Go: a 0 sent is a 0 meant (`backoffLimit: 0`), not unset.
ZERO_KEPT = {
    *(
        (message, field)
        for message in ("JobSpec", "CronJobSpec")
        for field, _, kind, _ in _MESSAGES[message]
        if kind in (INT32, INT64)
    ),
    ("SuccessPolicyRule", "succeededCount"),
    ("DeploymentSpec", "replicas"),
    ("DeploymentSpec", "revisionHistoryLimit"),
    ("PodSpec", "terminationGracePeriodSeconds"),
}
# (apiVersion, kind) Tessera takes in protobuf -> message.
KINDS = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("batch/v1", "Job"): "Job",
    ("batch/v1", "CronJob"): "CronJob",
    ("apps/v1", "Deployment"): "Deployment",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview",
}


@cache
def _classes() -> dict[str, type[Message]]:
    file = descriptor_pb2.FileDescriptorProto(
        name="tessera/kubernetes.proto", package=_PACKAGE, syntax="proto2"
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            entry = message.field.add(name=field, number=number, json_name=field)
            is_map = kind in (MAP, MAP_BYTES, MAP_QUANTITY)
            entry.label = F.LABEL_REPEATED if repeated or is_map else F.LABEL_OPTIONAL
            if is_map:
                map_entry = message.nested_type.add(name=f"{field[0].upper()}{field[1:]}Entry")
                map_entry.options.map_entry = True
                map_entry.field.add(name="key", number=1, type=STRING, label=F.LABEL_OPTIONAL)
                value = map_entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL)
                if kind == MAP_QUANTITY:
                    value.type, value.type_name = MESSAGE, f".{_PACKAGE}.Quantity"
                else:
                    value.type = BYTES if kind == MAP_BYTES else STRING
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


def _map_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Message):  # a resource.Quantity
        return getattr(value, "string")  # noqa: B009 - `string` is the field's name
    return value


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
                out[field.name] = {k: _map_value(v) for k, v in value.items()}
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
        elif field.message_type is not None:
            out[field.name] = _document(value)
        elif value not in ("", 0, False, b"") or (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (message.DESCRIPTOR.name, field.name) in ZERO_KEPT
        ):
            out[field.name] = value
    return out
