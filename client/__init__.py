"""The subscriber library: follow an agent's or a controller's stream, and stay on it.

``node_health`` (an agent's capwatch.v1 Watch or a DRA mirror) and
``cluster_health`` (a controller's cluster stream) over one ``retrying`` loop
and ``shared`` channels, yielding plain ``stream_events``; ``stream_readiness``
is readiness as seen from the far end (the shim's view) and ``connection`` the
flags both the shim and ``capwatch watch`` connect with. Used by the shim, the
terminal UI and the controller. Imports the api and the kit only.
"""
