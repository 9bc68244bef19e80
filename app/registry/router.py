"""HTTP for every kind the registry keeps (app/registry/kinds): the same routes for each."""

from __future__ import annotations

from fastapi import APIRouter

from app.errors import STATUS_RESPONSES
from app.registry.installer import install
from app.registry.kinds import KINDS

router = APIRouter(tags=["registry"], responses=STATUS_RESPONSES)
for _strategy in KINDS:
    install(router, _strategy)
