"""The web console in Chromium: the pool heatmap of 100,000 GPUs, and a pod list of 10,000 pods.

Starts the real application (uvicorn, SQLite in a fresh folder) and Debian's Chromium (driven by
Playwright), logs in through the console's own login page and measures:

- heatmap: the console's own heatmap code (app/ui/static/heatmap.js) laying out and drawing
  `--gpus` GPUs (8 per node, 2 NVLink domains per node, 16 nodes per rack, 4 zones, random
  allocation, 0.5 % faulty, 1 % of nodes cordoned), generated in the page; the median of 5
  draws. (Listing that many GPUs through the API is not part of the figure.)
- pods: `--pods` pods created through the API in one tenant's namespace (no scheduler: they stay
  Pending); the time from opening /ui/pods to the first page of 500 rows, to every pod listed
  (pages of 500 read through the gateway), a page turn, and how soon pods created through the
  API while the list is open appear in it (the watch), with the page's longest main-thread
  stall over that time (between two animation frames: on a busy machine this includes time
  the browser was not scheduled at all) and the longest redraw of the list.

    tessera bench console --gpus 100000 --pods 10000
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

HEATMAP_RUN = """async (count) => {
  const { layoutPool, drawHeatmap } = await import('/ui/static/heatmap.js');
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const cells = [];
  for (let i = 0; i < count; i++) {
    const node = Math.floor(i / 8), rack = Math.floor(node / 16);
    cells.push({ name: `gpu-${i}`, node: `node-${String(node).padStart(6, '0')}`, index: i % 8,
      zone: `zone-${rack % 4}`, rack: `rack-${String(rack).padStart(5, '0')}`,
      domain: `nvl-${node}-${(i % 8) < 4 ? 0 : 1}`, model: 'H100', memory: '80Gi',
      vram: random(), sm: random(), faulty: random() < 0.005, cordoned: node % 100 === 7,
      pods: [], allocated: {} });
  }
  const canvas = document.createElement('canvas');
  document.getElementById('main').replaceChildren(canvas);
  const times = [];
  for (let run = 0; run < 5; run++) {
    const started = performance.now();
    const layout = layoutPool(cells.slice(), 1400);
    drawHeatmap(canvas, layout);
    canvas.getContext('2d').getImageData(0, 0, 1, 1);  // the draw has landed
    times.push(performance.now() - started);
  }
  return { times, width: canvas.width, height: canvas.height };
}"""

STALL_PROBE = """() => {
  window.__stall = 0;
  let last = performance.now();
  const tick = () => { const now = performance.now(); window.__stall = Math.max(window.__stall,
    now - last); last = now; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""


class _Server:
    def __init__(self, folder: Path) -> None:
        import uvicorn

        from app.bootstrap import bootstrap
        from app.db.engine import Database
        from app.db.migrate import upgrade
        from app.deps import Services
        from app.main import create_app
        from app.settings import Settings

        url = f"sqlite:///{folder}/tessera.db"
        upgrade(url)
        self.db = Database(url)
        bootstrap(self.db)
        settings = Settings(
            data_dir=folder,
            database_url=url,
            rate_limit_per_second=0,
            auth_failures_per_second=0,
            callback_delivery=False,
        )
        self.services = Services.build(settings, db=self.db)
        app = create_app(settings, self.services)
        from bench.api_create import _free_port

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def _tenant(server: _Server) -> tuple[str, str]:
    from app.auth import service as auth

    name = "bench"
    server.db.write(lambda s: auth.create_tenant(s, name=name))
    token = server.db.write(lambda s: auth.create_token(s, role="tenant", tenant=name)).value
    return name, token


async def _create(url: str, token: str, namespace: str, names: list[str]) -> None:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=60
    ) as client:
        queue = list(names)

        async def worker() -> None:
            while queue:
                name = queue.pop()
                manifest = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "labels": {"app": "bench"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                            }
                        ]
                    },
                }
                answer = await client.post(f"/api/v1/namespaces/{namespace}/pods", json=manifest)
                answer.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(16)))


