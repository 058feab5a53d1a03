"""The ``capwatch`` command line, above every other package.

``agent`` (the node's enforcement loop), ``server`` (the protocol edge) and
``controller`` (the cluster side) never import it; it imports whichever of
them the running subcommand needs, and nothing else.
"""
