"""capwatch's benchmarks: each prints its figures beside a floor measured in the same run.

Not part of the product: ``capwatch`` never imports ``bench`` (an import-linter
contract), and the wheel does not carry it. The rooms, top to bottom (import-linter's
layers in pyproject.toml; each room's ``__init__`` says what lives there):

- ``scenarios``: the runnable benchmarks, ``python -m bench.scenarios.<name>``;
- ``rigs``: what a scenario sets up and drives (the benches' node, the stream's server
  and client processes, the simulated and the KWOK clusters, the load generator, the
  Node watcher, the heap profiler); ``figures``, beside them: the results files and the
  charts drawn from them;
- ``floors``: the bare baselines the scenarios measure capwatch against;
- ``shared``: what every room uses (run metadata, addresses, child processes, /proc).

Imports capwatch, its tests' fakes and rigs (``tests.``), and third-party libraries;
``results/`` and ``plots/`` hold the committed figures and their charts.
"""
