"""Tessera's node agent: speaks only the public HTTP API, with one node token per node.

`agent.main.run` acts for one or many nodes in one process (`tessera agent --virtual`, like
KWOK): for each, it keeps the node's Lease in kube-node-lease renewed, watches the pods bound
to it and runs them with the virtual runtime (agent/runtime.py).
"""
