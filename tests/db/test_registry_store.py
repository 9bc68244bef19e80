"""The registry's store on both databases, for what no kind served today uses yet: a
cluster-scoped kind with a status subresource and metadata.generation."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import Field

from app.db.engine import Database
from app.errors import AlreadyExists, Conflict, NotFound
from app.kube.meta import KubeModel, ObjectMeta
from app.kube.selectors import parse_label_selector
from app.registry.store import Store
from app.registry.strategy import Strategy
from tests.conftest import unique


class Widget(KubeModel):
    api_version: Literal["example.com/v1"] | None = "example.com/v1"
    kind: Literal["Widget"] | None = "Widget"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None


class WidgetStrategy(Strategy):
    kind = "Widget"
    resource = "widgets"
    singular = "widget"
    group = "example.com"
    namespaced = False
    model = Widget
    has_status = True
    generation = True


STORE = Store(WidgetStrategy())


def test_status_subresource_and_generation(db: Database) -> None:
    name = unique("w")
    made = db.write(
        lambda s: STORE.create(
            s,
            namespace=None,
            obj={"metadata": {"name": name}, "spec": {"size": 1}, "status": {"ready": True}},
        )
    )
    assert "namespace" not in made["metadata"] and "status" not in made  # set through /status
    assert made["metadata"]["generation"] == 1
    with pytest.raises(AlreadyExists):
        db.write(lambda s: STORE.create(s, namespace=None, obj={"metadata": {"name": name}}))

    # the main resource: the spec changes (generation 2), a status in the body is ignored
    body = {**made, "spec": {"size": 2}, "status": {"ready": True}}
    updated = db.write(lambda s: STORE.update(s, namespace="", name=name, obj=body))
    assert updated["spec"] == {"size": 2} and "status" not in updated
    assert updated["metadata"]["generation"] == 2
    # the status subresource: only the status changes, the generation stays
    body = {**updated, "spec": {"size": 99}, "status": {"ready": True}}
    status = db.write(
        lambda s: STORE.update(s, namespace="", name=name, obj=body, subresource="status")
    )
    assert status["status"] == {"ready": True} and status["spec"] == {"size": 2}
    assert status["metadata"]["generation"] == 2
    # an update that changes nothing keeps the resourceVersion (no event)
    same = db.write(lambda s: STORE.update(s, namespace="", name=name, obj=status))
    assert same["metadata"]["resourceVersion"] == status["metadata"]["resourceVersion"]
    # a stale resourceVersion is a conflict
    with pytest.raises(Conflict):
        db.write(lambda s: STORE.update(s, namespace="", name=name, obj=made))

    listed, _, _ = db.read(
        lambda s: STORE.list_page(
            s,
            namespace=None,
            tenant_id=None,
            labels=parse_label_selector(None),
            fields=[],
            limit=None,
            continue_token=None,
        )
    )
    assert name in {o["metadata"]["name"] for o in listed}
    gone = db.write(lambda s: STORE.delete(s, namespace="", name=name))
    assert gone["metadata"]["name"] == name
    with pytest.raises(NotFound):
        db.read(lambda s: STORE.get(s, namespace="", name=name))


def test_paging_reads_past_a_chunk(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages are cut in SQL a chunk at a time: a page that spans chunks is whole and in order."""
    import app.registry.store as store_module

    monkeypatch.setattr(store_module, "LIST_CHUNK", 3)
    prefix = unique("p")
    names = [f"{prefix}-{i:02d}" for i in range(8)]
    for i, name in enumerate(names):
        labels = {"even": str(i % 2 == 0).lower()}
        db.write(
            lambda s, n=name, l=labels: STORE.create(  # noqa: E741
                s, namespace=None, obj={"metadata": {"name": n, "labels": l}}
            )
        )
    even = parse_label_selector("even=true")
    seen: list[str] = []
    token = None
    while True:
        items, _, token = db.read(
            lambda s, t=token: STORE.list_page(
                s, namespace=None, tenant_id=None, labels=even, fields=[], limit=2, continue_token=t
            )
        )
        seen += [o["metadata"]["name"] for o in items if o["metadata"]["name"].startswith(prefix)]
        if token is None:
            break
    assert seen == names[::2]
