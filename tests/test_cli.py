"""The ``capwatch`` command line: configuration errors, the demo, and SIGTERM handling."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capwatch.agent.capping import Mode, UnclaimedPolicy
from capwatch.agent.settings import add_agent_arguments, agent_settings
from capwatch.cli import main

CAPWATCH = [sys.executable, "-m", "capwatch.cli"]


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--interval", "0"], {}, "--interval: must be a positive number"),
        (["--interval", "soon"], {}, "--interval: not a number"),
        (
            [],
            {"CAPWATCH_INTERVAL": "-3"},
            "--interval (from $CAPWATCH_INTERVAL): must be a positive",
        ),
        (["--interval", "nan"], {}, "--interval: must be a positive number"),
        (["--interval", "7200"], {}, "--interval: must be at most 3600"),
        (["--safe-default-watts", "300W"], {}, "--safe-default-watts: must be a positive integer"),
        (["--safe-default-watts", "0"], {}, "--safe-default-watts: must be between 1 and"),
        (["--cap-ceiling-watts", "500W"], {}, "--cap-ceiling-watts: must be a positive integer"),
        (
            [],
            {"CAPWATCH_CAP_FLOOR_WATTS": "0"},
            "--cap-floor-watts (from $CAPWATCH_CAP_FLOOR_WATTS): must be between 1 and",
        ),
        (
            ["--cap-floor-watts", "400", "--cap-ceiling-watts", "300"],
            {},
            "--cap-floor-watts: 400 W is above --cap-ceiling-watts 300 W",
        ),
        (["--gpu-backend", "dcgm"], {}, "--gpu-backend: must be one of nvml, sim"),
        (["--mode", "dry-run"], {}, "--mode: must be one of enforce, observe, got 'dry-run'"),
        (
            [],
            {"CAPWATCH_UNCLAIMED_POLICY": "ignore"},
            "--unclaimed-policy (from $CAPWATCH_UNCLAIMED_POLICY): must be one of safeDefault, "
            "leave",
        ),
        (["--release", "GPU_Caps"], {}, "--release: not a release name"),
        (
            [],
            {"CAPWATCH_RELEASE": "x" * 54},
            "--release (from $CAPWATCH_RELEASE): not a release name (a DNS label of 53 at most)",
        ),
        (["--agent-pod-name", "Agent_1"], {}, "--agent-pod-name: not a valid pod name"),
        ([], {"POD_NAME": "capwatch-x1"}, "--agent-pod-name: needs --agent-pod-namespace too"),
        ([], {"POD_NAMESPACE": "capwatch"}, "--agent-pod-namespace: needs --agent-pod-name too"),
        (["--annotation-key", "bad key"], {}, "--annotation-key: not a valid annotation key"),
        (["--annotation-key", "Bad_Prefix/x"], {}, "--annotation-key: prefix of"),
        (["--node-name", "Node_1"], {}, "--node-name: not a valid Kubernetes node name"),
        ([], {}, "--node-name: required with the nvml backend"),
        (["--gpu-backend", "sim", "--scenario", "/nonexistent.yaml"], {}, "--scenario:"),
        (["--node-name", "n1", "--scenario", "x.yaml"], {}, "--scenario: only meaningful"),
        # Not "--node-name: required": the scenario says the simulator was meant.
        (["--scenario", "x.yaml"], {}, "--scenario: only meaningful with --gpu-backend sim"),
        (["--log-level", "loud"], {}, "--log-level: must be one of"),
        (["--pod-namespace", "GPU_Jobs"], {}, "--pod-namespace: not a valid namespace name"),
        (["--pod-events", "maybe"], {}, "--pod-events: must be true or false, got 'maybe'"),
        (
            [],
            {"CAPWATCH_POD_EVENTS": "2"},
            "--pod-events (from $CAPWATCH_POD_EVENTS): must be true or false",
        ),
        (["--pod-silence-bound", "2"], {}, "--pod-silence-bound: must be between 5 and 3600"),
        (
            [],
            {"CAPWATCH_POD_SILENCE_BOUND": "soon"},
            "--pod-silence-bound (from $CAPWATCH_POD_SILENCE_BOUND): not a number",
        ),
        (["--xid-ignore", "13,31,x"], {}, "--xid-ignore: 'x' is not an XID number"),
        (["--xid-ignore", "13;31"], {}, "--xid-ignore: '13;31' is not an XID number"),
        (["--xid-fatal", "all"], {}, "--xid-fatal: 'all' is not an XID number"),
        (
            [],
            {"CAPWATCH_XID_FATAL": "79,-1"},
            "--xid-fatal (from $CAPWATCH_XID_FATAL): '-1' is not an XID number",
        ),
        (["--fault-recovery", "0.5"], {}, "--fault-recovery: must be between 1 and 604800"),
        (["--fault-recovery", "soon"], {}, "--fault-recovery: not a number"),
        (
            ["--gpu-backend", "sim", "--state-dir", "/proc/capwatch"],
            {},
            "--state-dir: cannot create",
        ),
        (
            ["--node-name", "n1", "--dra-sim-driver", "true"],
            {},
            "--dra-sim-driver: only meaningful with --gpu-backend sim: real GPUs are prepared",
        ),
        (
            ["--gpu-backend", "sim"],
            {"CAPWATCH_DRA_SIM_DRIVER": "2"},
            "--dra-sim-driver (from $CAPWATCH_DRA_SIM_DRIVER): must be true or false",
        ),
        (
            ["--gpu-backend", "sim", "--kubelet-dir", "var/lib/kubelet"],
            {},
            "--kubelet-dir: must be an absolute path, got 'var/lib/kubelet'",
        ),
        (
            ["--gpu-backend", "sim", "--dra-sim-driver", "true", "--kubelet-dir", "/nonexistent"],
            {},
            "--kubelet-dir: /nonexistent is not a directory (the sim driver registers there)",
        ),
    ],
)
def test_invalid_configuration_exits_2_with_one_line(
    argv: list[str], env: dict[str, str], expected: str, capsys, tmp_path: Path
):
    """Every bad flag or environment twin exits 2 with one line naming it and the reason."""
    if "--state-dir" not in argv:
        argv = [*argv, "--state-dir", str(tmp_path / "state")]
    assert main(["agent", *argv], env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("capwatch agent: error: ")
    assert expected in err


def test_pod_silence_bound_defaults_to_30_seconds_and_has_an_env_twin(tmp_path: Path):
    """--pod-silence-bound is 30 s unless set; $CAPWATCH_POD_SILENCE_BOUND sets it, and
    the flag wins over its twin."""
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    base = ["--gpu-backend", "sim", "--state-dir", str(tmp_path / "state")]
    env = {"CAPWATCH_POD_SILENCE_BOUND": "12.5"}
    assert agent_settings(parser.parse_args(base), {}).pod_silence_bound_s == 30.0
    assert agent_settings(parser.parse_args(base), env).pod_silence_bound_s == 12.5
    flagged = parser.parse_args([*base, "--pod-silence-bound", "45"])
    assert agent_settings(flagged, env).pod_silence_bound_s == 45.0


def test_cap_bounds_are_off_unless_set_by_flag_or_twin(tmp_path: Path):
    """No floor and no ceiling unless set; each has an environment twin, the flag wins,
    and an empty value is none."""
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    base = ["--gpu-backend", "sim", "--state-dir", str(tmp_path / "state")]
    plain = agent_settings(parser.parse_args(base), {})
    assert (plain.cap_floor_watts, plain.cap_ceiling_watts) == (None, None)
    env = {"CAPWATCH_CAP_CEILING_WATTS": "450", "CAPWATCH_CAP_FLOOR_WATTS": "150"}
    twins = agent_settings(parser.parse_args(base), env)
    assert (twins.cap_floor_watts, twins.cap_ceiling_watts) == (150, 450)
    flagged = parser.parse_args([*base, "--cap-ceiling-watts", "500", "--cap-floor-watts", ""])
    both = agent_settings(flagged, env)
    assert (both.cap_floor_watts, both.cap_ceiling_watts) == (None, 500)


def test_mode_unclaimed_policy_and_own_pod_defaults_and_twins(tmp_path: Path):
    """enforce, safeDefault and release capwatch unless set, each with its twin and the
    flag winning (case as the chart writes it or not); the agent's own pod from the
    downward API's twins."""
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    base = ["--gpu-backend", "sim", "--state-dir", str(tmp_path / "state")]
    plain = agent_settings(parser.parse_args(base), {})
    assert (plain.mode, plain.unclaimed_policy) == (Mode.ENFORCE, UnclaimedPolicy.SAFE_DEFAULT)
    assert (plain.agent_pod_namespace, plain.agent_pod_name) == (None, None)
    assert plain.release == "capwatch"
    env = {
        "CAPWATCH_MODE": "observe",
        "CAPWATCH_UNCLAIMED_POLICY": "LEAVE",
        "POD_NAME": "capwatch-x1",
        "POD_NAMESPACE": "capwatch",
    }
    twins = agent_settings(parser.parse_args(base), {**env, "CAPWATCH_RELEASE": "gpu-caps"})
    assert (twins.mode, twins.unclaimed_policy) == (Mode.OBSERVE, UnclaimedPolicy.LEAVE)
    assert twins.release == "gpu-caps"
    assert (twins.agent_pod_namespace, twins.agent_pod_name) == ("capwatch", "capwatch-x1")
    flagged = agent_settings(
        parser.parse_args([*base, "--mode", "enforce", "--unclaimed-policy", "safeDefault"]), env
    )
    assert (flagged.mode, flagged.unclaimed_policy) == (Mode.ENFORCE, UnclaimedPolicy.SAFE_DEFAULT)


