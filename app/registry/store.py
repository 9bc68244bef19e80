"""One store for every kind the registry keeps: the verbs, in SQL, in the caller's transaction.

Every verb has the same semantics whatever the kind; the kind's strategy (app/registry/strategy.py)
only prepares, validates and prints. Writes take the object's row lock and check its
resourceVersion, log ADDED / MODIFIED / DELETED to the change log (so watches see them), and
honour finalizers: an object that has some is only marked with a deletionTimestamp, and goes
when an update removes the last one. A dry run is the same call in a transaction that is rolled
back (`Services.dry_run`), so it checks everything and writes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, true, update
from sqlalchemy.orm import Session

from app.db.engine import (
    current_resource_version,
    insert_unless_exists,
    next_resource_version,
    record_change,
)
from app.db.models import StoredObject, table
from app.errors import AlreadyExists, Cause, Conflict, Forbidden, NotFound, ResourceRef, invalid
from app.kube.listing import object_field
from app.kube.lists import ContinueToken
from app.kube.meta import (
    new_uid,
    now,
    parse_timestamp,
    random_hex,
    timestamp,
    validate_annotations,
    validate_generate_name,
    validate_labels,
    validate_name,
)
from app.kube.selectors import FieldRequirement, LabelSelector, field_filter
from app.namespaces import service as namespaces
from app.namespaces.service import NamespaceInfo
from app.quotas import service as quotas
from app.registry.kinds import KINDS
from app.registry.strategy import Keyring, Obj, Strategy

objects_t = table(StoredObject)
Row = Mapping[Any, Any]

# metadata kept in columns, not in the stored body
COLUMN_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
)
# metadata the server keeps when an update leaves it out
SERVER_KEPT = ("managedFields", "generateName")
LIST_CHUNK = 500
MAX_FINALIZERS = 64
# What a deletion's propagationPolicy leaves on an object of a kind that has dependents, for the
# garbage collector (app/controllers/gc.py): it deletes the dependents first (Foreground) or
# takes its ownerReference off them (Orphan), then removes the finalizer, and the object goes.
# Background adds none: the object goes now, and the collector deletes dependents whose owners
# are all gone.
PROPAGATION_FINALIZERS = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}


class Store:
    """The verbs of one kind. Cheap to make: one per request (with the keyring that opens what
    the kind stores sealed; None where nothing is opened, as in a namespace's cascade)."""

    def __init__(self, strategy: Strategy, keyring: Keyring | None = None) -> None:
        self.strategy = strategy
        self.keyring = keyring
        # the kind's own table, or the registry's one (`Strategy.table`)
        self.table = objects_t if strategy.table is None else strategy.table

    # --- reading --------------------------------------------------------------------------

    def _of_kind(self) -> Any:
        if self.table is not objects_t:
            return true()  # a table of the kind's own holds nothing else
        return and_(
            self.table.c.api_group == self.strategy.group,
            self.table.c.resource == self.strategy.resource,
        )

    def _row(
        self, session: Session, namespace: str, name: str, *, for_update: bool = False
    ) -> Row | None:
        query = select(self.table).where(
            self._of_kind(), self.table.c.namespace == namespace, self.table.c.name == name
        )
        if for_update:
            query = query.with_for_update()
        return session.execute(query).mappings().first()

    def _existing(self, session: Session, namespace: str, name: str) -> Row:
        row = self._row(session, namespace, name, for_update=True)
        if row is None:
            raise self._not_found(name)
        return row

    def stored(self, row: Row) -> Obj:
        """The object as stored (a Secret's data still sealed)."""
        body = self.strategy.from_row(row)
        metadata: Obj = {"name": row["name"]}
        if self.strategy.namespaced:
            metadata["namespace"] = row["namespace"]
        metadata["uid"] = row["uid"]
        metadata["resourceVersion"] = str(row["resource_version"])
        metadata["creationTimestamp"] = timestamp(row["created_at"])
        if row["deletion_timestamp"] is not None:
            metadata["deletionTimestamp"] = timestamp(row["deletion_timestamp"])
            metadata["deletionGracePeriodSeconds"] = 0
        if row["labels"]:
            metadata["labels"] = row["labels"]
        metadata.update(body.get("metadata") or {})
        return {
            "apiVersion": self.strategy.api_version,
            "kind": self.strategy.kind,
            "metadata": metadata,
            **{k: v for k, v in body.items() if k != "metadata"},
        }

    def to_api(self, row: Row) -> Obj:
        return self.strategy.from_storage(self.stored(row), self.keyring)

    def get(self, session: Session, *, namespace: str, name: str) -> Obj:
        row = self._row(session, namespace, name)
        if row is None:
            raise self._not_found(name)
        return self.presented(session, self.to_api(row))

    def presented(self, session: Session, obj: Obj) -> Obj:
        """`obj` with what its kind computes as it is read (`Strategy.present`)."""
        self.strategy.present(session, obj)
        return obj

    def presented_all(self, session: Session, objs: list[Obj]) -> list[Obj]:
        """`presented` for the objects of a list, a chunk at a time (`Strategy.present_all`)."""
        for start in range(0, len(objs), LIST_CHUNK):
            self.strategy.present_all(session, objs[start : start + LIST_CHUNK])
        return objs

    def _scoped(self, namespace: str | None, tenant_id: int | None) -> Any:
        query = select(self.table).where(self._of_kind())
        if namespace is not None:
            query = query.where(self.table.c.namespace == namespace)
        if tenant_id is not None:
            query = query.where(self.table.c.tenant_id == tenant_id)
        return query.order_by(self.table.c.namespace, self.table.c.name)

    def _rows(
        self,
        session: Session,
        *,
        namespace: str | None,
        tenant_id: int | None,
        after: tuple[str, str] | None = None,
    ) -> Iterable[Row]:
        """Every row in scope after `after`, in (namespace, name) order, read a chunk at a time."""
        while True:
            query = self._scoped(namespace, tenant_id).limit(LIST_CHUNK)
            if after is not None:
                query = query.where(
                    or_(
                        self.table.c.namespace > after[0],
                        and_(self.table.c.namespace == after[0], self.table.c.name > after[1]),
                    )
                )
            rows = session.execute(query).mappings().all()
            yield from rows
            if len(rows) < LIST_CHUNK:
                return
            after = (rows[-1]["namespace"], rows[-1]["name"])

    def list_page(
        self,
        session: Session,
        *,
        namespace: str | None,
        tenant_id: int | None,
        labels: LabelSelector,
        fields: list[FieldRequirement],
        limit: int | None,
        continue_token: str | None,
    ) -> tuple[list[Obj], int, str | None]:
        """One page of the objects in scope that match the selectors: (items, resourceVersion,
        the next page's continue token or None). Paged in SQL: only the rows up to the page's
        end are read."""
        rv = current_resource_version(session)
        after = None
        if continue_token:
            token = ContinueToken.decode(continue_token)
            after, rv = (token.namespace, token.name), token.resource_version
        items: list[Obj] = []
        for row in self._rows(session, namespace=namespace, tenant_id=tenant_id, after=after):
            if not self._matches(row, labels, fields):
                continue
            if limit and len(items) == limit:
                last = items[-1]["metadata"]
                next_token = ContinueToken(last.get("namespace", ""), last["name"], rv)
                return self.presented_all(session, items), rv, next_token.encode()
            items.append(self.to_api(row))
        return self.presented_all(session, items), rv, None

    def list_all(
        self, session: Session, *, namespace: str | None, tenant_id: int | None
    ) -> tuple[list[Obj], int]:
        rv = current_resource_version(session)
        rows = self._rows(session, namespace=namespace, tenant_id=tenant_id)
        return self.presented_all(session, [self.to_api(row) for row in rows]), rv

    def _matches(self, row: Row, labels: LabelSelector, fields: list[FieldRequirement]) -> bool:
        if not labels.empty and not labels.matches(row["labels"] or {}):
            return False
        if not fields:
            return True
        obj = self.stored(row)  # selectable fields are never sealed
        return field_filter(fields, lambda path: object_field(obj, path))

    # --- writing --------------------------------------------------------------------------

    def create(self, session: Session, *, namespace: NamespaceInfo | None, obj: Obj) -> Obj:
        strategy = self.strategy
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = namespace.name if namespace is not None else ""
        name = meta.get("name") or ""
        if namespace is not None and namespace.terminating:
            raise Forbidden(
                f'{strategy.resource} "{name or meta.get("generateName", "")}" is forbidden: '
                f"unable to create new content in namespace {ns} because it is being terminated",
                ref=self._ref(name),
            )
        causes: list[Cause] = []
        if not name and meta.get("generateName"):
            causes += validate_generate_name(meta["generateName"], "metadata.generateName")
            name = meta["generateName"] + random_hex(3)[:5]
        else:
            causes += validate_name(name, "metadata.name")
        if meta.get("namespace") not in (None, "", ns):
            causes.append(
                Cause(
                    "metadata.namespace",
                    "does not match the namespace of the request: leave it out, or send the "
                    "request to that namespace",
                )
            )
        meta.update(name=name, uid=new_uid(), creationTimestamp=timestamp(now()))
        for server_set in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(server_set, None)
        if strategy.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if strategy.generation:
            meta["generation"] = 1
        obj["apiVersion"], obj["kind"] = strategy.api_version, strategy.kind
        if strategy.has_status:
            obj.pop("status", None)  # written through the status subresource only
        strategy.prepare_create(obj)
        causes += strategy.validate(obj)
        self._check(obj, causes + ([] if causes else strategy.allocate(session, obj)))
        at = now()
        rv = next_resource_version(session)
        if strategy.namespaced and namespace is not None:
            quotas.check_count(
                session,
                namespace=ns,
                tenant_id=namespace.tenant_id,
                group=strategy.group,
                resource=strategy.resource,
                name=name,
            )
        values = self._values(obj, rv)
        if self.table is objects_t:
            values.update(api_group=strategy.group, resource=strategy.resource)
        values.update(
            uid=meta["uid"],
            namespace=ns,
            name=name,
            tenant_id=namespace.tenant_id if namespace is not None else None,
            created_at=at,
            deletion_timestamp=None,
        )
        if not insert_unless_exists(session, self.table, values):
            raise AlreadyExists(
                f'{strategy.qualified} "{name}" already exists', ref=self._ref(name)
            )
        stored = self.stored(values)
        answer = strategy.created(session, strategy.from_storage(stored, self.keyring))
        self._log(values, stored, "ADDED", session)
        return self.presented(session, answer)

    def update(
        self,
        session: Session,
        *,
        namespace: str,
        name: str,
        obj: Obj,
        subresource: str = "",
        row: Row | None = None,
    ) -> Obj:
        """Replace an object (PUT; also the end of every patch and apply). A resourceVersion in
        the object makes it conditional; the server's fields (uid, creationTimestamp,
        deletionTimestamp) stay as they are. `subresource` "status": only the status changes."""
        strategy = self.strategy
        row = row or self._existing(session, namespace, name)
        old = self.to_api(row)
        meta = obj.get("metadata") or {}
        causes = [
            Cause(path, f'Invalid value: "{value}": field is immutable', "FieldValueInvalid")
            for path, value, current in (
                ("metadata.name", meta.get("name"), name),
                ("metadata.namespace", meta.get("namespace"), namespace or None),
            )
            if value not in (None, "", current)
        ]
        # A renewal (`Strategy.renewal`: a Lease's holder moving its renewTime) changes nothing
        # that the checks below the preconditions look at: it takes the lean path, `_renew`.
        renewal = None if causes or subresource else strategy.renewal(obj, old)
        if renewal is None:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            self._check(obj, causes)
        if meta.get("uid") not in (None, "", row["uid"]):
            raise Conflict(
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{row['uid']}",
                ref=self._ref(name),
            )
        wanted = meta.get("resourceVersion")
        if wanted and wanted != str(row["resource_version"]):
            raise self._stale(name)
        if renewal is not None:
            return self._renew(session, row, old, renewal)
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": obj.get("status")}
        else:
            new = obj
            new_meta = new["metadata"]
            for key in SERVER_KEPT:
                if key not in new_meta and key in old["metadata"]:
                    new_meta[key] = old["metadata"][key]
            if strategy.has_status:
                new["status"] = copy.deepcopy(old.get("status"))
        new_meta = new["metadata"]
        for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if key in old["metadata"]:
                new_meta[key] = old["metadata"][key]
            else:
                new_meta.pop(key, None)
        new_meta.pop("deletionGracePeriodSeconds", None)
        new["apiVersion"], new["kind"] = strategy.api_version, strategy.kind
        if new.get("status") is None:
            new.pop("status", None)
        deleting = row["deletion_timestamp"] is not None
        added = set(new_meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if deleting and added:
            causes.append(
                Cause(
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}",
                )
            )
        strategy.prepare_update(new, old)
        if strategy.generation and _spec_of(new) != _spec_of(old):
            new_meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
        elif "generation" in old["metadata"]:
            new_meta["generation"] = old["metadata"]["generation"]
        self._check(new, causes + strategy.validate(new) + strategy.validate_update(new, old))
        if _normal(new) == _normal(old):
            # nothing changed: no new resourceVersion, no event (as Kubernetes)
            return self.presented(session, old)
        rv = next_resource_version(session)
        values = self._values(new, rv)
        result = session.execute(
            update(self.table)
            .where(
                self.table.c.uid == row["uid"],
                self.table.c.resource_version == row["resource_version"],
            )
            .values(**values)
        )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise self._stale(name)
        updated = {**row, **values}
        stored = self.stored(updated)
        strategy.updated(session, strategy.from_storage(stored, self.keyring), old)
        self._log(updated, stored, "MODIFIED", session, before=self.stored(row))
        if deleting and not new_meta.get("finalizers"):
            return strategy.from_storage(self._remove(session, updated), self.keyring)
        return self.presented(session, strategy.from_storage(stored, self.keyring))

    def _renew(self, session: Session, row: Row, old: Obj, columns: dict[str, Any]) -> Obj:
        """The lean path of an update that is a renewal (`Strategy.renewal`): the row's
        `columns` and a new resourceVersion, written under the row lock the update holds and
        on the version it read, and MODIFIED logged, as every update does; nothing else of the
        object changes, so nothing else is checked or rewritten."""
        rv = next_resource_version(session)
        result = session.execute(
            update(self.table)
            .where(
                self.table.c.uid == row["uid"],
                self.table.c.resource_version == row["resource_version"],
            )
            .values(resource_version=rv, **columns)
        )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise self._stale(row["name"])
        updated = {**row, **columns, "resource_version": rv}
        stored = self.stored(updated)
        obj = self.strategy.from_storage(stored, self.keyring)
        self.strategy.updated(session, obj, old)
        self._log(updated, stored, "MODIFIED", session, before=self.stored(row))
        return self.presented(session, obj)

    def patch(
        self,
        session: Session,
        *,
        namespace: str,
        name: str,
        change: Callable[[Obj], Obj],
        subresource: str = "",
    ) -> Obj:
        """Change an object by `change` (a patch applied and checked by the caller) under its
        row lock, so concurrent patches of one object apply one after the other; a patch that
        sets metadata.resourceVersion applies only to that version (409 otherwise)."""
        row = self._existing(session, namespace, name)
        # a resourceVersion the patch sets is a precondition, as in Kubernetes (`update` checks it)
        desired = change(self.to_api(row))
        return self.update(
            session, namespace=namespace, name=name, obj=desired, subresource=subresource, row=row
        )

    def apply(
        self,
        session: Session,
        *,
        namespace: NamespaceInfo | None,
        name: str,
        applied: Obj,
        manager: str,
        check: Callable[[Obj], Obj],
    ) -> tuple[Obj, bool]:
        """Server-side apply: create the object, or make the fields this manager applies those
        it applies now (removing the ones it applied before and no longer does, unless another
        manager holds them). Ownership is recorded in `metadata.managedFields`, each field
        path a leaf (lists whole). Returns the object and whether it was created."""
        ns = namespace.name if namespace is not None else ""
        owned = _leaf_paths(_appliable(applied))
        entry = {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": self.strategy.api_version,
            "time": timestamp(now()),
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(owned),
        }
        row = self._row(session, ns, name, for_update=True)
        if row is None:
            obj = check(applied)
            obj.setdefault("metadata", {})["managedFields"] = [entry]
            return self.create(session, namespace=namespace, obj=obj), True
        current = self.to_api(row)
        managed = list(current["metadata"].get("managedFields") or [])
        previous = next((m for m in managed if m.get("manager") == manager), None)
        before = _paths_of(previous.get("fieldsV1") or {}) if previous else set()
        others: set[tuple[str, ...]] = set()
        for m in managed:
            if m is not previous:
                others |= _paths_of(m.get("fieldsV1") or {})
        desired = copy.deepcopy(current)
        for path in before - owned - others:
            _remove_path(desired, path)
        desired = _merge(desired, _appliable(applied))
        if previous is not None and previous.get("fieldsV1") == entry["fieldsV1"]:
            entry = previous  # the same fields applied again: not a change
        desired["metadata"]["managedFields"] = [m for m in managed if m is not previous] + [entry]
        desired["metadata"]["resourceVersion"] = str(row["resource_version"])
        obj = check(desired)
        return self.update(session, namespace=ns, name=name, obj=obj, row=row), False

    def status_changed(self, session: Session, *, namespace: str, name: str) -> None:
        """What the kind computes as an object is read (`Strategy.present`: its status) was
        changed in this transaction, beside the object's row (the scheduler's verdict on a
        PodGroup): the object takes a new resourceVersion and MODIFIED is logged, so that
        watchers see it. The caller holds the row's lock."""
        row = self._existing(session, namespace, name)
        rv = next_resource_version(session)
        session.execute(
            update(self.table).where(self.table.c.uid == row["uid"]).values(resource_version=rv)
        )
        changed = {**row, "resource_version": rv}
        self._log(changed, self.stored(changed), "MODIFIED", session, before=self.stored(row))

    def delete(
        self,
        session: Session,
        *,
        namespace: str,
        name: str,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> Obj:
        """Delete an object; with finalizers it is only marked (deletionTimestamp) and goes when
        the last finalizer is removed. `uid` / `resource_version`: preconditions (409 unless
        the object is still that one, at that version). `propagation`: a deletion's
        propagationPolicy (PROPAGATION_FINALIZERS)."""
        row = self._existing(session, namespace, name)
        if uid and uid != row["uid"]:
            raise Conflict(
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{row['uid']}",
                ref=self._ref(name),
            )
        if resource_version and resource_version != str(row["resource_version"]):
            raise Conflict(
                f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                f"ResourceVersion in object meta: {row['resource_version']}",
                ref=self._ref(name),
            )
        return self.strategy.from_storage(self._delete_row(session, row, propagation), self.keyring)

    def _delete_row(self, session: Session, row: Row, propagation: str | None = None) -> Obj:
        body = row["body"]
        finalizers = list((body.get("metadata") or {}).get("finalizers") or [])
        added = (
            PROPAGATION_FINALIZERS.get(propagation or "") if self.strategy.has_dependents else None
        )
        if added and row["deletion_timestamp"] is None and added not in finalizers:
            finalizers.append(added)
            body = {**body, "metadata": {**(body.get("metadata") or {}), "finalizers": finalizers}}
        if not finalizers:
            return self._remove(session, row)
        if row["deletion_timestamp"] is not None:
            return self.stored(row)
        changes = {
            "deletion_timestamp": now(),
            "resource_version": next_resource_version(session),
            "body": body,
        }
        session.execute(update(self.table).where(self.table.c.uid == row["uid"]).values(**changes))
        marked = {**row, **changes}
        stored = self.stored(marked)
        self._log(marked, stored, "MODIFIED", session, before=self.stored(row))
        return stored

    def delete_collection(
        self,
        session: Session,
        *,
        namespace: str | None,
        tenant_id: int | None,
        labels: LabelSelector,
        fields: list[FieldRequirement],
        propagation: str | None = None,
    ) -> list[Obj]:
        """Delete every object in scope that the selectors match; returns them as deleted."""
        rows = [
            row
            for row in self._rows(session, namespace=namespace, tenant_id=tenant_id)
            if self._matches(row, labels, fields)
        ]
        deleted = []
        for row in rows:
            locked = self._row(session, row["namespace"], row["name"], for_update=True)
            if locked is not None:
                deleted.append(
                    self.strategy.from_storage(
                        self._delete_row(session, locked, propagation), self.keyring
                    )
                )
        return deleted

    def delete_namespace(self, session: Session, namespace: str) -> None:
        """A namespace is being deleted: delete each of its objects (logged one by one)."""
        for row in list(self._rows(session, namespace=namespace, tenant_id=None)):
            locked = self._row(session, row["namespace"], row["name"], for_update=True)
            if locked is not None:
                self._delete_row(session, locked)

    def holds(self, session: Session, namespace: str) -> bool:
        query = (
            select(func.count())
            .select_from(self.table)
            .where(self._of_kind(), self.table.c.namespace == namespace)
        )
        return bool(session.scalar(query))

    def _remove(self, session: Session, row: Row) -> Obj:
        session.execute(delete(self.table).where(self.table.c.uid == row["uid"]))
        gone = {**row, "resource_version": next_resource_version(session)}
        stored = self.stored(gone)
        self._log(gone, stored, "DELETED", session)
        answer = self.strategy.deleted(session, stored)
        if self.strategy.namespaced:
            namespaces.remove_if_emptied(session, row["namespace"])
        return stored if answer is None else answer

    # --- helpers --------------------------------------------------------------------------

    def _values(self, obj: Obj, rv: int) -> dict[str, Any]:
        """The columns an object is written to (`body`: its stored form, but for what the
        columns hold)."""
        stored = self.strategy.to_storage(obj, self.keyring)
        meta = stored.get("metadata") or {}
        body = {k: v for k, v in stored.items() if k not in ("apiVersion", "kind", "metadata")}
        kept = {
            k: v for k, v in meta.items() if k not in COLUMN_METADATA and v not in (None, [], {})
        }
        if kept:
            body["metadata"] = kept
        body, columns = self.strategy.to_row(body)
        values: dict[str, Any] = {
            "resource_version": rv,
            "labels": dict(meta.get("labels") or {}),
            "body": body,
            **columns,
        }
        if "deletionTimestamp" in meta:
            values["deletion_timestamp"] = parse_timestamp(meta["deletionTimestamp"])
        return values

    def _check(self, obj: Obj, causes: list[Cause]) -> None:
        meta = obj.get("metadata") or {}
        finalizers = meta.get("finalizers") or []
        if len(finalizers) > MAX_FINALIZERS:
            causes.append(
                Cause(
                    "metadata.finalizers",
                    f"Too many: {len(finalizers)}: must have at most {MAX_FINALIZERS} items",
                )
            )
        causes = (
            causes
            + validate_labels(meta.get("labels") or {}, "metadata.labels")
            + validate_annotations(meta.get("annotations") or {}, "metadata.annotations")
        )
        if causes:
            raise invalid(
                self.strategy.kind, str(meta.get("name") or ""), causes, group=self.strategy.group
            )

    def _log(
        self, row: Row, stored: Obj, event_type: str, session: Session, *, before: Obj | None = None
    ) -> None:
        if self.strategy.logs_status:
            stored = self.presented(session, copy.deepcopy(stored))
        record_change(
            session,
            {
                "resource_version": row["resource_version"],
                "kind": self.strategy.log_kind,
                "namespace": row["namespace"] if self.strategy.namespaced else None,
                "name": row["name"],
                "tenant_id": row["tenant_id"],
                "type": event_type,
                "object": stored,
            },
            before=before,
            selectable=self.strategy.field_selectors,
        )

    def _ref(self, name: str) -> ResourceRef:
        return ResourceRef(self.strategy.resource, name, self.strategy.group)

    def _not_found(self, name: str) -> NotFound:
        return NotFound(f'{self.strategy.qualified} "{name}" not found', ref=self._ref(name))

    def _stale(self, name: str) -> Conflict:
        return Conflict(
            f'Operation cannot be fulfilled on {self.strategy.qualified} "{name}": the object has '
            "been modified; please apply your changes to the latest version and try again",
            ref=self._ref(name),
        )


def _spec_of(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _normal(obj: Obj) -> Obj:
    """An object for comparison: without its resourceVersion, empty metadata maps dropped."""
    meta = {
        k: v
        for k, v in (obj.get("metadata") or {}).items()
        if k != "resourceVersion" and v not in (None, [], {})
    }
    return {**{k: v for k, v in obj.items() if v is not None}, "metadata": meta}


# --- server-side apply: field paths ---------------------------------------------------------

NOT_APPLIED_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
)


def _appliable(applied: Obj) -> Obj:
    """What an apply configuration sets: all but its identity and the server's metadata."""
    out = {k: v for k, v in applied.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {
        k: v for k, v in (applied.get("metadata") or {}).items() if k not in NOT_APPLIED_METADATA
    }
    if meta:
        out["metadata"] = meta
    return out


def _leaf_paths(obj: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if isinstance(obj, dict) and obj:
        paths: set[tuple[str, ...]] = set()
        for key, value in obj.items():
            paths |= _leaf_paths(value, (*prefix, key))
        return paths
    return {prefix} if prefix else set()


def _fields_v1(paths: set[tuple[str, ...]]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return root


def _paths_of(fields: Obj, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for key, value in fields.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        inner = _paths_of(value, path) if isinstance(value, dict) else set()
        paths |= inner or {path}
    return paths


def _remove_path(obj: Obj, path: tuple[str, ...]) -> None:
    node: Any = obj
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _merge(target: Any, applied: Any) -> Any:
    if not isinstance(applied, dict) or not isinstance(target, dict):
        return copy.deepcopy(applied)
    out = dict(target)
    for key, value in applied.items():
        out[key] = _merge(out.get(key), value)
    return out


class _NamespacedKinds:
    """Every namespaced kind of the registry, as a namespace's deletion sees them."""

    def delete_namespace(self, session: Session, namespace: str) -> None:
        for strategy in KINDS:
            if strategy.namespaced:
                Store(strategy).delete_namespace(session, namespace)

    def holds(self, session: Session, namespace: str) -> bool:
        query = (
            select(func.count()).select_from(objects_t).where(objects_t.c.namespace == namespace)
        )
        return bool(session.scalar(query)) or any(
            Store(strategy).holds(session, namespace)
            for strategy in KINDS
            if strategy.namespaced and strategy.table is not None
        )


namespaces.CONTENTS.append(_NamespacedKinds())
