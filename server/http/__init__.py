"""HTTP on the event loop: a few fixed paths, ``/readyz``, ``/metrics``.

``serving`` (the HTTP edge, which no client can starve; requests parsed by
httptools), ``readyz`` (the kubelet's probe answer) and ``exposition`` (a Prometheus
registry served). Used by the agent, the shim and the controller. Imports only the
kit, httptools (in ``serving`` alone) and ``prometheus_client``.
"""
