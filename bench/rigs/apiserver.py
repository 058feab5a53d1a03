"""The fake Kubernetes API server in a process of its own, for the simulated cluster
(bench/rigs/sim_cluster.py).

    python -m bench.rigs.apiserver NODES PREFIX LABEL=VALUE

Creates NODES GPU nodes named like a pool's (PREFIX + number), serves them,
prints ``url <URL>`` when ready, then answers commands on stdin, one per line:
``writes PATH`` dumps every node status write so far as JSON lines (node,
server monotonic time, status, reason, user agent) and prints ``ok``; ``quit``
stops. CLOCK_MONOTONIC is one clock for every process on the machine, so the
times compare with the pools' cycle ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from capwatch.agent.sim.poolspec import node_names
from tests.fakes.kube_apiserver import FakeKubeApiServer


def main() -> int:
    count, prefix, label = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    key, _, value = label.partition("=")
    server = FakeKubeApiServer(history_limit=20_000)
    for name in node_names(count, prefix=prefix):
        server.add_node(name, labels={key: value})
    server.start()
    print(f"url {server.url}", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "writes":
            with Path(argument).open("w", encoding="utf-8") as out:
                for write in server.node_status_writes():
                    condition = write.patch["status"]["conditions"][0]
                    out.write(
                        json.dumps(
                            {
                                "node": write.node,
                                "at": write.at,
                                "status": condition.get("status"),
                                "reason": condition.get("reason"),
                                "user_agent": write.user_agent,
                            }
                        )
                        + "\n"
                    )
            print("ok", flush=True)
        elif command == "quit":
            break
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
