"""Limits of the capwatch.v1 Watch request, shared by the server and its clients.

The server refuses requests outside them (INVALID_ARGUMENT); the client
library and ``capwatch watch`` check them first, so a mistake is reported as
a configuration error before anything is sent. Kept apart from the servicer
so a client does not load the server's modules.
"""

from __future__ import annotations

MIN_HEARTBEAT_S = 0.05
MAX_HEARTBEAT_S = 3600.0
MAX_FILTER_UUIDS = 256
MAX_UUID_LENGTH = 128
