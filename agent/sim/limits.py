"""Simulated power limits that outlive the agent, as a real GPU's do.

A real GPU keeps the limit NVML wrote after the agent that wrote it dies; an
in-memory simulator forgets it with the process. For crash trials (``kill -9``
at random instants, then a restarted agent must find and release every cap)
the sim backend can keep its limits in a file instead: every successful write
is on disk, atomically and fsync'd, before the write returns, exactly as the
hardware holds a limit once ``nvmlDeviceSetPowerManagementLimit`` returns.

The file maps GPU UUIDs to milliwatts (JSON). A GPU it does not list is at
its default. Opt-in (``--sim-limits-file``); the demo and tests run without.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from capwatch.agent.durable import read_regular, write_atomically
from capwatch.kit.errors import ConfigError


class PersistentLimits:
    """The file behind the simulated limits; not thread-safe (the world's lock guards it)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> dict[str, int]:
        """The limits a previous process left; {} if none. Raises ConfigError if unreadable."""
        try:
            doc = json.loads(read_regular(self._path))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError("--sim-limits-file", f"cannot read {self._path}: {exc}") from exc
        if not isinstance(doc, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in doc.items()
        ):
            raise ConfigError("--sim-limits-file", f"{self._path}: not a UUID -> milliwatts map")
        return doc

    def save(self, limits: Mapping[str, int]) -> None:
        """Persist every GPU's limit. Raises OSError (the write then did not happen)."""
        write_atomically(self._path, json.dumps(dict(sorted(limits.items()))).encode())
