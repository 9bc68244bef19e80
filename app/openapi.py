"""The OpenAPI document committed as openapi/openapi.json (regenerate: `make openapi`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from app.inventory.schemas import GPUFault
from app.main import create_app
from app.pods.schemas import Binding, DeleteOptions, Eviction, PodLogBatch
from app.settings import Settings


def document() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/openapi.db")
        app = create_app(settings)
        spec = app.openapi()
        app.state.services.db.dispose()
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for model in (Binding, DeleteOptions, Eviction, GPUFault, PodLogBatch):
        extra = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        for name, definition in extra.pop("$defs", {}).items():
            schemas.setdefault(name, definition)
        schemas.setdefault(model.__name__, extra)
    return spec
