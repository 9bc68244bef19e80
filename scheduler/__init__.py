"""Tessera scheduler."""
