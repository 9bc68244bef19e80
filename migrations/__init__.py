"""Tessera migrations."""
