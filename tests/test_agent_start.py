"""The agent's start and stop: conditions under which it must not report ready at all,
and the restore of default caps, which nothing may skip."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from capwatch.agent.reports import CycleReport
from capwatch.agent.settings import add_agent_arguments, agent_settings
from capwatch.agent.sim.limits import PersistentLimits
from capwatch.cli import main
from capwatch.launch import run_agent
from capwatch.server.grpc.serving import AgentServer
from capwatch.server.settings import add_server_arguments, server_settings

ZERO_GPUS = "node_name: empty-node\nsafe_default_watts: 300\ngpus: []\n"


def test_a_node_with_zero_gpus_exits_1_with_one_line(tmp_path: Path, capsys):
    """A backend that reports no GPUs stops the agent at start (exit 1, one line naming why)
    instead of reporting ready with nothing to enforce."""
    scenario = tmp_path / "zero.yaml"
    scenario.write_text(ZERO_GPUS)
    code = main(
        [
            "agent",
            "--gpu-backend",
            "sim",
            "--scenario",
            str(scenario),
            "--state-dir",
            str(tmp_path / "state"),
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
        ],
        {},
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "capwatch agent: cannot start: no GPUs: the sim backend reports 0 devices"
    )


def test_caps_are_restored_even_when_the_server_fails_to_stop(tmp_path: Path, monkeypatch):
    """Restoring default caps is in a ``finally``: a gRPC server whose stop raises still
    lets the agent restore every GPU it capped before the error ends the run."""
    limits = tmp_path / "limits.json"
    args = [
        "--gpu-backend",
        "sim",
        "--state-dir",
        str(tmp_path / "state"),
        "--sim-limits-file",
        str(limits),
        "--interval",
        "0.2",
    ]
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    add_server_arguments(parser)
    namespace = parser.parse_args([*args, "--grpc-listen", "127.0.0.1:0", "--metrics-port", "0"])
    settings, edge = agent_settings(namespace, {}), server_settings(namespace, {})

    real_stop = AgentServer.stop

    async def broken_stop(self: AgentServer) -> None:
        await real_stop(self)  # stopped, then the failure: what follows must still run
        raise RuntimeError("server stop failed")

    monkeypatch.setattr(AgentServer, "stop", broken_stop)
    capped: list[dict[str, int]] = []

    async def run() -> None:
        stop = asyncio.Event()

        def on_report(report: CycleReport) -> None:
            if any(r.applied_watts is not None and r.applied_watts < 700 for r in report.gpus):
                capped.append(PersistentLimits(limits).load())
                stop.set()

        await run_agent(settings, edge, on_report=on_report, stop=stop)

    with pytest.raises(RuntimeError, match="server stop failed"):
        asyncio.run(run())
    assert capped
    assert any(mw < 700_000 for mw in capped[0].values())  # caps were set
    assert all(mw == 700_000 for mw in PersistentLimits(limits).load().values())
