"""The web console at `/ui` and the self-hosted `/docs` (see app/ui/router.py and
app/ui/gateway.py)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from app.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    """Mount the console on `app`. Call it after every other middleware is added: its gateway
    must be the outermost layer, so a forwarded request passes through all of the API's."""
    from app.ui.gateway import Console
    from app.ui.router import STATIC, router
    from app.ui.session import Sealer

    sealer = Sealer.from_data_dir(settings.data_dir)
    app.state.console_sealer = sealer
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="console_static")
    app.add_middleware(Console, sealer=sealer)
