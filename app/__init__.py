"""Tessera app."""
