"""Watches: the change log, and waking watchers when it grows."""
