"""Tenants, API tokens and the caller's identity."""
