"""``capwatch watch`` on a terminal: one table, fitted, coloured, redrawn in place."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.server.harness import ServerHarness, failed, ok
from tests.terminal import RED, REDRAW, read_until_exit, spawn, terminal_env, visible_lines

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.asyncio
@pytest.mark.parametrize("columns", [80, 120])
async def test_watch_fits_the_terminal_colours_failures_and_redraws(
    harness: ServerHarness, columns: int
):
    """On a terminal of 80 or 120 columns no line is wider than the terminal, a failed
    GPU's outcome is red, and each cycle redraws the table in place instead of printing
    another."""
    harness.publish([ok(0), failed(1), ok(2)])
    process, master = spawn(
        [sys.executable, "-m", "capwatch.cli", "watch", "--target", harness.target, "--count", "3"],
        columns=columns,
        env={**terminal_env(os.environ), "PYTHONPATH": str(ROOT)},
    )
    reading = asyncio.create_task(asyncio.to_thread(read_until_exit, process, master, 30))
    for sent, gpus in ((1, None), (2, [ok(0), failed(1), ok(2)])):
        while harness.publication.messages_sent < sent:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        harness.publish(gpus)
    drawn = await reading
    assert process.returncode == 0, drawn
    lines = visible_lines(drawn)
    assert any(line.startswith("cycle 3") for line in lines), lines
    assert max(len(line) for line in lines) <= columns, [
        line for line in lines if len(line) > columns
    ]
    failing = [chunk for chunk in drawn.split("\n") if "write_failed:no_permission" in chunk]
    assert failing
    assert all(RED.search(chunk) for chunk in failing)
    assert REDRAW in drawn
