"""Every async test here runs on a virtual-time loop (``tests/controller/virtual_time.py``)
unless it asks for a real one with ``@pytest.mark.asyncio(loop_factories=["real"])``
(the discovery tests, whose informers run on threads)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tests.controller.virtual_time import VirtualTimeLoop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    marker = item.get_closest_marker("asyncio")
    chosen: Any = None if marker is None else marker.kwargs.get("loop_factories")
    if chosen:
        return {"virtual": VirtualTimeLoop, "real": asyncio.new_event_loop}
    return {"virtual": VirtualTimeLoop}
