"""HTTP on the event loop: a tiny server for a few fixed paths, ``/readyz``, ``/metrics``.

``tiny`` (no client can starve it), ``readyz`` (the kubelet's probe answer) and
``exposition`` (a Prometheus registry served). Used by the agent, the shim and
the controller. Imports only the kit and ``prometheus_client``.
"""
