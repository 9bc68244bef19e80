"""Tessera bench."""