def test_device_health_flags_default_to_the_device_plugins_xids_and_ten_minutes(tmp_path: Path):
    """XIDs 13, 31, 43, 45, 68 and 109 are ignored and faults recover after 600 s unless
    set; the flags and their twins replace the lists, and 'all' ignores every XID."""
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    base = ["--gpu-backend", "sim", "--state-dir", str(tmp_path / "state")]
    default = agent_settings(parser.parse_args(base), {})
    assert default.xid_policy.ignore == frozenset({13, 31, 43, 45, 68, 109})
    assert (default.xid_policy.fatal, default.xid_policy.ignore_all) == (frozenset(), False)
    assert default.fault_recovery_s == 600.0
    env = {
        "CAPWATCH_XID_IGNORE": "all",
        "CAPWATCH_XID_FATAL": "13",
        "CAPWATCH_FAULT_RECOVERY": "30",
    }
    custom = agent_settings(parser.parse_args(base), env)
    assert (custom.xid_policy.ignore_all, custom.xid_policy.fatal) == (True, frozenset({13}))
    assert custom.fault_recovery_s == 30.0
    flagged = agent_settings(parser.parse_args([*base, "--xid-ignore", ""]), env)
    assert (flagged.xid_policy.ignore, flagged.xid_policy.ignore_all) == (frozenset(), False)