def main(
    gpus: Annotated[int, typer.Option(min=1, max=1_000_000, help="GPUs in the heatmap.")] = 100_000,
    pods: Annotated[int, typer.Option(min=501, max=50_000, help="Pods in the list.")] = 10_000,
    streamed: Annotated[
        int, typer.Option(min=1, max=2000, help="Pods created while the list is open.")
    ] = 200,
    chromium: Annotated[str, typer.Option(help="The Chromium to drive.")] = "/usr/bin/chromium",
    out: Annotated[Path | None, typer.Option(help="Write the figures here (JSON).")] = None,
    screenshot: Annotated[
        Path | None, typer.Option(help="Keep a PNG of the heatmap's top here.")
    ] = None,
) -> None:
    """Heatmap draw time and pod-list paging in a real browser."""
    if not Path(chromium).exists():
        raise typer.BadParameter(f"{chromium} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="tessera-bench-console-"))
    server = _Server(folder)
    result: dict[str, Any] = {"gpus": gpus, "pods": pods}
    try:
        namespace, token = _tenant(server)
        started = time.perf_counter()
        asyncio.run(_create(server.url, token, namespace, [f"p{i:05d}" for i in range(pods)]))
        result["create_seconds"] = round(time.perf_counter() - started, 1)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(base_url=server.url, viewport={"width": 1440, "height": 900})
            page.set_default_timeout(120_000)
            page.goto("/ui/login")
            page.fill("#token", token)
            page.click("button[type=submit]")
            page.wait_for_url("**/ui/pods")

            heat = page.evaluate(HEATMAP_RUN, gpus)
            result["heatmap_ms"] = round(statistics.median(heat["times"]), 1)
            result["heatmap_ms_runs"] = [round(t, 1) for t in heat["times"]]
            result["heatmap_canvas"] = f"{heat['width']}x{heat['height']}"
            if screenshot is not None:
                page.set_viewport_size({"width": 1440, "height": 600})
                page.screenshot(path=str(screenshot))
                page.set_viewport_size({"width": 1440, "height": 900})

            opened = time.perf_counter()
            page.goto("/ui/pods")
            page.wait_for_selector("#pod-rows tr")
            result["first_page_ms"] = round((time.perf_counter() - opened) * 1000)
            page.wait_for_function(
                f"() => document.getElementById('pod-count').textContent === '{pods} pods'"
            )
            result["all_listed_ms"] = round((time.perf_counter() - opened) * 1000)
            result["rows_shown"] = page.locator("#pod-rows tr").count()
            turned = time.perf_counter()
            page.click("#pod-next")
            page.wait_for_function(
                "() => document.getElementById('pod-page').textContent.startsWith('page 2')"
            )
            result["page_turn_ms"] = round((time.perf_counter() - turned) * 1000)

            page.evaluate(STALL_PROBE)
            sent = time.perf_counter()
            names = [f"s{i:05d}" for i in range(streamed)]
            # In a thread: Playwright's own event loop runs in this one.
            creator = threading.Thread(
                target=asyncio.run, args=(_create(server.url, token, namespace, names),)
            )
            creator.start()
            creator.join()
            page.wait_for_function(
                f"() => document.getElementById('pod-count').textContent === '{pods + streamed} pods'"
            )
            result["streamed"] = streamed
            result["streamed_all_shown_ms"] = round((time.perf_counter() - sent) * 1000)
            result["longest_stall_ms"] = round(page.evaluate("window.__stall"), 1)
            result["longest_render_ms"] = float(
                page.get_attribute("#pod-rows", "data-longest-render-ms") or 0
            )
            browser.close()
    finally:
        server.stop()
        server.db.dispose()
        shutil.rmtree(folder, ignore_errors=True)
    text = json.dumps(result, indent=2)
    typer.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
