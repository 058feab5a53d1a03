"""``capwatch watch`` on a terminal: one table, fitted, coloured, redrawn in place."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from tests.server.harness import ServerHarness, failed, ok
from tests.terminal import (
    RED,
    REDRAW,
    read_until,
    read_until_exit,
    spawn,
    terminal_env,
    visible_lines,
)

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


DIM = re.compile(r"\x1b\[(?:[0-9]+;)*2(?:;[0-9]+)*m")


@pytest.mark.asyncio
async def test_a_lost_stream_greys_the_table_and_its_ages_count_on(harness: ServerHarness):
    """The agent goes away under a watch on a terminal: one short line saying why, and the
    table stays, dimmed, under a heading that says DISCONNECTED and for how long; redrawn
    while nothing arrives, so the time lost and the last good cycle's age count on from
    what was last received, rather than standing still as the live picture's did."""
    harness.publish()
    argv = ["watch", "--target", harness.target, "--heartbeat", "3600"]
    process, master = spawn(
        [sys.executable, "-m", "capwatch.cli", *argv],
        columns=120,
        env={**terminal_env(os.environ), "PYTHONPATH": str(ROOT)},
    )
    try:
        drawn = await asyncio.to_thread(read_until, master, _has_table, 30)
        await harness.server.stop()

        def counted_on(text: str) -> bool:
            lost = [float(x) for x in LOST_FOR.findall("\n".join(visible_lines(text)))]
            return len(set(lost)) >= 3 and max(lost) >= 2

        drawn = await asyncio.to_thread(read_until, master, counted_on, 30, drawn)
    finally:
        process.kill()
        process.wait(timeout=10)
        os.close(master)
    before = visible_lines(drawn[: drawn.index("DISCONNECTED")])
    sent = float(AGE.findall("\n".join(before))[-1])
    notes = [line for line in visible_lines(drawn) if line.startswith("disconnected: ")]
    assert notes, visible_lines(drawn)
    assert all(len(note) <= 60 for note in notes), notes  # short: not grpc's status text
    assert len(set(notes)) == len(notes), notes  # a line per reason, not per retry
    last = drawn[drawn.rindex("DISCONNECTED") :]
    lost_for = float(LOST_FOR.findall("\n".join(visible_lines(last)))[0])
    # Each figure is drawn rounded to 0.1 s: three roundings may lose up to 0.15 s.
    assert float(AGE.findall("\n".join(visible_lines(last)))[0]) >= sent + lost_for - 0.15
    table = last[last.index("OUTCOME") :]
    assert DIM.search(table)
    assert not RED.search(table)
    assert not GREEN.search(last)


DIM = re.compile(r"\x1b\[(?:[0-9]+;)*2(?:;[0-9]+)*m")
GREEN = re.compile(r"\x1b\[(?:[0-9]+;)*32(?:;[0-9]+)*m")
LOST_FOR = re.compile(r"^DISCONNECTED (\d+\.\d)s", re.MULTILINE)
AGE = re.compile(r"last good cycle (\d+\.\d)s ago")


def _has_table(drawn: str) -> bool:
    return any(line.split()[:2] == ["GPU", "OUTCOME"] for line in visible_lines(drawn))
