"""Access reviews: `kubectl auth can-i` and `kubectl auth whoami`."""
