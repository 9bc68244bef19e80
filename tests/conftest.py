"""Shared fixtures: real databases (SQLite and PostgreSQL), a real API server over HTTP.

Persistence and API tests take the `database_url` fixture, which is parametrised over both
backends. PostgreSQL is at TESSERA_TEST_POSTGRES_URL (default: postgres on 127.0.0.1:5432); each
run creates a fresh database there and drops it afterwards. Outside CI an unreachable PostgreSQL
skips those tests; with CI set it fails them.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import hashlib
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy.engine import make_url

from app.auth import service as auth
from app.bootstrap import bootstrap
from app.db.engine import Database
from app.db.migrate import MIGRATIONS_DIR, upgrade
from app.main import create_app
from app.server import uvicorn_options
from app.settings import Settings
from app.tls import TLSFiles

# Every server of the suite shares a worker's database, as a deployment's API processes share
# one: they must share the key that seals Secrets too (else one's Secrets would not open for
# another, and a list across namespaces fails loudly). One fixed key for the test session.
os.environ.setdefault(
    "TESSERA_SECRET_KEYS", "suite:" + base64.b64encode(b"tessera-test-suite-secret-key-32").decode()
)

# Dozens of Tessera processes of the suite share one PostgreSQL (100 connections by default):
# each keeps at most 4 connections open (8 when busy), it and the processes it starts.
os.environ.setdefault("TESSERA_DATABASE_POOL_SIZE", "4")

POSTGRES_URL = os.environ.get(
    "TESSERA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TESSERA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = bool(os.environ.get("CI"))
BACKENDS = ["sqlite", "postgresql"]
# Where the tests marked `serial` live: `make test` runs them alone afterwards from this folder
# only (collecting the whole suite again for them cost 15-25 s of CPU).
SERIAL_TESTS = "tests/faults/"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module whose tests share a module-scoped fixture (a stack of processes, a `tessera
    dev`, a Docker host, a registry) is one xdist group: its tests run on one worker, which
    starts that fixture once per parameter. Left to `--dist loadgroup` one test at a time, its
    tests alternate between the workers and each worker starts its own."""
    strays = [
        i.nodeid
        for i in items
        if i.get_closest_marker("serial") and not i.nodeid.startswith(SERIAL_TESTS)
    ]
    if strays:
        raise pytest.UsageError(
            f"tests marked serial must live under {SERIAL_TESTS} (make test runs that folder "
            f"alone for them, and the others never run): {', '.join(strays[:5])}"
        )
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        module_scoped = [
            name
            for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope == "module"
        ]
        if module_scoped:
            item.add_marker(pytest.mark.xdist_group(_module_group(item, module_scoped)))
    if getattr(config.option, "loadgroup", False):  # an xdist worker of `--dist loadgroup`
        for item in items:
            _name_group(item)


def _module_group(item: pytest.Item, module_scoped: list[str]) -> str:
    """The module's group, one per parameter of its parametrized module-scoped fixtures (a
    `tessera dev` on SQLite and one on PostgreSQL): pytest starts such a fixture once per
    parameter anyway, so its halves may run on both workers at once instead of one after the
    other on one (the Job controller's module: two servers of several minutes each)."""
    module = item.nodeid.split("::")[0]
    params = getattr(getattr(item, "callspec", None), "params", {})
    ids = [str(params[name]) for name in sorted(module_scoped) if name in params]
    # no "]" after the "@" xdist reads the group from: it would take the test for ungrouped
    return f"{module}:{'-'.join(ids)}" if ids else module


