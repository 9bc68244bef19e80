"""The application's routing: requests are matched against `app.main.ROUTERS` in order."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from starlette.routing import Route

from app.main import ROUTERS, create_app
from app.settings import Settings


def _overlap(a: str, b: str) -> bool:
    """Whether some request path matches both path templates (`{name}` matches one segment,
    `{name:path}` the rest of the path)."""
    left, right = a.strip("/").split("/"), b.strip("/").split("/")
    for x, y in zip(left, right, strict=False):
        if x.endswith(":path}") or y.endswith(":path}"):
            return True
        if not (x == y or x.startswith("{") or y.startswith("{")):
            return False
    return len(left) == len(right)


def test_overlap() -> None:
    assert _overlap("/api/v1/namespaces/{namespace}/pods", "/api/v1/namespaces/x/{resource}")
    assert _overlap("/openapi/v3/{group_version:path}", "/openapi/v3/api/v1")
    assert not _overlap("/api/v1/namespaces/{name}", "/api/v1/namespaces/{namespace}/pods")
    assert not _overlap("/api/v1/pods", "/api/v1/nodes")


def test_no_path_is_served_by_two_routers(tmp_path: Path) -> None:
    """Then the order of ROUTERS (the most requested first) never decides which route answers."""
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/routes.db")
    app = create_app(settings)
    app.state.services.db.dispose()
    own = [route.path for route in app.router.routes if isinstance(route, Route)]
    groups = [own] + [[r.path for r in router.routes if isinstance(r, Route)] for router in ROUTERS]
    assert len(own) >= 4 and all(groups)
    clashes = [
        (a, b)
        for first, second in combinations(groups, 2)
        for a in first
        for b in second
        if _overlap(a, b)
    ]
    assert clashes == []
