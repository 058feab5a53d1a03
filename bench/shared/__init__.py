"""What every room of the benchmarks uses: this run's metadata (``run``), loopback
addresses (``addresses``), child processes and how they are driven (``children``),
reading a process from /proc and its metrics (``procs``), and the arithmetic the
benches judge by (``stats``).

Imports the standard library and prometheus_client's parser; nothing of capwatch and
no other room of the benchmarks.
"""
