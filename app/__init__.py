"""Tessera's API service: HTTP, persistence, tenancy."""

__version__ = "0.1.0"
