"""``capwatch watch`` against an agent that answers but refuses: it says so, not that the
agent could not be reached, and does not retry what retrying cannot change."""

from __future__ import annotations

import argparse
import asyncio
import io

import pytest

from capwatch.watch.command import add_watch_arguments, watch, watch_settings
from tests.server.harness import NODE, ServerHarness


def parsed(*argv: str):
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    return watch_settings(parser.parse_args(argv), {})


@pytest.mark.asyncio
@pytest.mark.parametrize("retry", [[], ["--retry"]], ids=["once", "retry"])
async def test_an_agent_serving_another_node_is_refused_not_unreachable(
    harness: ServerHarness, retry: list[str]
):
    """--node naming another node than the agent serves: exit 1 with one line quoting the
    agent's FAILED_PRECONDITION, without "cannot reach" or "--retry keeps trying" (it was
    reached), and --retry does not keep trying it either."""
    settings = parsed("--target", harness.target, "--node", "nope", *retry)
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(10):
        assert await watch(settings, out=out, err=err) == 1
    said = err.getvalue()
    assert (out.getvalue(), said.count("\n")) == ("", 1), said
    assert said.startswith(f"capwatch watch: {harness.target}: FAILED_PRECONDITION: "), said
    assert f"this agent serves node {NODE!r}, not 'nope'" in said
    assert "cannot reach" not in said
    assert "--retry" not in said
