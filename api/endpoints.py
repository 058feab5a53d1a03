"""Where capwatch's servers listen unless told otherwise, known to both ends.

The agent serves its unix socket (the readiness shim's, in the same pod) and
TCP port 50051 (controllers, ``grpcurl``); a controller serves its cluster
stream on 50052. Clients default to the same places.
"""

from __future__ import annotations

from pathlib import Path

AGENT_SOCKET = Path("/run/capwatch/agent.sock")
AGENT_PORT = 50051
CONTROLLER_PORT = 50052
