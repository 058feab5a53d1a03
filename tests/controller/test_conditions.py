"""The condition rule (controller/conditions.py): GPUPowerCapEnforced as a pure function of
what a node's stream said and when, its failure classes in priority order, and its message."""

from __future__ import annotations

import itertools

import pytest

from capwatch.controller.conditions import (
    FAILURE_ORDER,
    MAX_MESSAGE,
    AgentLink,
    ConditionReason,
    ConditionStatus,
    CycleSummary,
    GpuSummary,
    bounded,
    condition_of,
    failure_message,
    failure_reason,
)
from tests.controller.builders import cycle, failed_gpu, gpu, observation

R = ConditionReason
S = ConditionStatus
NOW = 100.0
FRESH = cycle(enforced=True, gpus=[gpu(0), gpu(1), gpu(2, outcome="idle", reason="idle")])
FAILED = cycle(enforced=False, gpus=[gpu(0), failed_gpu(1, "write_failed")])


@pytest.mark.parametrize(
    ("link", "cycle_seen", "status", "reason"),
    [
        (AgentLink.MISSING, None, S.UNKNOWN, R.AGENT_MISSING),
        (AgentLink.MISSING, FRESH, S.UNKNOWN, R.AGENT_MISSING),
        (AgentLink.CONNECTING, None, S.UNKNOWN, R.AGENT_STARTING),
        (AgentLink.CONNECTED, None, S.UNKNOWN, R.AGENT_STARTING),
        (AgentLink.UNREACHABLE, None, S.UNKNOWN, R.AGENT_UNREACHABLE),
        (AgentLink.UNREACHABLE, FRESH, S.UNKNOWN, R.AGENT_UNREACHABLE),
        (AgentLink.UNREACHABLE, FAILED, S.UNKNOWN, R.AGENT_UNREACHABLE),
        (AgentLink.CONNECTED, FRESH, S.TRUE, R.CAPS_ENFORCED),
        (AgentLink.CONNECTED, FAILED, S.FALSE, R.CAP_WRITE_FAILED),
    ],
)
def test_condition_of_every_link_state(
    link: AgentLink,
    cycle_seen: CycleSummary | None,
    status: ConditionStatus,
    reason: ConditionReason,
) -> None:
    """Missing, connecting (no cycle yet) and unreachable read Unknown whatever cycle was
    last seen (failing closed); a connected agent's fresh cycle decides True or False."""
    seen = observation(link, cycle=cycle_seen)
    condition = condition_of(seen, NOW)
    assert (condition.status, condition.reason) == (status, reason)
    assert condition.key == (status, reason)


@pytest.mark.parametrize(
    ("age", "enforced", "status", "reason"),
    [
        (0.0, True, S.TRUE, R.CAPS_ENFORCED),
        (44.999, True, S.TRUE, R.CAPS_ENFORCED),
        (45.0, True, S.UNKNOWN, R.CYCLE_STALE),
        (3600.0, True, S.UNKNOWN, R.CYCLE_STALE),
        (44.999, False, S.FALSE, R.CAP_WRITE_FAILED),
        (45.0, False, S.UNKNOWN, R.CYCLE_STALE),
    ],
)
def test_a_cycle_is_fresh_strictly_within_the_staleness_bound(
    age: float, enforced: bool, status: ConditionStatus, reason: ConditionReason
) -> None:
    """A cycle as old as the agent's bound (45 s) or older is CycleStale, enforced or not:
    no fresh answer outranks the last one."""
    last = cycle(enforced=enforced, gpus=FAILED.gpus, finished_at=NOW - age)
    condition = condition_of(observation(cycle=last, stale_after_s=45.0), NOW)
    assert (condition.status, condition.reason) == (status, reason)
    if reason is R.CYCLE_STALE:
        assert "45s" in condition.message


def test_without_a_staleness_bound_a_cycle_never_goes_stale() -> None:
    """An agent that gave no bound (stale_after unset) is judged on its last cycle alone."""
    last = cycle(finished_at=NOW - 1e6)
    assert condition_of(observation(cycle=last, stale_after_s=None), NOW).status is S.TRUE


def test_enforced_message_counts_capped_gpus_only() -> None:
    """True says how many of the GPUs the cycle reached are capped (idle ones are not)."""
    condition = condition_of(observation(cycle=FRESH), NOW)
    assert condition.message == "power caps enforced; 2 of 3 GPUs capped"


