"""Small helpers shared by the client tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(condition: Callable[[], object], *, timeout: float = 2.0) -> None:
    """Wait until ``condition()`` holds; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (state owned by the code under test)
            await asyncio.sleep(0.01)
