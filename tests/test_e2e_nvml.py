"""End to end: ``capwatch agent`` as a process, on the real NVML backend (real pynvml
over the fake libnvidia-ml, configured by file) and the real Kubernetes client
against the fake API server, attributing real cgroup files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capwatch.agent.sim.proctree import ProcSpec, materialise
from tests.fakenvml.control import FakeConfig, FakeDevice, read_log_file
from tests.fakes.kube_apiserver import FakeKubeApiServer

pytestmark = pytest.mark.nvml

NODE = "gpu-node-1"
KEY = "capwatch.io/gpu-power-limit"
UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "aaaaaaaa-0000-4000-8000-00000000000b"
UUIDS = ("GPU-e2e00000-0000-4000-8000-000000000000", "GPU-e2e00000-0000-4000-8000-000000000001")


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: fake, user: u}}]\n"
        "current-context: c\n"
    )
    return path


def wait_for(predicate, what: str, proc: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"agent exited early ({proc.returncode}) waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_agent_caps_from_annotations_and_restores_on_sigterm(
    tmp_path: Path, fake_nvml_library: Path
):
    """Pods' annotations become NVML writes on their GPUs, and Events on the pods;
    SIGTERM restores the defaults."""
    server = FakeKubeApiServer()
    server.start()
    try:
        server.add_pod("ml", "trainer", node=NODE, uid=UID_A, annotations={KEY: "250"})
        server.add_pod("ml", "other-node", node="elsewhere", annotations={KEY: "150"})
        server.add_pod("ml", "helper", node=NODE, uid=UID_B)
        proc_root = tmp_path / "proc"
        materialise(
            proc_root, [ProcSpec(pid=4001, pod_uid=UID_A), ProcSpec(pid=4002, pod_uid=UID_B)]
        )
        log_file = tmp_path / "nvml-writes.log"
        config = FakeConfig(
            devices=(
                FakeDevice(uuid=UUIDS[0], pids=(4001,)),
                FakeDevice(uuid=UUIDS[1], pids=(4002,)),
            ),
            log_file=log_file,
        ).write(tmp_path / "fake-nvml.conf")
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "CAPWATCH_"))
        }
        env.update(
            FAKE_NVML_CONFIG=str(config),
            NODE_NAME=NODE,
            KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", server.url)),
            CAPWATCH_PROC_ROOT=str(proc_root),
            CAPWATCH_STATE_DIR=str(tmp_path / "state"),
            CAPWATCH_INTERVAL="0.1",
            CAPWATCH_SAFE_DEFAULT_WATTS="200",
            CAPWATCH_GRPC_LISTEN="127.0.0.1:0",
            CAPWATCH_METRICS_PORT="0",  # no fixed ports in tests
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "capwatch.cli", "agent", "--gpu-backend", "nvml"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def writes() -> list[tuple[int, int]]:
                if not log_file.exists():
                    return []
                return [(e.device, e.milliwatts) for e in read_log_file(log_file) if e.rc == 0]

            wait_for(lambda: {(0, 250_000), (1, 200_000)} <= set(writes()), "caps", proc)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        # The last write to each GPU is the restore of its default (300 W).
        last = dict(writes())
        assert last == {0: 300_000, 1: 300_000}, err
        assert "enforced=true" in err
        assert server.count("list") == 1  # one LIST, then the watch
        # One Event per pod, not one per cycle; the one without an annotation is told so.
        told = sorted(
            (e["involvedObject"]["name"], e["reason"], e["type"]) for e in server.events()
        )
        assert told == [
            ("helper", "PowerCapSafeDefault", "Normal"),
            ("trainer", "PowerCapApplied", "Normal"),
        ], err
    finally:
        server.stop()


def test_a_stalled_pod_watch_aborts_cycles_within_the_silence_bound(
    tmp_path: Path, fake_nvml_library: Path
):
    """The API server keeps the agent's watch open but stops sending: within the
    silence bound (--pod-silence-bound, 5 s here) cycles stop claiming to enforce
    (they abort, pod view not synced) and the cap stays as it was; once the watch
    delivers again the annotation changed during the stall is applied and cycles
    are enforced again, without a second LIST."""
    bound = 5.0
    server = FakeKubeApiServer()
    server.start()
    try:
        server.add_pod("ml", "trainer", node=NODE, uid=UID_A, annotations={KEY: "250"})
        proc_root = tmp_path / "proc"
        materialise(proc_root, [ProcSpec(pid=4001, pod_uid=UID_A)])
        log_file = tmp_path / "nvml-writes.log"
        config = FakeConfig(
            devices=(FakeDevice(uuid=UUIDS[0], pids=(4001,)),), log_file=log_file
        ).write(tmp_path / "fake-nvml.conf")
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "CAPWATCH_"))
        }
        env.update(
            FAKE_NVML_CONFIG=str(config),
            NODE_NAME=NODE,
            KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", server.url)),
            CAPWATCH_PROC_ROOT=str(proc_root),
            CAPWATCH_STATE_DIR=str(tmp_path / "state"),
            CAPWATCH_INTERVAL="0.1",
            CAPWATCH_POD_SILENCE_BOUND=str(bound),
            CAPWATCH_POD_EVENTS="false",
            CAPWATCH_GRPC_LISTEN="127.0.0.1:0",
            CAPWATCH_METRICS_PORT="0",
        )
        stderr = tmp_path / "agent.err"
        with stderr.open("w") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "capwatch.cli", "agent", "--gpu-backend", "nvml"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err_file,
                text=True,
            )
        try:

            def writes() -> list[int]:
                if not log_file.exists():
                    return []
                return [e.milliwatts for e in read_log_file(log_file) if e.rc == 0]

            def cycles_since(mark: int) -> list[str]:
                lines = stderr.read_text().splitlines()[mark:]
                return [line for line in lines if "cycle seq=" in line]

            wait_for(lambda: 250_000 in writes(), "the first cap", proc)
            server.stall_watches()
            mark = len(stderr.read_text().splitlines())
            server.update_pod("ml", "trainer", annotations={KEY: "260"})
            wait_for(
                lambda: any("enforced=false" in c for c in cycles_since(mark)),
                "an aborted cycle",
                proc,
                timeout=bound + 20,
            )
            aborted = next(c for c in cycles_since(mark) if "enforced=false" in c)
            assert "pod_view_not_synced" in aborted
            assert 260_000 not in writes()  # the cap stayed as it was
            server.stall_watches(False)
            wait_for(lambda: 260_000 in writes(), "the missed annotation applied", proc)
            mark = len(stderr.read_text().splitlines())
            wait_for(
                lambda: any("enforced=true" in c for c in cycles_since(mark)),
                "an enforced cycle",
                proc,
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0, stderr.read_text()
        finally:
            proc.kill()
        assert server.count("list") == 1
        timeouts = {int(w.query["timeoutSeconds"]) for w in server.requests("watch")}
        assert timeouts <= {2, 3}, timeouts  # within [bound/2, 2*bound/3]
    finally:
        server.stop()
