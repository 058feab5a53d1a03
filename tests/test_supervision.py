"""kit.supervision.ended: which ends of a long-lived task stop the process."""

from __future__ import annotations

import asyncio
import logging

import pytest

from capwatch.kit.supervision import ended

log = logging.getLogger("test.supervision")


async def _finished(body: str) -> asyncio.Task[None]:
    async def run() -> None:
        if body == "raise":
            raise RuntimeError("boom")
        if body == "hang":
            await asyncio.Event().wait()

    task = asyncio.create_task(run(), name="capwatch-test")
    if body == "hang":
        await asyncio.sleep(0)
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return task


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "stopping", "expected", "fatal"),
    [
        ("raise", False, False, True),
        ("return", False, False, True),
        ("return", False, True, False),
        ("raise", False, True, True),
        ("raise", True, False, False),
        ("hang", False, False, False),
    ],
)
async def test_only_an_end_the_owner_did_not_ask_for_is_fatal(
    body: str, stopping: bool, expected: bool, fatal: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception, or a return nobody expected, is logged with the task's name and
    stops the process; a cancel, an end while stopping, and an expected return do not."""
    task = await _finished(body)
    calls: list[str] = []
    ended(task, stopping=stopping, on_fatal=lambda: calls.append("fatal"), log=log,
          expected=lambda: expected)  # fmt: skip
    assert calls == (["fatal"] if fatal else [])
    assert ("task capwatch-test ended unexpectedly" in caplog.text) is fatal
