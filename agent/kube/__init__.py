"""The agent's Kubernetes pod view: list+watch of this node's pods.

``informer`` is the list+watch machinery and when it may be trusted (the
controller's discovery uses it too), ``wire`` the API server's wire format
without the client library, ``podview`` the synced view the cycle reads, and
``client`` the one module that imports the ``kubernetes`` package. Imports the
agent and the kit.
"""
