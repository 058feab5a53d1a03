"""The cluster stream: every node of the shard, served as capwatch.v1.ClusterHealthService.

``state`` (the nodes and a sequenced feed of changes), ``mapping`` (pure
protobuf mappers) and ``serving`` (the gRPC server). Imports the controller's
tracking, the api, the kit and the generic server plumbing.
"""
