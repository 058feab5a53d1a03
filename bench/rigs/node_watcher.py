"""A plain Node watcher, as the scheduler and every other controller watching Nodes is.

``python -m bench.rigs.node_watcher URL CA CERT KEY OUT`` watches ``/api/v1/nodes`` (as
the given client certificate) from now on and appends to OUT one JSON line per event that
changed a node's ``GPUPowerCapEnforced`` condition: the node, status, reason,
lastHeartbeatTime, the event's size in bytes and ``time.monotonic()`` when it arrived
(CLOCK_MONOTONIC: one clock for every process on the machine, the pools' included),
each line flushed as it is written.
Every event's bytes are counted, condition or not; on SIGTERM it writes a last line
``{"total_bytes": ..., "events": ...}`` and exits. Re-watches from the last
resourceVersion when the server ends a watch.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

CONDITION = "GPUPowerCapEnforced"


def main(argv: list[str]) -> int:
    url, ca, cert, key, out = argv
    parsed = urllib.parse.urlsplit(url)
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    totals = {"total_bytes": 0, "events": 0}
    stopping = {"now": False}
    sink = Path(out).open("a", encoding="utf-8")  # noqa: SIM115 - held for the process

    def stop(*_: Any) -> None:
        stopping["now"] = True
        sink.write(json.dumps(totals) + "\n")
        sink.flush()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    seen: dict[str, tuple[str, str, str]] = {}
    version = _list(parsed, context, seen)
    print("watching", flush=True)
    while not stopping["now"]:
        connection = http.client.HTTPSConnection(
            parsed.hostname, parsed.port, context=context, timeout=120
        )
        query = urllib.parse.urlencode(
            {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
        )
        connection.request("GET", f"/api/v1/nodes?{query}")
        response = connection.getresponse()
        if response.status != 200:
            time.sleep(1)
            version = _list(parsed, context, seen)
            continue
        for raw in response:
            arrived = time.monotonic()
            totals["total_bytes"] += len(raw)
            totals["events"] += 1
            event = json.loads(raw)
            obj = event.get("object", {})
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if event.get("type") == "ERROR":
                version = _list(parsed, context, seen)
                break
            if event.get("type") not in ("ADDED", "MODIFIED"):
                continue
            name = obj["metadata"]["name"]
            now = _condition(obj)
            if now is not None and seen.get(name) != now:
                seen[name] = now
                record = {
                    "node": name,
                    "status": now[0],
                    "reason": now[1],
                    "heartbeat": now[2],
                    "bytes": len(raw),
                    "at": arrived,
                }
                # Flushed as written: a reader counts what has arrived so far, not what
                # a watch that has yet to end has buffered.
                sink.write(json.dumps(record) + "\n")
                sink.flush()
        connection.close()
    return 0


def _condition(node: dict[str, Any]) -> tuple[str, str, str] | None:
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == CONDITION:
            return (c.get("status", ""), c.get("reason", ""), c.get("lastHeartbeatTime", ""))
    return None


def _list(parsed: urllib.parse.SplitResult, context: ssl.SSLContext, seen: dict[str, Any]) -> str:
    connection = http.client.HTTPSConnection(
        parsed.hostname, parsed.port, context=context, timeout=120
    )
    connection.request("GET", "/api/v1/nodes?resourceVersion=0")
    body = json.loads(connection.getresponse().read())
    connection.close()
    for node in body.get("items", []):
        found = _condition(node)
        if found is not None:
            seen[node["metadata"]["name"]] = found
    return str(body["metadata"]["resourceVersion"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
