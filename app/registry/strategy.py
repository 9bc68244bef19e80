"""What a kind declares to be kept by the registry: its strategy.

A strategy holds no state and touches no database: it says what the kind is (names, group,
scope, schema), how an object is made ready and checked on create and update, which fields a
field selector may name, how `kubectl get` prints it, and how it is stored (a Secret's data is
encrypted, see `to_storage` / `from_storage`). `app/registry/store.py` does the rest, the same
way for every kind.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from app.errors import Cause
from app.kube.tables import Column, age

Obj = dict[str, Any]

NAME_COLUMNS: list[Column] = [
    ("Name", "string", "Name of the object.", 0),
    ("Age", "string", "Time since creation.", 0),
]


def name_row(obj: Obj) -> list[Any]:
    return [obj["metadata"]["name"], age(obj["metadata"].get("creationTimestamp"))]


class Keyring:
    """What encrypts values at rest (app/registry/crypto.py); a strategy that stores nothing
    secret never uses it."""

    def encrypt(self, plain: bytes) -> str:  # pragma: no cover - the interface
        raise NotImplementedError

    def decrypt(self, sealed: str) -> bytes:  # pragma: no cover - the interface
        raise NotImplementedError


class Strategy:
    """The base of every kind's strategy; a kind overrides what differs.

    Class attributes name the kind; methods are hooks the store calls:
    `prepare_create` / `prepare_update` (defaults, what the client may not set), `validate` /
    `validate_update` (causes of a 422), `allocate` (what a new object takes in the create's
    transaction), `created` / `updated` (what belongs to an object beside its row, written with
    it; and the create's answer), `to_storage` / `from_storage` (the stored form), `present`
    (what is computed as an object is read), `deleted` (what deleting an object does
    beyond removing it), and `configured` (what it takes from the server's settings).
    """

    kind: ClassVar[str]
    resource: ClassVar[str]  # plural, as in the URL
    singular: ClassVar[str]
    group: ClassVar[str] = ""
    version: ClassVar[str] = "v1"
    namespaced: ClassVar[bool] = True
    model: ClassVar[type[BaseModel]]  # the schema a body is decoded and checked with
    list_model: ClassVar[type[BaseModel] | None] = None  # its list, for the OpenAPI document
    short_names: ClassVar[tuple[str, ...]] = ()
    categories: ClassVar[tuple[str, ...]] = ()
    field_selectors: ClassVar[tuple[str, ...]] = ("metadata.name", "metadata.namespace")
    columns: ClassVar[list[Column]] = NAME_COLUMNS
    # A status subresource: the main resource's writes keep the stored status, and
    # `<resource>/status` writes change nothing else.
    has_status: ClassVar[bool] = False
    # Whether `metadata.generation` counts changes of everything but metadata and status.
    generation: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    # Tenants may only get, list and watch it in their namespaces; the admin writes it.
    tenants_read_only: ClassVar[bool] = False
    # Its objects own others (a controller makes them, with ownerReferences): a Foreground or
    # Orphan deletion waits for the garbage collector (app/controllers/gc.py). Other kinds own
    # nothing Tessera makes, and are deleted at once whatever the policy.
    has_dependents: ClassVar[bool] = False
    # A workload kind: the controller manager (role `controller`) reads and writes it in every
    # tenant namespace (app/auth/rules.py).
    workload: ClassVar[bool] = False
    # The `scale` subresource (autoscaling/v1 Scale, `kubectl scale`): where the replica count
    # is in the object (("spec", "replicas")), and the status field of the replicas there are;
    # None: no scale subresource.
    scale_path: ClassVar[tuple[str, ...] | None] = None
    # Subresources the kind's own module serves beside the installer's routes (a Callback's
    # `rotate`): (name, kind, verbs) each, for discovery; tenants have the kind's own access.
    own_subresources: ClassVar[tuple[tuple[str, str, tuple[str, ...]], ...]] = ()
    # The change log keeps the object as it is read (with what `present` computes, as a
    # PodGroup's status from its member pods), so watchers see what a get shows; others log
    # the object as stored.
    logs_status: ClassVar[bool] = False
    # Where the kind's objects are kept: None, the registry's one table (`objects`, the body as
    # JSON); or a table of the kind's own, with the columns of `objects` but `api_group` and
    # `resource`, and columns of its own that hold part of the body (`to_row` / `from_row`):
    # a Lease's, which leader election locks and the node loop reads (app/leases/service.py).
    table: ClassVar[Any] = None
    # Requested about as often as pods (a node's Lease: every node's heartbeat): its routes are
    # matched before most of the API's (app/registry/router.py, app/main.py's ROUTERS).
    routes_first: ClassVar[bool] = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def log_kind(self) -> str:
        """The change log's name of the kind (watches ask for it)."""
        return self.kind

    @property
    def qualified(self) -> str:
        """How messages name the resource: `configmaps`, `leases.coordination.k8s.io`."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def configured(self, settings: Any) -> Strategy:
        """The strategy as the server's settings configure it, for the stores of one request
        (a Commitment's currency and its minor digits); most kinds take nothing from them.
        Where no settings are at hand (a namespace's cascade), the kind's own instance in
        `KINDS` is used."""
        return self

    def row(self, obj: Obj) -> list[Any]:
        """The cells of `obj`'s row in `kubectl get` (one per column)."""
        return name_row(obj)

    def scale_selector(self, obj: Obj) -> str:
        """The label selector of the pods counted in the Scale's status (with `scale_path`)."""
        return ""

    def prepare_create(self, obj: Obj) -> None:
        """Make a new object ready before it is validated (in place)."""

    def prepare_update(self, obj: Obj, old: Obj) -> None:
        """Make an updated object ready before it is validated (in place)."""

    def validate(self, obj: Obj) -> list[Cause]:
        """What is wrong with an object, on create and update."""
        return []

    def validate_update(self, obj: Obj, old: Obj) -> list[Cause]:
        """What an update may not change (immutable fields)."""
        return []

    def allocate(self, session: Any, obj: Obj) -> list[Cause]:
        """Take, for a new object, what others may hold too, in the create's transaction (a
        Service's cluster IP, a Callback's place among its namespace's); causes of a 422 when
        it cannot (or a domain error, as Forbidden for a namespace that holds all it may)."""
        return []

    def created(self, session: Any, obj: Obj) -> Obj:
        """A new object's row is written (in the same transaction): write what belongs to it
        beside the row, and return the create's answer, `obj` or a new dict with what only
        this answer shows (a Callback's signing secret). Never change `obj` in place: it is
        what the change log keeps."""
        return obj

    def updated(self, session: Any, obj: Obj, old: Obj) -> None:
        """An object's row was rewritten with a change (in the same transaction, before the
        change is logged): keep what belongs to it beside the row in step (a PodGroup's row
        the scheduler reads)."""

    def to_storage(self, obj: Obj, keyring: Keyring | None) -> Obj:
        """The object as the database and the change log keep it."""
        return obj

    def from_storage(self, obj: Obj, keyring: Keyring | None) -> Obj:
        """The inverse of `to_storage`."""
        return obj

    def to_row(self, body: Obj) -> tuple[Obj, dict[str, Any]]:
        """A stored body (all but apiVersion, kind and the metadata the columns hold) split in
        what the `body` column keeps and the values of the kind's own columns (`table`)."""
        return body, {}

    def from_row(self, row: Any) -> Obj:
        """The inverse of `to_row`: the stored body from a row of the kind's table."""
        body: Obj = row["body"]
        return body

    def renewal(self, obj: Obj, old: Obj) -> dict[str, Any] | None:
        """Whether the update of `old` to `obj` is a renewal: a change of the kind's own columns
        only (`table`), each valid, everything else of the object as it is (a Lease's holder
        moving spec.renewTime). Its column values, for the store's lean path; None for any other
        update, which takes the whole one. Most kinds have no renewals."""
        return None

    def present(self, session: Any, obj: Obj) -> None:
        """Fill in what is computed as an object is read (in place), in the reader's
        transaction: a ResourceQuota's status."""

    def present_all(self, session: Any, objs: list[Obj]) -> None:
        """`present` for a page of a list at once: a kind that reads other tables for it
        reads them once a page, not once an object."""
        for obj in objs:
            self.present(session, obj)

    def deleted(self, session: Any, obj: Obj) -> Obj | None:
        """An object of this kind was removed (in the same transaction): do what that does
        beyond removing it, and return the deletion's answer when it shows more than the object
        as it was (a Commitment's status: the plan ends tomorrow), else None."""
        return None
