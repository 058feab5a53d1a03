"""The figures a scenario writes with ``--json FILE`` and the charts drawn from them.

``results``: a results file written whole, its ``source`` line first, refused before a
long run when it cannot be written, and the runs a file keeps across runs; ``plot``
(``python -m bench.figures.plot``, ``make bench-plots``) draws each file of
``bench/results/`` into a PNG of ``bench/plots/``: ``values`` reads the figures,
``style`` is what every chart shares, ``node_charts`` and ``cluster_charts`` draw them.

Imports the shared part and matplotlib (the charts only); never a scenario, a rig or a
floor: a chart reads files, not the code that measured them.
"""