def _name_group(item: pytest.Item) -> None:
    """The suffix `--dist loadgroup` groups by (`nodeid@group`), where pytest 9 reads a node's
    id: pytest-xdist 3.8 sets `item._nodeid`, which pytest 9 no longer reads (its `nodeid` is
    `str(item._id)`), so without this every xdist_group mark went unheeded."""
    names = sorted(
        {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
    )
    node_id = getattr(item, "_id", None)
    if not names or node_id is None:
        return
    grouped = dataclasses.replace(node_id)
    object.__setattr__(grouped, "_str_cache", f"{node_id}@{'_'.join(names)}")
    item._id = grouped


def unavailable(what: str, why: str) -> None:
    message = f"{what} is not reachable ({why})"
    if IN_CI:
        pytest.fail(f"{message}: CI must run these tests against a real {what}")
    pytest.skip(f"{message}; set CI=1 to make this a failure")


def fresh_postgres_database(template: str | None = None) -> tuple[str, str]:
    """Create an empty database (a copy of `template` if given); returns (url, name)."""
    import psycopg

    admin = make_url(POSTGRES_URL)
    conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"tessera_test_{uuid.uuid4().hex[:12]}"
    copied = f' TEMPLATE "{template}"' if template else ""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copied}')
            # A commit returns before its WAL reaches the disk (0.3-0.8 ms here against 3.7-4.7
            # with the flush): what a test kills is Tessera's processes, never PostgreSQL or
            # the machine, so nothing a test reads back depends on the flush. (A database's
            # settings are not copied from its template: set on each.)
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", str(exc).strip().splitlines()[0])
    return admin.set(database=name).render_as_string(hide_password=False), name


def migrations_digest() -> str:
    """What the migrations are: the schema a template database was migrated to."""
    digest = hashlib.sha256()
    for path in sorted(MIGRATIONS_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(MIGRATIONS_DIR)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def postgres_template() -> str:
    """A migrated database that `fresh_postgres_database(template=...)` copies (CREATE DATABASE
    ... TEMPLATE: a file copy, about 0.4 s, against 2-3 s for the migrations). One per set of
    migrations, named after their digest and kept for the next run; made by whichever worker
    comes first (under another name, then renamed: the rename is atomic) and closed to
    connections, as a template must be while it is copied."""
    import psycopg

    name = f"tessera_template_{migrations_digest()}"
    conninfo = (
        make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    )

    def exists() -> bool:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return found.fetchone() is not None

    try:
        if exists():
            return name
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", str(exc).strip().splitlines()[0])
    url, making = fresh_postgres_database()
    try:
        upgrade(url)
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'ALTER DATABASE "{making}" WITH ALLOW_CONNECTIONS false')
            conn.execute(f'ALTER DATABASE "{making}" RENAME TO "{name}"')
    except psycopg.errors.DuplicateDatabase:
        pass  # another worker's came first: the same migrations
    finally:
        drop_postgres_database(making)
    return name


_templates: dict[str, str] = {}


def migrated_url(backend: str, directory: Path) -> tuple[str, str | None]:
    """A new database on `backend` at the migrations' head: (url, the PostgreSQL database's
    name to drop, or None for a SQLite file in `directory`). Copied from a template migrated
    once (per run on PostgreSQL, per worker for SQLite's file)."""
    if backend == "sqlite":
        if "sqlite" not in _templates:
            made = tempfile.mkdtemp(prefix="tessera-template-")
            atexit.register(shutil.rmtree, made, ignore_errors=True)
            template = Path(made) / "tessera.db"
            upgrade(f"sqlite:///{template}")
            _templates["sqlite"] = str(template)
        path = directory / "tessera.db"
        shutil.copyfile(_templates["sqlite"], path)
        return f"sqlite:///{path}", None
    if "postgresql" not in _templates:
        _templates["postgresql"] = postgres_template()
    return fresh_postgres_database(template=_templates["postgresql"])


