"""The observer of nothing: what a component reports to when nobody counts.

The controller's writers, recorder and lease each take an observer (the metrics) by
constructor, each through a small Protocol of their own; without one they report to
:data:`UNOBSERVED`, which takes any call of any method and does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class Unobserved:
    """Any observer Protocol: every method, whatever its arguments, does nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)  # copy, pickle and friends ask for dunders
        return _ignore


UNOBSERVED = Unobserved()
