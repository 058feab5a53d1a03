"""The runnable benchmarks: ``python -m bench.scenarios.<name> [--json FILE]`` from the
repository root, each documented in its docstring and in bench/README.md.

A scenario sets up its rigs, measures capwatch and its floor in the same run, prints the
figures beside their targets and, with ``--json``, writes them for the charts. Imports
every room below it (rigs, figures, floors, shared), capwatch and the tests' fakes; a
scenario imports another only to run the same measurement (controller and heap run
cluster's, stream runs fanout's, kwok prints as cluster does).
"""