def drop_postgres_database(name: str) -> None:
    import psycopg

    conninfo = (
        make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of the backend named by the `backend` parameter (function scope)."""
    backend = request.param if hasattr(request, "param") else "sqlite"
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    url, name = fresh_postgres_database()
    yield url
    drop_postgres_database(name)


@pytest.fixture
def fresh_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new migrated database of the backend named by the `backend` parameter (function
    scope), for a test that needs one to itself."""
    backend = request.param if hasattr(request, "param") else "sqlite"
    url, name = migrated_url(backend, tmp_path)
    yield url
    if name is not None:
        drop_postgres_database(name)


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database, one per backend for the whole session."""
    with migrated_database(request.param, tmp_path_factory) as url:
        yield url


@contextmanager
def migrated_database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A new, migrated database on `backend` ("sqlite" or "postgresql"), dropped afterwards."""
    url, name = migrated_url(backend, tmp_path_factory.mktemp("sqlite"))
    try:
        yield url
    finally:
        if name is not None:
            drop_postgres_database(name)


@pytest.fixture(scope="session")
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    bootstrap(database)
    yield database
    database.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThreadedServer:
    """The real application behind a real uvicorn, in a thread of the test process; over HTTPS
    with `tls` (kubectl sends tokens only over HTTPS)."""

    def __init__(self, settings: Settings, db: Database, tls: TLSFiles | None = None) -> None:
        from app.deps import Services

        self.services = Services.build(settings, db=db)
        self.app = create_app(settings, self.services)
        self.port = free_port()
        self.tls = tls
        certificates = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)} if tls else {}
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            **uvicorn_options(settings),
            **certificates,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def server(db: Database, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        database_url=str(db.url.render_as_string(hide_password=False)),
        auth_cache_seconds=0,
        rate_limit_per_second=0,  # the suite is bursty; tests/test_redis.py checks the limits
        node_rate_limit_per_second=0,
        auth_failures_per_second=0,
        watch_bookmark_seconds=1,
        # Callback deliveries: retried within a fraction of a second (tests/api/test_callbacks.py).
        callback_timeout_seconds=0.5,
        callback_max_attempts=3,
        callback_retry_base_seconds=0.05,
        callback_retry_max_seconds=0.2,
        callback_poll_seconds=0.2,
        callback_allowed_destinations="127.0.0.0/8,::1/128,localhost",  # the test receivers
    )
    with ThreadedServer(settings, db) as running:
        yield running


class Api:
    """An HTTP client for one identity."""

    def __init__(self, base_url: str, token: str, *, tenant: str | None = None) -> None:
        self.token = token
        self.tenant = tenant
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def __getattr__(self, name: str) -> object:
        return getattr(self.http, name)


@pytest.fixture(scope="session")
def admin(server: ThreadedServer) -> Api:
    token = server.services.db.write(lambda s: auth.create_token(s, role="admin")).value
    return Api(server.url, token)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_tenant(server: ThreadedServer, admin: Api):
    """Create a tenant through the admin API; returns an Api acting as that tenant."""

    def make(prefix: str = "t") -> Api:
        name = unique(prefix)
        response = admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}})
        assert response.status_code == 201, response.text
        token = server.services.db.write(
            lambda s: auth.create_token(s, role="tenant", tenant=name)
        ).value
        return Api(server.url, token, tenant=name)

    return make


@pytest.fixture
def make_node_agent(server: ThreadedServer):
    """A node's token (as `tessera token create --node NAME` makes it); returns an Api acting
    as that node's agent."""

    def make(node: str) -> Api:
        token = server.services.db.write(
            lambda s: auth.create_token(s, role="node", node=node)
        ).value
        return Api(server.url, token)

    return make


@pytest.fixture
def tenant(make_tenant) -> Api:
    return make_tenant()


@pytest.fixture(scope="session")
def docker_host() -> str:
    """The DOCKER_HOST of a real Docker engine (tests/engine.py), with the test images built."""
    from tests.engine import ensure_busybox, find_engine

    host, why = find_engine()
    if host is None:
        unavailable("Docker engine", why)
    assert host is not None
    ensure_busybox(host)
    return host


@contextmanager
def statements_touching(engine: Any, *words: str) -> Iterator[list[str]]:
    """The SQL statements `engine` runs meanwhile that name one of `words` (a table: the
    server's own loops on other tables aside), for tests that count a request's queries."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if any(word in statement for word in words):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)
