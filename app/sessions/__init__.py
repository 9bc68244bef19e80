"""Interactive sessions on pods: `kubectl exec`, `attach` and `port-forward`, relayed to the
agent of the pod's node (see relay.py for how, router.py for the protocols)."""
