"""The operator's commands (the `tessera` CLI) on a fresh data directory (SQLite):
revoking tokens in every form they are shown in, the modes of data and secret files, and the
tenant names that are reserved."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.auth import service as auth
from app.cli import cli
from app.db.engine import Database
from app.errors import Unauthorized
from tests.conftest import BACKENDS, drop_postgres_database, fresh_postgres_database


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def run(place: Place, *args: str, check: bool = True) -> Done:
    """`tessera ARGS` on that data directory and database, in this process (a subprocess would spend two
    seconds a call importing); the CLI reads its settings from the environment either way."""
    result = CliRunner().invoke(
        cli,
        list(args),
        env={"TESSERA_DATA_DIR": str(place.dir), "TESSERA_DATABASE_URL": place.database_url},
    )
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    done = Done(result.exit_code, result.stdout, result.stderr)
    if check:
        assert done.returncode == 0, f"tessera {' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@dataclass
class Place:
    """A data directory and the database the CLI uses with it."""

    dir: Path
    database_url: str


@pytest.fixture(scope="module", params=BACKENDS)
def place(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Place]:
    data = tmp_path_factory.mktemp("ops") / "data"
    data.mkdir(mode=0o755)  # made by someone else, too open
    if request.param == "sqlite":
        yield Place(data, f"sqlite:///{data / 'tessera.db'}")
        return
    url, name = fresh_postgres_database()
    yield Place(data, url)
    drop_postgres_database(name)


@pytest.fixture(scope="module")
def data(place: Place) -> Place:
    run(place, "migrate")
    run(place, "tenant", "create", "acme")
    return place


def authenticates(place: Place, token: str) -> bool:
    db = Database(place.database_url)
    try:
        db.read(lambda s: auth.Authenticator(ttl=0).authenticate(s, token))
        return True
    except Unauthorized:
        return False
    finally:
        db.dispose()


def test_a_token_is_revoked_in_every_form_it_is_shown_in(data: Place) -> None:
    forms = {
        "the whole token": lambda token, key: token,
        "tsr_<key id>": lambda token, key: f"tsr_{key}",
        "as token list prints it": lambda token, key: f"tsr_{key}_…",
        "the bare key id": lambda token, key: key,
    }
    for form, shown in forms.items():
        token = run(data, "token", "create", "--tenant", "acme").stdout.strip()
        key = token.split("_")[1]
        assert authenticates(data, token), form
        listed = run(data, "token", "list", "--tenant", "acme").stdout
        assert f"tsr_{key}_…" in listed and "active" in listed.split(f"tsr_{key}_…")[1][:40]
        revoked = run(data, "token", "revoke", shown(token, key))
        assert revoked.stdout.strip() == "revoked", form
        assert not authenticates(data, token), form
        again = run(data, "token", "revoke", shown(token, key), check=False)
        assert again.returncode != 0 and "already revoked" in again.stderr + again.stdout, form
    live = run(data, "token", "create", "--tenant", "acme").stdout.strip()
    garbage = run(data, "token", "revoke", "tsr_not-a-key", check=False)
    assert garbage.returncode != 0 and "is not a token or key id" in garbage.stderr + garbage.stdout
    unknown = run(data, "token", "revoke", "tsr_0123456789abcdef", check=False)
    assert unknown.returncode != 0 and "not found" in unknown.stderr + unknown.stdout
    assert "already revoked" not in unknown.stderr + unknown.stdout
    assert authenticates(data, live)  # nothing else was touched


def test_data_and_secrets_are_the_owners_alone(data: Place, tmp_path: Path) -> None:
    assert mode(data.dir) == 0o700  # tightened, though it existed with 0755
    if data.database_url.startswith("sqlite"):
        files = [data.dir / name for name in ("tessera.db", "tessera.db-wal", "tessera.db-shm")]
        assert files[0].exists()
        for path in files:
            if path.exists():
                assert mode(path) == 0o600, path
    out = tmp_path / "acme.kubeconfig"
    out.write_text("old")
    out.chmod(0o644)
    run(data, "kubeconfig", "--tenant", "acme", "--out", str(out))
    assert mode(out) == 0o600 and "tsr_" in out.read_text()
    for path in (data.dir / "tls").glob("*.key"):
        assert mode(path) == 0o600, path


@pytest.mark.parametrize(
    "name",
    ["kube", "tessera", "kube-system", "tessera-billing", "kube-x", "default", "admin"],
)
def test_reserved_tenant_names_are_refused(data: Place, name: str) -> None:
    refused = run(data, "tenant", "create", name, check=False)
    assert refused.returncode != 0
    assert "the name is reserved; choose another" in refused.stderr + refused.stdout
    assert name not in run(data, "tenant", "list").stdout.split()


def test_names_that_only_look_reserved_are_allowed(data: Place) -> None:
    run(data, "tenant", "create", "kubeflow")
    run(data, "tenant", "create", "tesseract")
    assert {"kubeflow", "tesseract"} <= set(run(data, "tenant", "list").stdout.split())
