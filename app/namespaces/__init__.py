"""Namespaces: the unit of tenancy. Every namespaced object belongs to its namespace's tenant."""
