"""Callbacks: tenants' HTTP endpoints for pod events, signed and delivered from an outbox."""
