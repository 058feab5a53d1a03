"""capwatch's cluster controller: every node agent's stream, turned into Kubernetes state.

It follows each agent's ``capwatch.v1`` Watch stream (through the client
library), keeps a per-node state machine (``tracking``, the ``conditions``
rule), writes the Node condition ``GPUPowerCapEnforced`` and Events as the
leader of its shard's Lease (``writes``, ``leasing``, ``sharding``), and serves
one aggregated ``cluster`` stream. ``kube`` is the one module that imports the
``kubernetes`` client; ``running`` is the composition root. Imports the
client, the api, the kit, the generic server plumbing (``server.listeners``,
``server.http``) and the agent's informer; never the agent's services.
"""
