"""Tessera billing."""
