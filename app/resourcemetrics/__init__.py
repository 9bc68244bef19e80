"""Resource usage as metrics-server serves it (`kubectl top pod`, `kubectl top node`)."""