def test_unknown_flag_is_one_line_too(capsys):
    """argparse's own errors are one line as well, exit 2, prefixed by the subcommand
    whose flags they are not."""
    with pytest.raises(SystemExit) as exc:
        main(["agent", "--intervall", "3"], {})
    assert exc.value.code == 2
    assert (
        capsys.readouterr().err == "capwatch agent: error: unrecognized arguments: --intervall 3\n"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--bogus", "--worse"], "unrecognized arguments: --bogus --worse"),
        ([], "a command is required: one of agent, demo, watch, shim, forget, controller, "),
    ],
    ids=["unknown-flag", "two-unknown-flags", "nothing"],
)
def test_no_command_names_the_flag_it_did_not_know(argv: list[str], expected: str, capsys):
    """Without a command, a flag nobody knows is named (not just "command is required");
    with nothing at all, the line lists the commands. Exit 2, one line."""
    with pytest.raises(SystemExit) as exc:
        main(argv, {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"capwatch: error: {expected}"), err


def test_version_prints_the_installed_packages_version(capsys):
    """`capwatch --version` prints the version pyproject.toml gives the package, exit 0."""
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    version = next(
        line.split('"')[1] for line in pyproject.splitlines() if line.startswith("version = ")
    )
    with pytest.raises(SystemExit) as exc:
        main(["--version"], {})
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"capwatch {version}\n"


LOG_LEVEL_ARGV = {
    "agent": ["--gpu-backend", "sim"],
    "demo": [],
    "shim": [],
    "watch": [],
    "forget": ["GPU-0"],
}


@pytest.mark.parametrize("command", sorted(LOG_LEVEL_ARGV))
def test_every_subcommand_takes_log_level_and_its_twin(command: str, capsys, tmp_path: Path):
    """--log-level (twin CAPWATCH_LOG_LEVEL) is validated by every subcommand: a bad
    value exits 2 with one line naming it."""
    argv = [command, *LOG_LEVEL_ARGV[command]]
    if command in ("agent", "forget"):
        argv[1:1] = ["--state-dir", str(tmp_path)]
    assert main([*argv, "--log-level", "loud"], {}) == 2
    err = capsys.readouterr().err
    assert err == (
        f"capwatch {command}: error: --log-level: must be one of debug, info, warning, "
        "error, got 'loud'\n"
    )
    assert main(argv, {"CAPWATCH_LOG_LEVEL": "chatty"}) == 2
    assert "--log-level (from $CAPWATCH_LOG_LEVEL): must be one of" in capsys.readouterr().err


def test_the_shim_loads_none_of_the_agents_modules():
    """`capwatch shim` imports its own modules only: no agent loop, simulator, Kubernetes
    client, YAML or Prometheus client in the readiness container's memory."""
    probe = (
        "import sys; from capwatch import cli; "
        "cli._parser('shim').parse_args(['shim', '--target', 'unix:///run/x.sock']); "
        "from capwatch.shim import main_shim; "  # what cli._run imports for the shim
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(done.stdout.split())
    assert "capwatch.shim" in loaded
    heavy = {
        "capwatch.launch",
        "capwatch.server.grpc.serving",
        "capwatch.server.grpc.node_health",
        "capwatch.server.metrics.cycle_metrics",
        "capwatch.agent.reconciling",
        "capwatch.agent.sim.world",
        "capwatch.agent.kube.pod_requests",
        "kubernetes",
        "yaml",
        "prometheus_client",
        "rich",
        "capwatch.watch.screen",
        "capwatch.watch.printer",
    }
    assert loaded & heavy == set()


def test_help_lists_every_command_without_loading_them():
    """`capwatch --help` names every subcommand and imports none of their modules."""
    probe = (
        "import sys; from capwatch import cli; "
        "sys.exit(cli.main(['--help']) if 'capwatch.shim' not in sys.modules else 3)"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for command in ("agent", "demo", "watch", "shim", "forget"):
        assert command in done.stdout
    imported = done.stderr  # -X importtime lists every module imported, on stderr
    for module in ("capwatch.shim", "capwatch.watch.command", "capwatch.launch", "agent.settings"):
        assert f" {module}\n" not in imported, module


def test_invalid_scenario_names_the_bad_key(tmp_path: Path, capsys):
    """A scenario with a bad key fails start-up with exit 2, one line with the key's path
    and where it is in the file."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("node_name: n\nsafe_default_watts: 300\ngpus: []\nbogus: 1\n")
    code = main(
        ["agent", "--gpu-backend", "sim", "--scenario", str(bad), "--state-dir", str(tmp_path)], {}
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("capwatch agent: error: bogus: unknown key 'bogus'")
    assert err.endswith(f"(in {bad}:4:1)\n")  # file:line:column of the bad key


def test_busy_grpc_port_is_one_line_without_grpcs_own_log(tmp_path: Path):
    """A gRPC port another process listens on stops the agent (exit 1) with one line that
    names the flag and says why: no raw grpc core log line, no GRPC_VERBOSITY advice."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [
                *CAPWATCH,
                "agent",
                "--gpu-backend=sim",
                f"--state-dir={tmp_path}",
                f"--grpc-listen=127.0.0.1:{port}",
                "--metrics-port=0",
                "--log-level=warning",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr == (
        f"capwatch agent: cannot start: --grpc-listen: cannot listen on 127.0.0.1:{port}: "
        "address already in use\n"
    )


def test_sigterm_restores_caps_persists_and_exits_0(tmp_path: Path):
    """SIGTERM stops the loop, restores owned GPUs, leaves an empty record, exits 0."""
    state = tmp_path / "state"
    env = {
        **os.environ,
        "CAPWATCH_STATE_DIR": str(state),
        "CAPWATCH_GPU_BACKEND": "sim",
        "CAPWATCH_GRPC_LISTEN": f"unix://{tmp_path}/agent.sock,127.0.0.1:0",
        "CAPWATCH_METRICS_PORT": "0",  # no fixed ports in tests
    }
    proc = subprocess.Popen(
        [*CAPWATCH, "agent", "--interval", "0.05"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        record = state / "ownership.json"
        while not (record.exists() and json.loads(record.read_text())["gpus"]):
            assert time.monotonic() < deadline, "agent never capped a GPU"
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "shutdown restore" in err
    assert "outcome=released" in err
    assert json.loads(record.read_text())["gpus"] == {}
    assert not (tmp_path / "agent.sock").exists()  # the socket is removed on exit
