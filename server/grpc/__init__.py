"""The agent's gRPC services and what they send.

capwatch.v1 ``node_health`` (Watch, GetSnapshot), the DRA resource-health
mirrors (``dra``), grpc ``health``; the shared ``publication`` they read, the
Watch stream's ``cycle_feed`` and ``encoding``, pure protobuf ``mapping``,
``admission`` of subscribers, ``malformed`` requests, the ``nodes`` a request
may name, and ``serving`` (the server itself, in order). Imports the agent, the
api and the kit; the controller never imports this package.
"""
