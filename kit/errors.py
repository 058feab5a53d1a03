"""The agent's own exception hierarchy.

Every error the agent raises on purpose derives from :class:`CapwatchError`, and
is chained (``raise ... from``) to the lower-level cause, so logs keep both.
"""

from __future__ import annotations


class CapwatchError(Exception):
    """Base of every error capwatch raises deliberately."""


class ConfigError(CapwatchError):
    """Invalid configuration: a flag, an environment variable or a file.

    ``option`` names what was wrong (``--interval``, ``scenario: gpus[0].uuid``)
    so the command line can print one line that says what and why.
    """

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


class ScenarioError(ConfigError):
    """A simulation scenario file is invalid; ``option`` is the path to the bad key."""


class BackendUnavailable(CapwatchError):
    """The GPU backend cannot be started at all (library missing, init failed)."""


class PodViewError(CapwatchError):
    """The pod view cannot be used this cycle (not synced, or failed)."""


class OwnershipError(CapwatchError):
    """The ownership record cannot be read or written."""
