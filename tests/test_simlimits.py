"""The sim backend's opt-in persistent limits: a write survives the process, as on hardware."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capwatch.agent.gpus import GpuErrorClass, WriteOutcome
from capwatch.agent.sim.limits import PersistentLimits
from capwatch.agent.sim.scenario import parse_scenario
from capwatch.agent.sim.views import SimGpuBackend
from capwatch.agent.sim.world import SimWorld
from capwatch.cli import main
from capwatch.kit.errors import ConfigError

UUIDS = ("GPU-5e5e5e5e-0000-4000-8000-000000000000", "GPU-5e5e5e5e-0000-4000-8000-000000000001")
SCENARIO = parse_scenario(
    {
        "node_name": "n",
        "safe_default_watts": 250,
        "gpus": [
            {"uuid": u, "min_watts": 100, "max_watts": 400, "default_watts": 300} for u in UUIDS
        ],
    },
    source="test",
)


def test_a_written_limit_is_on_disk_and_outlives_the_world(tmp_path: Path):
    """An OK write is in the file when set_limit returns; a new world (a restarted agent's)
    starts with it, and a restore puts the default back on disk too."""
    limits = PersistentLimits(tmp_path / "limits.json")
    backend = SimGpuBackend(SimWorld(SCENARIO, limits=limits))
    assert backend.set_limit(1, uuid=UUIDS[1], milliwatts=200_000).ok
    assert json.loads(limits.path.read_text()) == {UUIDS[0]: 300_000, UUIDS[1]: 200_000}
    reborn = SimWorld(SCENARIO, limits=PersistentLimits(tmp_path / "limits.json"))
    assert [reborn.limit_milliwatts(i) for i in (0, 1)] == [300_000, 200_000]
    assert SimGpuBackend(reborn).restore_default(1, uuid=UUIDS[1]).ok
    assert json.loads(limits.path.read_text())[UUIDS[1]] == 300_000


def test_a_write_that_cannot_be_persisted_fails_and_changes_nothing(tmp_path: Path):
    """If the limit cannot reach the disk the simulated write fails (as a write the device
    refused): the in-memory limit stays where it was."""
    where = tmp_path / "limits"
    world = SimWorld(SCENARIO, limits=PersistentLimits(where / "limits.json"))
    where.write_text("a file where the directory should be")
    result = SimGpuBackend(world).set_limit(0, uuid=UUIDS[0], milliwatts=200_000)
    assert (result.outcome, result.error_class) == (WriteOutcome.FAILED, GpuErrorClass.UNKNOWN)
    assert world.limit_milliwatts(0) == 300_000


@pytest.mark.parametrize("text", ["{not json", "[]", '{"GPU-x": "300"}', '{"GPU-x": true}'])
def test_an_unreadable_limits_file_is_a_configuration_error(tmp_path: Path, text: str):
    """A limits file that is not a UUID -> milliwatts map stops the start with the flag named."""
    (tmp_path / "limits.json").write_text(text)
    with pytest.raises(ConfigError, match="--sim-limits-file"):
        SimWorld(SCENARIO, limits=PersistentLimits(tmp_path / "limits.json"))


def test_the_flag_is_refused_with_real_gpus(tmp_path: Path, capsys):
    """--sim-limits-file means nothing to the nvml backend: exit 2, one line."""
    code = main(
        [
            "agent",
            "--node-name",
            "n",
            "--state-dir",
            str(tmp_path),
            "--sim-limits-file",
            str(tmp_path / "l.json"),
        ],
        {},
    )
    assert code == 2
    assert "--sim-limits-file: only meaningful with --gpu-backend sim" in capsys.readouterr().err
