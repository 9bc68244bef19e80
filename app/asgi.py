"""ASGI entry point for `uvicorn app.asgi:app` (settings come from TESSERA_* variables)."""

from app.main import create_app

app = create_app()
