"""capwatch's cluster controller: every node agent's stream, turned into Kubernetes state.

It follows each agent's ``capwatch.v1`` Watch stream (through :mod:`server.client`),
keeps a per-node state machine, writes the Node condition ``GPUPowerCapEnforced`` and
Events as the leader of its shard's Lease, and serves one aggregated cluster stream.
"""
