"""billing.tessera.io/v1 Commitment: a tenant's daily commitment plan, in its namespace.

The object (its spec: `amountPerDay`, in the server's currency) is the registry's, with every
verb the store gives. Beside it, under its uid, is its row of `commitments`: the tenant whose
one plan it is (the row's unique tenant keeps it one, also against two creates racing in two of
the tenant's namespaces) and the amount in minor units. What billing rates with is neither: it
is the append-only `commitment_terms` (billing/ledger.py), which every change of the amount
extends as `billing.commitments.change` says: a new plan starts at the next UTC day, a raise of
the plan active today counts from today, a lowering from tomorrow, and removing the object (a
delete, the last finalizer gone, its namespace's deletion) ends the plan from tomorrow, so that
today's commitment is still owed. A dry run's terms go with its rolled-back transaction.

The status is computed as the object is read (the amount active today, its discount, this
month's savings, a change due tomorrow): it moves with the clock and with usage, not with the
object, so the change log keeps the object without it. The amounts are in the currency and
minor digits of the server's settings (`configured`).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.billing_api import service as billing
from app.billing_api.schemas import Commitment, CommitmentList
from app.constants import BILLING_GROUP
from app.db.engine import insert_unless_exists
from app.db.models import Commitment as CommitmentRow
from app.db.models import Namespace, StoredObject, table
from app.errors import AlreadyExists, Cause, ResourceRef
from app.kube.meta import now
from app.kube.tables import COMMITMENT_COLUMNS, Column, commitment_row
from app.registry.strategy import Obj, Strategy
from billing.statements import to_minor

plans_t = table(CommitmentRow)
objects_t = table(StoredObject)
FIELD = "spec.amountPerDay"


class CommitmentStrategy(Strategy):
    kind = "Commitment"
    resource = "commitments"
    singular = "commitment"
    group = BILLING_GROUP
    model = Commitment
    list_model = CommitmentList
    categories = ("billing",)
    summary = "the tenant's one daily plan: it starts at the next UTC day"
    columns: ClassVar[list[Column]] = COMMITMENT_COLUMNS

    def __init__(self, money: billing.Money | None = None) -> None:
        self.money = money

    def configured(self, settings: Any) -> Strategy:
        return _configured(settings.billing_currency, settings.billing_minor_digits)

    def _money(self) -> billing.Money:
        if self.money is None:
            raise RuntimeError("a Commitment is written only through a configured strategy")
        return self.money

    def row(self, obj: Obj) -> list[Any]:
        return commitment_row(obj)

    def _normalize(self, obj: Obj) -> None:
        """The status is the server's; a valid amount is kept as the currency writes it
        ("40" -> "40.00"), so that a change to the same amount is no change."""
        obj.pop("status", None)
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        money = self._money()
        amount, causes = billing.amount_causes(spec.get("amountPerDay"), money)
        if not causes:
            spec["amountPerDay"] = billing.amount_text(to_minor(amount, money.minor_digits), money)

    def prepare_create(self, obj: Obj) -> None:
        self._normalize(obj)

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        self._normalize(obj)

    def validate(self, obj: Obj) -> list[Cause]:
        spec = obj.get("spec")
        value = spec.get("amountPerDay") if isinstance(spec, dict) else None
        return billing.amount_causes(value, self._money())[1]

    def allocate(self, session: Session, obj: Obj) -> list[Cause]:
        """The tenant's one plan: 422 outside a tenant's namespace, 409 when it has one."""
        namespace = obj["metadata"]["namespace"]
        tenant = _tenant_of(session, namespace)
        if tenant is None:
            return [
                Cause(
                    "metadata.namespace",
                    f'Invalid value: "{namespace}": a commitment belongs to a tenant; create it '
                    "in the tenant's namespace",
                )
            ]
        held = _plan_of(session, tenant)
        if held is not None:
            raise self._second(obj, held)
        return []

    def _second(self, obj: Obj, held: Any) -> AlreadyExists:
        name = obj["metadata"]["name"]
        plan = f'the plan "{held.namespace}/{held.name}"' if held is not None else "a plan"
        return AlreadyExists(
            f'{self.qualified} "{name}" cannot be created: the tenant already has {plan}; '
            "change its spec.amountPerDay",
            ref=ResourceRef(self.resource, name, self.group),
        )

    def created(self, session: Session, obj: Obj) -> Obj:
        """Its `commitments` row, and the plan's first term: from the next UTC day."""
        tenant = _tenant_of(session, obj["metadata"]["namespace"])
        assert tenant is not None  # allocate refused the object otherwise
        minor = self._minor(obj)
        row = {"uid": obj["metadata"]["uid"], "tenant_id": tenant, "amount_minor": minor}
        if not insert_unless_exists(session, plans_t, row):
            raise self._second(obj, _plan_of(session, tenant))  # another create won the race
        billing.add_term(session, tenant_id=tenant, amount_minor=minor, at=now())
        return obj

    def updated(self, session: Session, obj: Obj, old: Obj) -> None:
        """A new amount is a new term (a raise from today, a lowering from tomorrow)."""
        plan = (
            session.execute(select(plans_t).where(plans_t.c.uid == obj["metadata"]["uid"]))
            .mappings()
            .first()
        )
        minor = self._minor(obj)
        if plan is None or plan["amount_minor"] == minor:
            return
        session.execute(
            update(plans_t).where(plans_t.c.uid == plan["uid"]).values(amount_minor=minor)
        )
        billing.add_term(session, tenant_id=plan["tenant_id"], amount_minor=minor, at=now())

    def deleted(self, session: Session, obj: Obj) -> Obj | None:
        """The plan ends from tomorrow: today's commitment is still owed. (Its `commitments`
        row went with the object, ON DELETE CASCADE; the tenant is its namespace's.) The
        answer shows that end in its status."""
        tenant = _tenant_of(session, obj["metadata"]["namespace"])
        if tenant is None:
            return None
        at = now()
        billing.add_term(session, tenant_id=tenant, amount_minor=0, at=at)
        if self.money is None:
            return None
        return {
            **obj,
            "status": billing.plan_status(session, tenant_id=tenant, money=self.money, at=at),
        }

    def present(self, session: Session, obj: Obj) -> None:
        if self.money is None:  # unconfigured (an event's involved object): no status
            return
        tenant = session.scalar(
            select(plans_t.c.tenant_id).where(plans_t.c.uid == obj["metadata"]["uid"])
        )
        if tenant is not None:
            obj["status"] = billing.plan_status(
                session, tenant_id=tenant, money=self.money, at=now()
            )

    def _minor(self, obj: Obj) -> int:
        money = self._money()
        amount, _ = billing.amount_causes(obj["spec"]["amountPerDay"], money)
        return int(to_minor(amount, money.minor_digits))


@functools.cache
def _configured(currency: str, minor_digits: int) -> CommitmentStrategy:
    return CommitmentStrategy(billing.Money(currency, minor_digits))


def _plan_of(session: Session, tenant: int) -> Any:
    """The namespace and name of the tenant's plan, or None."""
    return session.execute(
        select(objects_t.c.namespace, objects_t.c.name)
        .select_from(plans_t.join(objects_t, objects_t.c.uid == plans_t.c.uid))
        .where(plans_t.c.tenant_id == tenant)
    ).first()


def _tenant_of(session: Session, namespace: str) -> int | None:
    return session.scalar(select(Namespace.tenant_id).where(Namespace.name == namespace))
