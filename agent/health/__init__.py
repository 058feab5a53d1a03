"""A GPU's own health: what it says about itself and the faults judged from that.

``telemetry``: per-cycle readings and asynchronous device events, as both GPU
backends report them; ``faults``: the health model (XID, uncorrected ECC,
row-remap failure, lost GPU). Imports only the kit and ``agent.gpus``.
"""
