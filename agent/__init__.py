"""capwatch node agent: the enforcement loop and everything it needs.

At the top, the loop itself: ``reconciling`` (one cycle), ``running`` (the
cycle thread), ``hub`` (where it publishes), ``lifecycle`` and ``assembly``
(start and stop in order), ``reports`` (what a cycle did), ``capping``,
``attribution``, ``ownership`` and the interfaces its backends implement
(``gpus``, ``pods``). The backends are subpackages: ``nvml``, ``sim``,
``kube``; a GPU's own health is ``health``. Nothing in this package speaks a
wire protocol (no gRPC, no protobuf): the ``server`` package builds those at
the edge. Imports only the kit.
"""
