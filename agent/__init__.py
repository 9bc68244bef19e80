"""Tessera's node agent: speaks only the public HTTP API, with one node token per node.

`agent.main.run` acts for one or many nodes in one process (`tessera agent --runtime
docker|virtual`): for each, it keeps the node's Lease in kube-node-lease renewed, watches the
pods bound to it and runs them with its runtime (agent/runtime.py: the interface and the
virtual runtime, like KWOK; agent/docker.py: real containers through a Docker Engine API).
"""