def test_observe_mode_is_false_caps_observed_and_says_what_would_be_written() -> None:
    """An agent in observe mode enforces nothing: False, CapsObserved, with the count of
    GPUs it would have written; a failing cycle in observe mode still reads its failure."""
    observing = cycle(
        observe=True,
        gpus=[gpu(0, outcome="observed", reason="observed"), gpu(1, outcome="idle")],
    )
    condition = condition_of(observation(cycle=observing), NOW)
    assert (condition.status, condition.reason) == (S.FALSE, R.CAPS_OBSERVED)
    assert condition.message == (
        "observe mode, nothing written; 1 of 2 GPUs would be capped or released"
    )
    failing = cycle(enforced=False, observe=True, gpus=FAILED.gpus)
    assert condition_of(observation(cycle=failing), NOW).reason is R.CAP_WRITE_FAILED


def test_unreachable_message_names_address_and_error() -> None:
    """AgentUnreachable says where the agent was and why its stream is down."""
    seen = observation(AgentLink.UNREACHABLE, link_error="connection refused")
    message = condition_of(seen, NOW).message
    assert "10.0.0.1:50051" in message
    assert message.endswith(": connection refused")
    bare = condition_of(observation(AgentLink.UNREACHABLE, address=""), NOW).message
    assert bare == "the capwatch agent is unreachable"


# Each failure, injected into a cycle as the agent reports it, with its class.
FAILURES: dict[str, tuple[str, ConditionReason]] = {
    "pod_view_not_synced": ("abort", R.POD_VIEW_UNSYNCED),
    "device_count_failed": ("kind", R.DEVICE_COUNT_FAILED),
    "uuid_read_failed": ("gpu", R.GPU_IDENTITY_UNCONFIRMED),
    "identity_mismatch": ("gpu", R.GPU_IDENTITY_UNCONFIRMED),
    "identity_unconfirmed": ("gpu", R.GPU_IDENTITY_UNCONFIRMED),
    "process_list_failed": ("gpu", R.PROCESS_LIST_FAILED),
    "write_failed": ("gpu", R.CAP_WRITE_FAILED),
    "release_failed": ("gpu", R.RELEASE_FAILED),
    "release_deferred": ("gpu", R.RELEASE_FAILED),
    "constraints_read_failed": ("gpu", R.CYCLE_FAILED),
    "internal_error": ("gpu", R.CYCLE_FAILED),
    "state_unwritable": ("kind", R.CYCLE_FAILED),
}


def failing(*codes: str) -> CycleSummary:
    abort, kinds, gpus = "", list[str](), list[GpuSummary]()
    for index, code in enumerate(codes):
        where, _ = FAILURES[code]
        if where == "abort":
            abort = code
            kinds.append(code)
        elif where == "kind":
            kinds.append(code)
        else:
            gpus.append(failed_gpu(index, code))
    # An aborted cycle reconciled no GPU.
    return cycle(
        enforced=False, abort_reason=abort, failure_kinds=kinds, gpus=[] if abort else gpus
    )


@pytest.mark.parametrize("code", sorted(FAILURES))
def test_each_failure_alone_has_its_class(code: str) -> None:
    """Every stable code the agent reports maps to its documented condition reason."""
    condition = condition_of(observation(cycle=failing(code)), NOW)
    assert condition.status is S.FALSE
    assert condition.reason is FAILURES[code][1]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pair
        for pair in itertools.permutations(sorted(FAILURES), 2)
        if "pod_view_not_synced" not in pair  # an aborted cycle reaches no GPU: below
    ],
)
def test_two_failures_report_the_more_fundamental(first: str, second: str) -> None:
    """A cycle that failed two ways is reported by whichever comes first in FAILURE_ORDER,
    whatever order the agent listed them in."""
    expected = min((FAILURES[first][1], FAILURES[second][1]), key=FAILURE_ORDER.index)
    assert failure_reason(failing(first, second)) is expected


