"""What stops the agent at start: conditions under which it must not report ready at all."""

from __future__ import annotations

from pathlib import Path

from capwatch.cli import main

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
