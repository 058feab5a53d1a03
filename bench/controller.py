"""The controller following 200 node agents: detection latency, its cost per node, its writes.

The same run as bench/cluster.py at the controller issue's size: 200 nodes x 8
GPUs served by 4 ``capwatch pool`` processes (each node is the agent's own
reconciler, hub, Watch stream and DRA mirrors; only the process is shared), one
``capwatch controller`` following all of them through static discovery and
writing to the fake API server in its own process. It prints, beside their
targets: detection latency from the failed cycle's end to the PATCH received
(p50/p99, p99 <= 2 s), controller CPU and RSS per followed node, and API writes
per second in steady state (<= nodes/300 plus transitions).

    PYTHONPATH=. .venv/bin/python bench/controller.py [--nodes 200]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on the path, where bench/controller.py
# would shadow the controller package: look for packages from the repository instead.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import sys

from bench.cluster import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__ or "", nodes=200, fail_at=60.0))
