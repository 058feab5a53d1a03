"""kill -9 at random instants (bench/scenarios/crash.py's trials, fewer of them): no cap
escapes its record, and the same trials catch the agent that saves only at the end of each
cycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenarios.crash import run_trials

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_no_cap_escapes_the_record_under_random_kills(tmp_path: Path):
    """40 SIGKILLs mid-reconcile: 0 unrecorded caps, 0 unparseable records, and a restart
    releases every recorded GPU."""
    tally = run_trials(40, seed=7, unsafe=False, workdir=tmp_path)
    assert tally.capped_at_kill > 0  # the trials did see GPUs capped
    assert (tally.unrecorded, tally.unparseable, tally.not_released) == (0, 0, 0), tally.examples


@pytest.mark.timeout(120)
def test_the_trials_catch_a_record_saved_only_at_the_end_of_the_cycle(tmp_path: Path):
    """The baseline (no save before the write) leaves unrecorded caps in the same trials, so
    the test above can fail."""
    tally = run_trials(40, seed=7, unsafe=True, workdir=tmp_path)
    assert tally.unrecorded > 0
