"""``capwatch demo``: the whole product on one machine.

``node`` runs an agent on simulated GPUs with the shim and the live table,
``cluster`` a pool, a dry-run controller and every node's condition;
``settings`` are their flags. May import every package, as every command may.
"""
