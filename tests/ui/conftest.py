"""The console in a real browser: Debian's Chromium driven by Playwright, against one `tessera
dev` (what `make run` starts: HTTPS, the scheduler and the virtual node agents inside) shared
by every test of the session."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import IN_CI, free_port
from tests.ui.quiet_network import QuietNetwork
from tests.ui.quiet_network import usable as quiet_network_usable

TESSERA = str(Path(sys.executable).with_name("tessera"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Dev:
    """A running `tessera dev`, with an admin client."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir, self.port = data_dir, port
        self.url = f"https://127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "TESSERA_DATA_DIR": str(data_dir),
            "TESSERA_PORT": str(port),
            "TESSERA_AUTH_CACHE_SECONDS": "0.5",
            "TESSERA_RATE_LIMIT_PER_SECOND": "0",
            "TESSERA_AUTH_FAILURES_PER_SECOND": "0",
        }
        self.env.pop("TESSERA_DATABASE_URL", None)
        self.log = data_dir.parent / "dev.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [TESSERA, "dev"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        ca = data_dir / "tls" / "ca.crt"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            if ca.exists():
                try:
                    verify = ssl.create_default_context(cafile=str(ca))
                    if httpx.get(f"{self.url}/readyz", verify=verify, timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        else:
            raise AssertionError("tessera dev did not become ready: " + self.log.read_text())
        self.verify = ssl.create_default_context(cafile=str(ca))
        config = yaml.safe_load((data_dir / "kubeconfig-admin").read_text())
        self.admin_token = config["users"][0]["user"]["token"]
        self.admin = self.client(self.admin_token)

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=self.verify,
            headers={"Authorization": f"Bearer {token}"},
            timeout=20,
        )

    def tenant(self, prefix: str = "ui") -> tuple[str, str]:
        """A new tenant and a token of its: (name, token)."""
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        answer = self.admin.post("/apis/tessera.io/v1/tenants", json={"metadata": {"name": name}})
        assert answer.status_code == 201, answer.text
        answer = self.admin.post(f"/apis/tessera.io/v1/tenants/{name}/tokens")
        assert answer.status_code == 201, answer.text
        return name, str(answer.json()["token"])

    def revoke(self, token: str) -> None:
        subprocess.run(
            [TESSERA, "token", "revoke", token[: len("tsr_") + 16]],  # tsr_<key id>
            env=self.env,
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="package")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    """One `tessera dev` for the console's tests (one xdist group: they run on one worker, one
    after another), stopped after the last of them: kept for the session, its pool's agents
    took a third of a core from every later test of its worker."""
    server = Dev(tmp_path_factory.mktemp("console") / "data", free_port())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(dev: Dev) -> Iterator[Any]:
    """Chromium, per test module: Playwright's sync API holds an event loop on the main thread
    while it runs, which later tests of the same worker (asyncio.run) must not find. Chromium
    runs in a network namespace of its own where the machine allows one (see
    tests/ui/quiet_network.py: containers starting beside it would abort its requests)."""
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail("Chromium is missing: apt-get install chromium")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    quiet = QuietNetwork(dev.port, CHROMIUM) if quiet_network_usable() else None
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(
                executable_path=str(quiet.launcher) if quiet else CHROMIUM,
                args=["--no-sandbox"],
            )
            yield launched
            launched.close()
    finally:
        if quiet is not None:
            quiet.close()


@pytest.fixture
def context(browser: Any, dev: Dev) -> Iterator[Any]:
    ctx = browser.new_context(base_url=dev.url, ignore_https_errors=True)
    ctx.set_default_timeout(15000)
    yield ctx
    ctx.close()


def login(page: Any, token: str) -> None:
    page.goto("/ui/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/ui/login" not in url)
    page.wait_for_selector("#who:not(:empty)")


def gateway(page: Any, method: str, path: str, body: str | None = None) -> dict[str, Any]:
    """A request from the page's own script, as the console makes them (with the CSRF value)."""
    return dict(
        page.evaluate(
            """async ([method, path, body]) => {
                const s = await (await fetch('/ui/session')).json();
                const r = await fetch('/ui/api' + path, {method, body,
                    headers: {'X-Tessera-CSRF': s.csrf, 'Content-Type': 'application/json'}});
                return {status: r.status, text: await r.text()};
            }""",
            [method, path, body],
        )
    )


def screenshot(page: Any, name: str) -> None:
    """With TESSERA_UI_SCREENSHOTS=DIR, keep a screenshot of the page as DIR/NAME.png (the
    README's pictures are taken so)."""
    folder = os.environ.get("TESSERA_UI_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)
