"""The controller following 200 node agents: detection latency, its cost per node, its writes.

The same run as bench/scenarios/cluster.py at the controller issue's size: 200 nodes x 8
GPUs served by 4 ``capwatch pool`` processes (each node is the agent's own
reconciler, hub, Watch stream and DRA mirrors; only the process is shared), one
``capwatch controller`` following all of them through static discovery and
writing to the fake API server in its own process. It prints, beside their
targets: detection latency from the failed cycle's end to the PATCH received
(p50/p99, p99 <= 2 s), controller CPU and RSS per followed node, and API writes
per second in steady state (<= nodes/300 plus transitions).

    .venv/bin/python -m bench.scenarios.controller [--nodes 200]
"""

from __future__ import annotations

import sys

from bench.scenarios.cluster import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__ or "", nodes=200, fail_at=60.0))
