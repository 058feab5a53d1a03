"""The agent's protocol edge: what the node agent serves, and nothing else.

``grpc`` (its gRPC services and what they send), ``http`` (``/readyz`` and
``/metrics``, requests parsed by httptools), ``metrics`` (its Prometheus metrics),
``settings`` (the edge's flags), ``certificates`` (TLS kept current with its
files) and ``listeners`` (what every capwatch gRPC server binds with, the
controller's too). Imports the agent, the api and the kit; never the client
library, the controller or the commands.
"""
