"""Kubernetes Events on owner pods (agent/podevents.py): what is said, when, and how it
is posted without ever holding up a cycle."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.podevents import (
    EventSinkError,
    EventType,
    PodEvent,
    PodEvents,
    event_body,
    events_for,
)
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import (
    CapSource,
    ClampDirection,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)

KEY = "capwatch.io/gpu-power-limit"
UUID = "GPU-00000000-0000-4000-8000-000000000002"
POD = PodRef(namespace="ml", name="trainer", uid="aaaaaaaa-0000-4000-8000-000000000001")
OTHER = PodRef(namespace="ml", name="eval", uid="aaaaaaaa-0000-4000-8000-000000000002")
CLAIM = ClaimRef(namespace="ml", name="train-gpu")
CAPPED = GpuResult(
    index=2,
    uuid=UUID,
    outcome=Outcome.ENFORCED,
    reason=Reason.OK,
    message="capped at 350 W (annotation)",
    owners=(POD,),
    requested_watts=350,
    resolved_watts=350,
    applied_watts=350,
    cap_source=CapSource.ANNOTATION,
)


def safe_default(cause: SafeDefaultCause) -> GpuResult:
    return dataclasses.replace(
        CAPPED,
        requested_watts=None,
        resolved_watts=300,
        applied_watts=300,
        cap_source=CapSource.SAFE_DEFAULT,
        safe_default_cause=cause,
    )


@pytest.mark.parametrize(
    ("result", "kind", "reason", "says"),
    [
        (CAPPED, EventType.NORMAL, "PowerCapApplied", "capped at 350 W, as annotated"),
        (
            dataclasses.replace(CAPPED, cap_source=CapSource.AGREED, owners=(POD, OTHER)),
            EventType.NORMAL,
            "PowerCapApplied",
            "capped at 350 W, as all its pods ask",
        ),
        (
            safe_default(SafeDefaultCause.INVALID),
            EventType.WARNING,
            "PowerCapSafeDefault",
            f"safe default 300 W: the {KEY} annotation is not a whole number of watts",
        ),
        (
            safe_default(SafeDefaultCause.DISAGREE),
            EventType.WARNING,
            "PowerCapSafeDefault",
            "the pods sharing it ask for different caps",
        ),
        (
            safe_default(SafeDefaultCause.MISSING),
            EventType.NORMAL,
            "PowerCapSafeDefault",
            f"no {KEY} annotation",
        ),
        (
            dataclasses.replace(
                CAPPED,
                requested_watts=5000,
                resolved_watts=5000,
                applied_watts=700,
                clamp=ClampDirection.LOWERED_TO_MAX,
            ),
            EventType.WARNING,
            "PowerCapClamped",
            "capped at 700 W, its maximum: 5000 W is outside its range",
        ),
        (
            dataclasses.replace(
                CAPPED,
                requested_watts=600,
                resolved_watts=600,
                applied_watts=450,
                clamp=ClampDirection.LOWERED_TO_CEILING,
            ),
            EventType.WARNING,
            "PowerCapClamped",
            "capped at 450 W, the cluster's ceiling: 600 W is outside the cluster's bounds",
        ),
        (
            dataclasses.replace(
                CAPPED,
                outcome=Outcome.FAILED,
                reason=Reason.WRITE_FAILED,
                message="cap write failed: no_permission",
                error_class=GpuErrorClass.NO_PERMISSION,
                applied_watts=None,
            ),
            EventType.WARNING,
            "PowerCapFailed",
            "cap write failed: no_permission; the agent retries every cycle",
        ),
        (
            dataclasses.replace(CAPPED, cap_source=CapSource.CLAIM, claims=(CLAIM,)),
            EventType.NORMAL,
            "PowerCapApplied",
            "capped at 350 W, as claim ml/train-gpu asks",
        ),
        (
            dataclasses.replace(
                safe_default(SafeDefaultCause.INVALID),
                claims=(CLAIM,),
                claim_problem="claim ml/train-gpu: watts '350' is not an integer",
            ),
            EventType.WARNING,
            "PowerCapSafeDefault",
            "safe default 300 W: claim ml/train-gpu: watts '350' is not an integer",
        ),
        (
            dataclasses.replace(
                CAPPED,
                outcome=Outcome.OBSERVED,
                reason=Reason.OBSERVED,
                message="would be capped at 350 W (annotation); observe mode",
                applied_watts=None,
                intended_watts=350,
            ),
            EventType.NORMAL,
            "PowerCapObserved",
            "would be capped at 350 W (annotation); observe mode, nothing was written",
        ),
        (
            dataclasses.replace(
                CAPPED,
                outcome=Outcome.LEFT,
                reason=Reason.UNCLAIMED,
                message=f"left as it is: no claim or {KEY} annotation asks a cap",
                requested_watts=None,
                resolved_watts=None,
                applied_watts=None,
                cap_source=None,
            ),
            EventType.NORMAL,
            "PowerCapNotSet",
            f"left as it is: no claim or {KEY} annotation asks a cap",
        ),
    ],
    ids=[
        "annotation",
        "agreed",
        "invalid",
        "disagree",
        "missing",
        "clamped",
        "clamped-to-ceiling",
        "failed",
        "claim",
        "claim-invalid",
        "observe-mode",
        "unclaimed-left",
    ],
)
def test_what_each_owner_pod_is_told(
    result: GpuResult, kind: EventType, reason: str, says: str
) -> None:
    """Each kind of GPU step becomes one Event per owner pod, naming the GPU."""
    events = events_for(result, annotation_key=KEY)
    assert [e.pod for e in events] == list(result.owners)
    for event in events:
        assert (event.type, event.reason) == (kind, reason)
        assert says in event.message
        assert f"GPU 2 ({UUID})" in event.message


@pytest.mark.parametrize(
    "result",
    [
        dataclasses.replace(CAPPED, outcome=Outcome.IDLE, reason=Reason.IDLE, owners=()),
        dataclasses.replace(CAPPED, outcome=Outcome.RELEASED, reason=Reason.RELEASED),
        dataclasses.replace(CAPPED, owners=(PodRef(namespace="", name="", uid="u"),)),
    ],
    ids=["idle", "released", "pod-known-by-uid-only"],
)
def test_nothing_to_tell(result: GpuResult) -> None:
    """Idle and released steps, and pods with no name to address, get no Event."""
    assert events_for(result, annotation_key=KEY) == []


def test_event_body_is_a_core_v1_event_on_the_pod() -> None:
    """The posted object names the pod (namespace, name, UID), the agent and the node."""
    event = PodEvent(pod=POD, type=EventType.WARNING, reason="PowerCapClamped", message="x" * 2000)
    body = event_body(event, node_name="gpu-node-1", wall=1_750_000_000.5)
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "trainer",
        "uid": POD.uid,
    }
    assert body["metadata"] == {"generateName": "trainer.", "namespace": "ml"}
    assert (body["type"], body["reason"]) == ("Warning", "PowerCapClamped")
    assert len(body["message"]) == 1024
    assert body["source"] == {"component": "capwatch-agent", "host": "gpu-node-1"}
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2025-06-15T15:06:40Z"
    assert body["count"] == 1


class Collecting:
    """A sink that keeps what it is given; ``gate`` (when given) holds every post until it
    is set, for ``hold_s`` at most."""

    def __init__(
        self, gate: threading.Event | None = None, fail: bool = False, hold_s: float = 5
    ) -> None:
        self.posted: list[PodEvent] = []
        self.gate, self.fail, self.hold_s = gate, fail, hold_s

    def post(self, event: PodEvent) -> None:
        if self.gate is not None:
            self.gate.wait(self.hold_s)
        if self.fail:
            raise EventSinkError("refused")
        self.posted.append(event)


def report(sequence: int, *gpus: GpuResult) -> CycleReport:
    return CycleReport(
        sequence=sequence,
        started_wall=0.0,
        finished_wall=0.0,
        started_monotonic=0.0,
        finished_monotonic=0.0,
        gpus=gpus,
    )


def settle(events: PodEvents, count: int) -> None:
    deadline = time.monotonic() + 5
    while events.posted + events.failed < count:
        assert time.monotonic() < deadline, "events not posted in time"
        time.sleep(0.005)


def test_an_event_is_posted_when_what_it_says_changes_not_every_cycle() -> None:
    """The same step cycle after cycle is told once; a change is told; a pod that left the
    GPU and came back is told again."""
    sink = Collecting()
    events = PodEvents(sink, annotation_key=KEY)
    try:
        for sequence in (1, 2, 3):
            events.observe(report(sequence, CAPPED))
        settle(events, 1)
        clamped = dataclasses.replace(
            CAPPED, applied_watts=400, clamp=ClampDirection.LOWERED_TO_MAX
        )
        events.observe(report(4, clamped))
        events.observe(report(5, clamped))
        settle(events, 2)
        events.observe(report(6, dataclasses.replace(CAPPED, owners=())))  # the pod left
        events.observe(report(7, CAPPED))  # and came back
        settle(events, 3)
    finally:
        events.close()
    assert [e.reason for e in sink.posted] == [
        "PowerCapApplied",
        "PowerCapClamped",
        "PowerCapApplied",
    ]


def test_a_full_queue_drops_events_and_never_blocks_the_caller() -> None:
    """With the sink stuck, observing goes on at once and counts what it dropped."""
    gate = threading.Event()
    events = PodEvents(Collecting(gate, hold_s=60), annotation_key=KEY, queue_size=2)
    try:
        started = time.monotonic()
        for i in range(10):  # ten different stories for ten pods
            pod = PodRef(namespace="ml", name=f"p{i}", uid=f"uid-{i}")
            events.observe(report(i + 1, dataclasses.replace(CAPPED, owners=(pod,))))
        # A hang guard, not a speed claim: the sink holds each post for a minute, so a
        # caller that waited for room in the queue would be held that long.
        assert time.monotonic() - started < 10
        assert events.dropped >= 7  # one in the sink's hands, two queued
    finally:
        gate.set()
        events.close()


def test_a_refusing_api_is_counted_and_the_poster_goes_on() -> None:
    """Events the API refuses are counted as failed; later ones are still posted."""
    sink = Collecting(fail=True)
    events = PodEvents(sink, annotation_key=KEY)
    try:
        events.observe(report(1, CAPPED))
        settle(events, 1)
        assert events.failed == 1
        sink.fail = False
        events.observe(report(2, safe_default(SafeDefaultCause.INVALID)))
        settle(events, 2)
        assert events.posted == 1
    finally:
        events.close()


def test_a_bug_deriving_events_never_reaches_the_agent_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """observe() runs in the agent loop: whatever goes wrong inside is logged, not raised."""
    events = PodEvents(Collecting(), annotation_key=KEY)
    try:
        broken = report(1, CAPPED)
        object.__setattr__(broken, "gpus", None)  # not iterable: a bug inside observe
        events.observe(broken)
    finally:
        events.close()
    assert "cannot derive events from cycle 1" in caplog.text
