"""The floors: the bare baselines each scenario measures capwatch against in the same run,
the least that can do the same job on the same stack.

A bare grpc.aio Watch server (the stream's throughput and fan-out floors, the pull
shape's connections) and client (the controller's memory floor), the push shape on both
ends, an ``asyncio`` HTTP handler (the readiness shim's and the HTTP edge's), the
in-memory claims view (the reconcile cycle's). Floors that are a switch on capwatch
itself stay with their scenario (crash.py's no save before a write, events.py's bare dict
increment).

Imports the shared part and, of capwatch, only what a floor must share with it to be
the same job (its wire types, its server options, its views' types); never a rig, a
scenario or the figures.
"""
