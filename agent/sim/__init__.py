"""The simulated node: GPUs, pods, processes and DRA claims from a scenario, with faults.

``world`` holds one simulated node, ``views`` are the agent's interfaces over it
(``claims``: its DRA claim view), ``scenario`` (and ``scenario_devices``,
``scenario_claims``, ``yamlsource``) the file format, ``pool``
and ``poolspec`` many simulated nodes on one cycle thread. Used by the demo,
the tests and pool mode. Imports the agent and the kit.
"""
