"""capwatch node agent: the enforcement loop and everything it needs.

Nothing in this package speaks a wire protocol (no gRPC, no protobuf); the
``server`` package builds those at the edge from the domain values here.
"""