@pytest.mark.parametrize(
    ("abort", "kinds", "gpus", "expected"),
    [
        (
            "pod_view_not_synced",
            ["device_count_failed", "pod_view_not_synced"],
            [],
            R.POD_VIEW_UNSYNCED,
        ),
        ("internal_error", ["internal_error"], [], R.CYCLE_FAILED),
        ("", ["device_count_failed"], ["write_failed", "uuid_read_failed"], R.DEVICE_COUNT_FAILED),
        ("", ["internal_error"], ["release_deferred"], R.RELEASE_FAILED),
        ("", ["state_unwritable"], ["process_list_failed", "write_failed"], R.PROCESS_LIST_FAILED),
        (
            "",
            [],
            ["write_failed", "release_failed", "identity_mismatch"],
            R.GPU_IDENTITY_UNCONFIRMED,
        ),
        ("", [], [], R.CYCLE_FAILED),  # not enforced, nothing said why (an interrupted cycle)
    ],
)
def test_failure_reason_combinations(
    abort: str, kinds: list[str], gpus: list[str], expected: ConditionReason
) -> None:
    """Combinations of abort reasons, cycle failure kinds and GPU reasons, as the agent
    sends them (the pod view abort also lists a device count failure when both happened)."""
    last = cycle(
        enforced=False,
        abort_reason=abort,
        failure_kinds=kinds,
        gpus=[failed_gpu(i, r) for i, r in enumerate(gpus)],
    )
    assert failure_reason(last) is expected


def test_gpus_that_did_not_fail_do_not_count() -> None:
    """Only failed GPUs are classed: an enforced GPU's reason is ignored."""
    last = cycle(
        enforced=False,
        failure_kinds=["device_count_failed"],
        gpus=[gpu(0, reason="write_failed")],
    )
    assert failure_reason(last) is R.DEVICE_COUNT_FAILED


def test_failure_message_names_each_failing_gpu_after_cycle_failures() -> None:
    """Cycle-level failures come first, then each failing GPU with index, UUID, code and
    the agent's message; a GPU without a UUID is named by index alone."""
    last = cycle(
        enforced=False,
        failure_kinds=["device_count_failed"],
        gpus=[
            gpu(0),
            failed_gpu(1, "write_failed", "no permission"),
            GpuSummary(
                index=2,
                uuid="",
                healthy=False,
                outcome="failed",
                reason="uuid_read_failed",
                message="unknown error",
            ),
        ],
    )
    assert failure_message(last) == (
        "device_count_failed; "
        "gpu1 (GPU-00000000-0000-4000-8000-000000000001): write_failed: no permission; "
        "gpu2: uuid_read_failed: unknown error"
    )


def test_failure_message_of_an_aborted_cycle() -> None:
    """An abort says no GPU was reconciled, and is not repeated as a failure kind."""
    last = cycle(
        enforced=False,
        abort_reason="pod_view_not_synced",
        failure_kinds=["device_count_failed", "pod_view_not_synced"],
    )
    assert failure_message(last) == (
        "cycle aborted (pod_view_not_synced): no GPU was reconciled; device_count_failed"
    )


def test_failure_message_falls_back_to_the_summary_then_a_default() -> None:
    """With nothing itemised, the agent's failure summary is the message, else a default."""
    assert failure_message(cycle(enforced=False, failure_summary="interrupted")) == "interrupted"
    assert failure_message(cycle(enforced=False)) == "the cycle was not enforced"


def test_failure_message_is_bounded_and_says_so() -> None:
    """200 failing GPUs with long messages fit in MAX_MESSAGE (1,024) characters, and the
    cut is marked; the first GPUs stay named."""
    last = cycle(enforced=False, gpus=[failed_gpu(i, "write_failed", "x" * 80) for i in range(200)])
    condition = condition_of(observation(cycle=last), NOW)
    assert len(condition.message) == MAX_MESSAGE
    assert condition.message.endswith(" ... (truncated)")
    assert condition.message.startswith("gpu0 (GPU-")


@pytest.mark.parametrize("size", [0, 1, MAX_MESSAGE - 1, MAX_MESSAGE])
def test_bounded_leaves_short_messages_alone(size: int) -> None:
    """A message of at most the limit is kept whole."""
    assert bounded("m" * size) == "m" * size


def test_bounded_cuts_to_exactly_the_limit() -> None:
    """A message one character over is cut to exactly the limit, ending with the marker."""
    cut = bounded("m" * (MAX_MESSAGE + 1))
    assert len(cut) == MAX_MESSAGE
    assert cut.endswith(" ... (truncated)")
    assert bounded("abcdefghijklmnopqrstuvwxyz", limit=20) == "abcd ... (truncated)"


def test_unknown_messages_are_bounded_too() -> None:
    """The stream error an unreachable agent is reported with (a TLS failure can carry a
    long debug string) does not stretch the message past MAX_MESSAGE."""
    seen = observation(AgentLink.UNREACHABLE, link_error="handshake failed: " + "e" * 5000)
    message = condition_of(seen, NOW).message
    assert len(message) <= MAX_MESSAGE
    assert message.startswith("the capwatch agent at 10.0.0.1:50051 is unreachable: handshake")
