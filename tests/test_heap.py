"""The start-up heap a serving agent settles (kit/heap.py): frozen once it serves, and
whatever is made afterwards still collected. Each check runs in a process of its own so
the test process's heap is left as it is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FIRST_CYCLE = "sim cycle begins cycle=1"
CHECK = """
import gc, weakref
from kit.heap import settle_heap
before = gc.get_freeze_count()
frozen = settle_heap()
class Node:
    pass
a, b = Node(), Node()
a.peer, b.peer = b, a  # a cycle made after the freeze
alive = weakref.ref(a)
del a, b
gc.collect()
print(before, frozen, alive() is None)
"""


def test_settling_freezes_what_is_alive_and_later_cycles_are_still_collected():
    """After settle_heap the start-up objects are in the permanent generation (thousands of
    them: modules, types) and a reference cycle made later is still collected."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    before, frozen, collected = done.stdout.split()
    assert before == "0"
    assert int(frozen) > 5_000
    assert collected == "True"


def test_the_agent_command_settles_its_heap_once_it_serves(tmp_path: Path):
    """`capwatch agent` freezes its start-up heap after binding its listeners and before
    its first cycle (the line says how many objects), then runs and stops as before."""
    log = tmp_path / "agent.log"
    env = {
        **os.environ,
        "CAPWATCH_STATE_DIR": str(tmp_path / "state"),
        "CAPWATCH_GPU_BACKEND": "sim",
        "CAPWATCH_GRPC_LISTEN": "127.0.0.1:0",
        "CAPWATCH_METRICS_PORT": "0",
        "CAPWATCH_LOG_LEVEL": "debug",
    }
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "capwatch.cli", "agent", "--interval", "0.05"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 30
            while FIRST_CYCLE not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                assert proc.poll() is None, log.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        finally:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    settled = next(line for line in text.splitlines() if "start-up heap settled" in line)
    assert int(settled.split("settled: ")[1].split()[0]) > 5_000
    assert text.index(settled) < text.index(FIRST_CYCLE)
