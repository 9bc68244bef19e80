import pytest

from app.errors import BadRequest
from app.kube.bodies import json_patch, merge_patch, strategic_merge
from app.kube.selectors import parse_field_selector, parse_label_selector


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("env in (a, b)", {"env": "b"}, True),
        ("env notin (a)", {"env": "a"}, False),
        ("canary", {"canary": ""}, True),
        ("!canary", {"canary": "x"}, False),
        ("app=web,tier!=db", {"app": "web", "tier": "db"}, False),
    ],
)
def test_label_selectors(selector, labels, matches) -> None:
    assert parse_label_selector(selector).matches(labels) is matches


@pytest.mark.parametrize("selector", ["app in x", "a=b=c", "(", "app in (a"])
def test_bad_label_selectors(selector) -> None:
    with pytest.raises(BadRequest):
        parse_label_selector(selector)


def test_field_selector_names_unsupported_fields() -> None:
    assert [(r.field, r.value, r.negate) for r in parse_field_selector("a=1,b!=2", ("a", "b"))] == [
        ("a", "1", False),
        ("b", "2", True),
    ]
    with pytest.raises(BadRequest, match=r"spec\.image"):
        parse_field_selector("spec.image=x", ("a",))


def test_merge_patch_rfc7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None, "e": 3}, "d": [2]}) == {
        "a": {"c": 2, "e": 3},
        "d": [2],
    }


def test_strategic_merge_merges_named_lists() -> None:
    current = {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}
    patch = {
        "containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}],
        "$setElementOrder/containers": [],
    }
    assert strategic_merge(current, patch) == {
        "containers": [
            {"name": "a", "image": "1"},
            {"name": "b", "image": "2"},
            {"name": "c", "image": "3"},
        ]
    }
    assert strategic_merge(current, {"containers": [{"name": "a", "$patch": "delete"}]}) == {
        "containers": [{"name": "b", "image": "1"}]
    }


def test_json_patch_rfc6902() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}, "items": [1, 2]}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "replace", "path": "/items/0", "value": 9},
            {"op": "add", "path": "/items/-", "value": 3},
            {"op": "test", "path": "/items/1", "value": 2},
        ],
    )
    assert out == {"metadata": {"labels": {"b": "2"}}, "items": [9, 2, 3]}
    assert doc == {"metadata": {"labels": {"a": "1"}}, "items": [1, 2]}
    with pytest.raises(BadRequest):
        json_patch(doc, [{"op": "remove", "path": "/nope"}])
