"""Bad input to a real controller: agents it cannot reach, agents whose TLS it cannot
trust, malformed target files and invalid flags (exit 2, one line that says what)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.controller.e2e.pki import make_ca, make_leaf
from tests.controller.e2e.processes import CAPWATCH, clean_environ, wait_until
from tests.controller.e2e.support import Cluster, fencing_violations, lines_with


@pytest.mark.slow
def test_an_unreachable_agent_reads_unreachable_until_it_answers(cluster: Cluster) -> None:
    """An agent pod whose address refuses connections: the node reads
    Unknown/AgentUnreachable naming the refusal, the controller keeps trying (and keeps
    the other node, whose agent answers, True); once an agent listens there the node
    reads True, with nothing lost."""
    cluster.gpu_node("gpu-a")
    cluster.gpu_node("gpu-u")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.pod("gpu-u", 2)
    cluster.wait_cycled("gpu-a")
    controller = cluster.controller("c1")
    cluster.wait_leader("c1")

    refused = cluster.wait_condition("gpu-u", "Unknown", "AgentUnreachable")
    assert refused["message"].startswith(
        f"the capwatch agent at {cluster.loopback.address(2)} is unreachable: UNAVAILABLE"
    )
    assert "Connection refused" in refused["message"], refused["message"]
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    cluster.agent("gpu-u", 2)
    cluster.wait_condition("gpu-u", "True", "CapsEnforced", timeout=30)

    assert cluster.writes("gpu-u") == [("Unknown", "AgentUnreachable"), ("True", "CapsEnforced")]
    cluster.wait_events("gpu-u", [("Warning", "AgentUnreachable"), ("Normal", "CapsEnforced")])
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")]
    assert controller.popen.poll() is None
    assert fencing_violations(cluster.fake) == []


@pytest.mark.slow
def test_agents_whose_tls_cannot_be_trusted_read_unreachable(cluster: Cluster) -> None:
    """An agent serving TLS with a certificate for agent.capwatch.test (dialled by its
    IP): a controller dialling it in plaintext, one trusting another CA, and one trusting
    the right CA but checking the certificate against the IP all read it
    Unknown/AgentUnreachable and never True; the one trusting the right CA for the name
    the certificate carries (--agent-tls-server-name) reads it True."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificates")
    pki = cluster.directory / "pki"
    pki.mkdir()
    ca, rogue = make_ca(pki, "ca"), make_ca(pki, "rogue-ca")
    cert, key = make_leaf(
        pki, "agent", "ca", "subjectAltName=DNS:agent.capwatch.test\nextendedKeyUsage=serverAuth\n"
    )
    agent = cluster.agent(
        "gpu-t", 1, extra=("--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key))
    )
    cluster.wait_cycled("gpu-t")
    target = {"gpu-t": cluster.loopback.address(1)}
    name = ("--agent-tls-server-name", "agent.capwatch.test")
    failing = {
        "plaintext": cluster.dry_run("plaintext", target),
        "rogue-ca": cluster.dry_run("rogue-ca", target, "--agent-tls-ca", str(rogue), *name),
        "by-ip": cluster.dry_run("by-ip", target, "--agent-tls-ca", str(ca)),
    }
    trusting = cluster.dry_run("trusting", target, "--agent-tls-ca", str(ca), *name)

    wait_until(
        lambda: lines_with(trusting.output, ["GPUPowerCapEnforced=True", "reason=CapsEnforced"]),
        timeout=30,
        what=f"the trusting controller to read gpu-t True:\n{trusting.log[-2000:]}",
    )
    for why, process in failing.items():
        wait_until(
            lambda p=process: (
                lines_with(p.output, ["reason=AgentUnreachable"])
                and p.log.count("stream lost target=") >= 2
            ),
            timeout=30,
            what=f"the {why} controller to be refused twice:\n{process.log[-2000:]}",
        )
    for why, process in failing.items():
        patches = lines_with(process.output, ["PATCH nodes/gpu-t/status"])
        assert len(patches) == 1, (why, process.output)
        assert "GPUPowerCapEnforced=Unknown reason=AgentUnreachable" in patches[0], patches
        assert "UNAVAILABLE" in patches[0], (why, patches)
    assert agent.popen.poll() is None


def _run_all(commands: dict[str, list[str]], tmp: Path) -> dict[str, tuple[int, str, str]]:
    """Run every ``capwatch`` command at once: (exit code, stdout, stderr) by name."""
    running = {
        name: subprocess.Popen(
            [*CAPWATCH, *args],
            cwd=tmp,
            env=clean_environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    done = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=60)
        done[name] = (process.returncode, out, err)
    return done


@pytest.mark.slow
def test_malformed_target_files_exit_2_naming_file_and_line(tmp_path: Path) -> None:
    """Each malformed --targets file (a line with three fields, an invalid node name, an
    address that is no host:port, a node listed twice, a file that cannot be read) stops
    the controller before it starts: exit 2 and one line on stderr naming the file and
    line, nothing on stdout."""
    files = {
        "three-fields": ("gpu-1 127.0.0.1:50051\ngpu-2 127.0.0.1:50051 extra\n", 2),
        "node-name": ("# comment\n\nNot_A_Node 127.0.0.1:50051\n", 3),
        "address": ("gpu-1 nowhere\n", 1),
        "twice": ("gpu-1 127.0.0.1:1\ngpu-2 127.0.0.1:2  # fine\ngpu-1 127.0.0.1:3\n", 3),
    }
    expected = {
        "three-fields": "expected 'NODE ADDRESS', got 'gpu-2 127.0.0.1:50051 extra'",
        "node-name": "not a valid node name: 'Not_A_Node'",
        "address": "expected host:port or unix:///path, got 'nowhere'",
        "twice": "node 'gpu-1' is listed twice",
        "missing": "cannot read",
    }
    paths = {name: tmp_path / f"{name}.targets" for name in expected}
    for name, (text, _) in files.items():
        paths[name].write_text(text)
    results = _run_all(
        {name: ["controller", "--dry-run", "--targets", str(path)] for name, path in paths.items()},
        tmp_path,
    )
    for name, (code, out, err) in results.items():
        assert (code, out) == (2, ""), (name, code, out, err)
        assert len(err.splitlines()) == 1, (name, err)
        where = f"cannot read {paths[name]}" if name == "missing" else f"{paths[name]}:"
        if name in files:
            where += f"{files[name][1]}:"
        assert err.startswith(f"capwatch controller: error: --targets: {where}"), (name, err)
        assert expected[name] in err, (name, err)


INVALID = {
    "--shards": (["--shards", "0"], "must be an integer from 1 to 1024"),
    "--shard-index": (["--shards", "2", "--shard-index", "2"], "must be below --shards"),
    "--lease-duration": (
        ["--lease-duration", "2", "--renew-deadline", "3"],
        "need retry period < renew deadline < lease duration",
    ),
    "--renew-deadline": (["--renew-deadline", "-1"], "--renew-deadline"),
    "--retry-period": (
        ["--lease-duration", "0.003", "--renew-deadline", "0.002", "--retry-period", "0.001"],
        "must be at least 0.1 s",
    ),
    "--agent-port": (["--agent-port", "70000"], "--agent-port"),
    "--namespace": (["--kubeconfig", "/dev/null"], "required (set POD_NAMESPACE) unless --dry-run"),
    "--dry-run": (["--dry-run"], "needs --targets"),
    "--agent-tls-ca": (["--agent-tls-cert", "client.pem"], "required by the other"),
    "--gpu-node-selector": (["--gpu-node-selector", "gpu in (a,b)"], "not an equality-based"),
    "--grpc-listen": (["--grpc-listen", "no-port"], "expected host:port"),
    "--bogus": (["--bogus"], "unrecognized arguments: --bogus"),
}


@pytest.mark.slow
def test_invalid_flags_exit_2_with_one_line_naming_the_flag(tmp_path: Path) -> None:
    """Each invalid flag (or combination) exits 2 before anything starts, with exactly
    one line on stderr that names the flag and says what is wrong."""
    commands = {flag: ["controller", *args] for flag, (args, _) in INVALID.items()}
    for flag, args in commands.items():
        if flag not in ("--namespace", "--dry-run"):
            args[1:1] = ["--namespace", "capwatch"]
    for flag, (code, out, err) in _run_all(commands, tmp_path).items():
        assert (code, out) == (2, ""), (flag, code, out, err)
        assert len(err.splitlines()) == 1, (flag, err)
        assert err.startswith("capwatch controller: error: "), (flag, err)
        assert flag in err, (flag, err)
        assert INVALID[flag][1] in err, (flag, err)
