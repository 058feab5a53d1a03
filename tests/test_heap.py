"""The start-up heap a serving agent settles (kit/heap.py): garbage collected first, every
object then alive frozen out of the cyclic collector's reach, whatever is made afterwards
still collected as before; and the agent command settles it once, after binding its
listeners and before its first cycle. Each check of the collector runs in a process of its
own so the test process's heap is left as it is, and reads the collector's own state
(``gc.get_objects()`` lists only objects it still walks; frozen ones are not listed), never
how many objects the interpreter happened to make."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capwatch import launch

FIRST_CYCLE = "sim cycle begins cycle=1"
THIRD_CYCLE = "sim cycle begins cycle=3"
SERVING = "grpc serving addresses="
SETTLED = "start-up heap settled: "

PRELUDE = """
import gc, json, weakref
from capwatch.kit.heap import settle_heap

class Node:
    pass

def unreachable_cycle():
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)

def walked(obj):
    # Whether the cyclic collector still walks obj (frozen objects are not listed).
    return any(o is obj for o in gc.get_objects())
"""


def run_check(body: str) -> dict[str, object]:
    """Run ``PRELUDE + body`` in a fresh interpreter; the JSON object it printed last."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + body],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_settling_collects_the_garbage_first_then_freezes_everything_alive():
    """settle_heap runs a full collection before freezing: a cycle already unreachable is
    freed, not frozen for ever. Every object alive is then out of the collector's reach
    (no longer walked), and the count it returns is the collector's freeze count. The
    automatic collector is off until then, so only settle_heap can have freed the cycle."""
    found = run_check(
        """
gc.disable()
garbage = unreachable_cycle()
kept = Node()
before = [garbage() is not None, walked(kept), gc.get_freeze_count()]
frozen = settle_heap()
print(json.dumps({
    "before": before,
    "garbage_freed": garbage() is None,
    "kept_walked": walked(kept),
    "returned": frozen,
    "freeze_count": gc.get_freeze_count(),
}))
"""
    )
    assert found["before"] == [True, True, 0]  # the cycle was alive, nothing frozen yet
    assert found["garbage_freed"] is True
    assert found["kept_walked"] is False
    assert found["returned"] == found["freeze_count"]
    assert isinstance(found["returned"], int)
    assert found["returned"] > 0


def test_objects_made_after_settling_are_collected_as_before():
    """settle_heap leaves the collector enabled with its thresholds as they were; an
    object made afterwards is walked, and a cycle made afterwards is freed by the
    collector's own (allocation-triggered) pass, without an explicit gc.collect()."""
    found = run_check(
        """
thresholds, enabled = gc.get_threshold(), gc.isenabled()
settle_heap()
after = [list(gc.get_threshold()) == list(thresholds), gc.isenabled() == enabled]
fresh = Node()
later = unreachable_cycle()
keep, made = [], 0
while later() is not None and made < 100 * gc.get_threshold()[0]:
    keep.append([[] for _ in range(10)])  # kept alive: only allocations count
    made += 11
print(json.dumps({
    "enabled": enabled,
    "unchanged": after,
    "fresh_walked": walked(fresh),
    "later_freed": later() is None,
}))
"""
    )
    assert found["enabled"] is True
    assert found["unchanged"] == [True, True]
    assert found["fresh_walked"] is True
    assert found["later_freed"] is True


def test_frozen_objects_are_freed_by_their_last_reference_but_a_frozen_cycle_never_is():
    """What freezing costs, as kit/heap.py says: a frozen object is still freed when its
    last reference goes; a cycle among frozen objects is never collected."""
    found = run_check(
        """
single = Node()
pair = [Node(), Node()]
pair[0].peer, pair[1].peer = pair[1], pair[0]
single_ref, pair_ref = weakref.ref(single), weakref.ref(pair[0])
settle_heap()
del single, pair
gc.collect()
print(json.dumps({"single_freed": single_ref() is None, "cycle_freed": pair_ref() is None}))
"""
    )
    assert found == {"single_freed": True, "cycle_freed": False}


def test_a_second_settling_freezes_what_was_made_since_and_keeps_the_rest_frozen():
    """settle_heap may be called again: what was frozen stays frozen, what was made since
    is frozen too, and the count it returns is the total frozen now (it never shrinks)."""
    found = run_check(
        """
first_kept = Node()
first = settle_heap()
second_kept = Node()
walked_between = walked(second_kept)
second = settle_heap()
third = settle_heap()
print(json.dumps({
    "walked_between": walked_between,
    "first_walked": walked(first_kept),
    "second_walked": walked(second_kept),
    "counts": [first, second, third],
    "freeze_count": gc.get_freeze_count(),
}))
"""
    )
    assert found["walked_between"] is True
    assert (found["first_walked"], found["second_walked"]) == (False, False)
    first, second, third = found["counts"]
    assert 0 < first < second <= third == found["freeze_count"]


def test_the_agent_command_logs_what_settle_heap_froze(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The agent command's on_serving hook settles the heap exactly once per call and its
    debug line carries settle_heap's own count (settle_heap replaced, so this process's
    heap is not frozen)."""
    calls: list[None] = []

    def settle() -> int:
        calls.append(None)
        return 4321

    monkeypatch.setattr(launch, "settle_heap", settle)
    caplog.set_level(logging.DEBUG, logger="capwatch.launch")
    asyncio.run(launch.settle_heap_when_serving(object()))
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "capwatch.launch"] == [
        "start-up heap settled: 4321 objects frozen"
    ]


def test_the_agent_command_settles_its_heap_once_it_serves(tmp_path: Path):
    """`capwatch agent` settles its start-up heap exactly once, after its gRPC listener is
    bound and before its first cycle, not again in later ones (the line carries the freeze
    count settle_heap returned, so a positive number means the heap was frozen), then runs
    and stops as before."""
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
            while THIRD_CYCLE not in log.read_text():  # a few cycles: settled once only
                assert time.monotonic() < deadline, log.read_text()
                assert proc.poll() is None, log.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        finally:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    (settled,) = [line for line in text.splitlines() if SETTLED in line]  # once, not per cycle
    assert int(settled.split(SETTLED)[1].split()[0]) > 0  # settle_heap's freeze count
    assert text.index(SERVING) < text.index(settled) < text.index(FIRST_CYCLE), text
