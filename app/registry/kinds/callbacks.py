"""tessera.io/v1 Callback: an HTTP endpoint Tessera calls for events of the pods in its namespace.

The object (its spec: url, events, description) is the registry's, with every verb the store
gives. What is not the object's lives beside it under its uid, and goes with it: its signing
secret (`callback_secrets`: made on create and shown in that answer only; `rotate` makes a new
one, app/callbacks/router.py) and its deliveries (`callback_deliveries`, the outbox that
app/callbacks/delivery.py sends). Its status is computed as it is read: when the secret was made
and the newest deliveries. A namespace holds at most `MAX_PER_NAMESPACE` callbacks.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.callbacks import service as callbacks
from app.callbacks.schemas import Callback, CallbackList
from app.constants import TESSERA_GROUP, TESSERA_VERSION
from app.db.models import CallbackDelivery, CallbackSecret, StoredObject, table
from app.errors import Cause, Forbidden, ResourceRef
from app.kube.meta import now, timestamp
from app.kube.tables import Column, age
from app.registry.strategy import Obj, Strategy

objects_t = table(StoredObject)
secrets_t = table(CallbackSecret)
deliveries_t = table(CallbackDelivery)


class CallbackStrategy(Strategy):
    kind = "Callback"
    resource = "callbacks"
    singular = "callback"
    group = TESSERA_GROUP
    version = TESSERA_VERSION
    model = Callback
    list_model = CallbackList
    short_names = ("cb",)
    categories = ("tessera",)
    summary = (
        "an endpoint for the namespace's pod events; the answer's status.signingSecret is "
        "shown this once"
    )
    own_subresources = (
        ("rotate", "Callback", ("create",)),
        ("deliveries", "CallbackDeliveryList", ("get",)),
    )
    columns: ClassVar[list[Column]] = [
        ("Name", "string", "Name of the callback.", 0),
        ("URL", "string", "Where events are sent (spec.url).", 0),
        ("Events", "string", "The event types it receives.", 0),
        ("Last Delivery", "string", "The newest delivery's phase (and attempts).", 0),
        ("Age", "string", "Time since creation.", 0),
        ("Description", "string", "spec.description.", 1),
    ]

    def row(self, obj: Obj) -> list[Any]:
        spec = obj.get("spec") or {}
        recent = (obj.get("status") or {}).get("recentDeliveries") or []
        last = "<none>"
        if recent:
            tries = recent[0]["attempts"]
            last = f"{recent[0]['phase']} ({tries} attempt{'s' * (tries != 1)})"
        return [
            obj["metadata"]["name"],
            spec.get("url", ""),
            ",".join(spec.get("events") or []),
            last,
            age(obj["metadata"].get("creationTimestamp")),
            spec.get("description", ""),
        ]

    def prepare_create(self, obj: Obj) -> None:
        obj.pop("status", None)  # computed as it is read; the server makes the secret

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        obj.pop("status", None)

    def validate(self, obj: Obj) -> list[Cause]:
        return callbacks.spec_causes(obj.get("spec") or {})

    def allocate(self, session: Session, obj: Obj) -> list[Cause]:
        """A place in the namespace: 403 once it holds `MAX_PER_NAMESPACE` callbacks."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        count = session.scalar(
            select(func.count())
            .select_from(objects_t)
            .where(
                objects_t.c.api_group == self.group,
                objects_t.c.resource == self.resource,
                objects_t.c.namespace == namespace,
            )
        )
        if (count or 0) >= callbacks.MAX_PER_NAMESPACE:
            raise Forbidden(
                f'{self.qualified} "{name}" is forbidden: namespace "{namespace}" already has '
                f"{count} callbacks, the most it may have: delete one, or subscribe an existing "
                "one to more events",
                ref=ResourceRef(self.resource, name, self.group),
            )
        return []

    def created(self, session: Session, obj: Obj) -> Obj:
        """Its signing secret, made now and shown in this answer only."""
        secret = callbacks.new_secret()
        session.execute(
            secrets_t.insert().values(
                callback_uid=obj["metadata"]["uid"], secret=secret, rotated_at=now()
            )
        )
        return {**obj, "status": {**(obj.get("status") or {}), "signingSecret": secret}}

    def present(self, session: Session, obj: Obj) -> None:
        self.present_all(session, [obj])

    def present_all(self, session: Session, objs: list[Obj]) -> None:
        """Each callback's rotation time and recent deliveries: two queries for the page."""
        uids = [obj["metadata"]["uid"] for obj in objs]
        if not uids:
            return
        rotated = dict(
            session.execute(
                select(secrets_t.c.callback_uid, secrets_t.c.rotated_at).where(
                    secrets_t.c.callback_uid.in_(uids)
                )
            ).all()
        )
        deliveries = callbacks.recent_deliveries(session, uids)
        for obj, uid in zip(objs, uids, strict=True):
            status = {k: v for k, v in (obj.get("status") or {}).items() if k == "signingSecret"}
            if rotated.get(uid) is not None:
                status["secretRotationTime"] = timestamp(rotated[uid])
            status["recentDeliveries"] = deliveries.get(uid, [])
            obj["status"] = status

    def deleted(self, session: Session, obj: Obj) -> None:
        """Its secret and deliveries go with it (pending ones are never sent); the foreign keys'
        ON DELETE CASCADE says the same."""
        uid = obj["metadata"]["uid"]
        session.execute(delete(deliveries_t).where(deliveries_t.c.callback_uid == uid))
        session.execute(delete(secrets_t).where(secrets_t.c.callback_uid == uid))
