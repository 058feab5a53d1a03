"""``capwatch probe``: every read the agent makes, answered by the real pynvml over the fake
library, in process and as the command (agent/nvml/probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.agent.nvml.probe import probe
from tests.fakenvml.control import FakeConfig, FakeDevice, FakeNvml, QueuedEvent

pytestmark = pytest.mark.nvml

SW_POWER_CAP = 0x4
CAPWATCH = [sys.executable, "-m", "capwatch.cli"]


def test_each_read_is_its_value_not_available_or_failed(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """Values come across as read; a read the device does not support says "not available",
    one that errs otherwise says "failed"; retired pages only on a part without remapping."""
    fake_nvml.set_power_draw(0, 251_000)
    fake_nvml.set_clocks_event_reasons(0, SW_POWER_CAP)
    fake_nvml.inject("nvmlDeviceGetTotalEccErrors", 1, "NVML_ERROR_NOT_SUPPORTED")
    fake_nvml.inject("nvmlDeviceGetPowerUsage", 1, "NVML_ERROR_UNKNOWN")
    fake_nvml.set_older_part(1, older_part=True, retired_pending=True)
    result = probe(nvml_backend, events_for_s=0)
    assert result["device_count"] == 2
    first, second = (gpu["readings"] for gpu in result["gpus"])
    assert first["power_draw_milliwatts"] == 251_000
    assert first["throttle_reasons"] == ["sw_power_cap"]
    assert (first["row_remap_failure"], "retired_pages_pending" in first) == (False, False)
    assert second["ecc_uncorrected_volatile"] == "not available"
    assert second["power_draw_milliwatts"] == "failed"
    assert (second["row_remap_pending"], second["retired_pages_pending"]) == (
        "not available",
        True,
    )
    assert result["gpus"][0]["constraints_milliwatts"]["max_milliwatts"] == 400_000


def test_events_that_arrive_while_listening_are_reported(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """An XID queued in the library reaches the probe's listening window, aggregated."""
    fake_nvml.queue_xid(1, 79, count=3)
    result = probe(nvml_backend, events_for_s=0.5)
    assert [(e["kind"], e["code"], e["index"], e["count"]) for e in result["events"]] == [
        ("xid", 79, 1, 3)
    ]


def test_a_lost_gpu_is_reported_not_fatal(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A GPU answering GPU_IS_LOST shows as failed reads and lost; the others are probed."""
    fake_nvml.set_lost(0)
    result = probe(nvml_backend, events_for_s=0)
    lost, other = result["gpus"]
    assert lost["uuid"] == "failed: gpu_is_lost"
    assert lost["readings"]["lost"] is True
    assert isinstance(other["readings"]["power_draw_milliwatts"], int)


def _command(tmp_path: Path, config: FakeConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPWATCH_")}
    env["FAKE_NVML_CONFIG"] = str(config.write(tmp_path / "fake-nvml.conf"))
    return subprocess.run(
        [*CAPWATCH, "probe", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_prints_json_a_node_can_keep(tmp_path: Path, fake_nvml_library: Path) -> None:
    """`capwatch probe --json` prints one JSON document with every GPU and the events."""
    config = FakeConfig(
        devices=(FakeDevice(uuid="GPU-probe-0", power_draw_milliwatts=99_000),),
        events=(QueuedEvent(index=0, data=48),),
    )
    done = _command(tmp_path, config, "--json", "--events-for", "0.5")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["gpus"][0]["uuid"] == "GPU-probe-0"
    assert result["gpus"][0]["readings"]["power_draw_milliwatts"] == 99_000
    assert [e["code"] for e in result["events"]] == [48]


def test_no_nvml_is_exit_1_with_one_line(tmp_path: Path, fake_nvml_library: Path) -> None:
    """When NVML cannot start, the probe says so in one line and exits 1, the NVML code
    once."""
    done = _command(
        tmp_path, FakeConfig(init_error="NVML_ERROR_DRIVER_NOT_LOADED"), "--events-for", "0"
    )
    assert done.returncode == 1
    assert done.stderr == (
        "capwatch probe: cannot start: NVML initialisation failed: "
        "error_class=driver_not_loaded Driver Not Loaded (code=9)\n"
    )


def test_the_command_prints_plain_text_by_default(tmp_path: Path, fake_nvml_library: Path) -> None:
    """Without --json: the power limits as "min .. mW, max .. mW, default .. mW" and each
    reading plainly, no Python dict, list or True/False."""
    config = FakeConfig(devices=(FakeDevice(uuid="GPU-probe-0", power_draw_milliwatts=99_000),))
    done = _command(tmp_path, config, "--events-for", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "GPUs: 1",
        "GPU 0  GPU-probe-0",
        "  power limits: min 100000 mW, max 400000 mW, default 300000 mW",
        "  compute processes: 0",
    ]
    assert "  power_draw_milliwatts: 99000" in lines
    assert "  throttle_reasons: none" in lines
    assert "  lost: false" in lines
    assert not any(mark in done.stdout for mark in ("{", "[", "True", "False")), done.stdout


@pytest.mark.parametrize("value", ["-1", "soon", "7200"])
def test_bad_listening_time_is_exit_2_with_one_line(tmp_path: Path, value: str) -> None:
    """--events-for takes 0 to 3600 seconds; anything else is one line, exit 2."""
    done = _command(tmp_path, FakeConfig(), "--events-for", value)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--events-for:" in done.stderr
