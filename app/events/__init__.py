"""Events: what happened to each object (created, spec rounded, scheduled, ...)."""
