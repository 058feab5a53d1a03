"""Forgetting a vanished GPU at an operator's request (agent/forgetting.py, `capwatch forget`).

A GPU the agent capped that stops being visible fails every cycle (its
release is deferred) until an operator says it is gone for good. These tests
run the real reconciler on the simulator, with the request made by the real
command line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.forgetting import DIRECTORY, ForgetRequests
from capwatch.agent.ownership import FILE_NAME, FORMAT_VERSION, OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import Reason
from capwatch.agent.sim.scenario import FaultOp, FaultSpec
from capwatch.agent.stepping import Policy
from capwatch.cli import main
from capwatch.kit.clock import FakeClock
from tests.contract.conftest import KEY, POD_A, PODS, SAFE_W
from tests.contract.rigs import GPU_COUNT, UUIDS, SimRig
from tests.fakes.pods import StaticPodView

REPLACEMENT = "GPU-feedface-0000-4000-8000-000000000002"


class Node:
    """An agent's reconciler over a simulated node, with its state directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.state = tmp_path / "state"
        self.rig = SimRig(tmp_path / "proc")
        self.store = OwnershipStore(self.state, clock=FakeClock())
        self.store.load()
        self.reconciler = Reconciler(
            backend=self.rig.backend,
            pods=StaticPodView(PODS),
            attributor=Attributor(FsProcRoot(tmp_path / "proc")),
            store=self.store,
            clock=FakeClock(),
            policy=Policy(annotation_key=KEY, safe_default_watts=SAFE_W),
            initial_device_count=GPU_COUNT,
            listeners=self.rig.listeners,
            forget=ForgetRequests(self.state),
        )

    def cap_then_lose_gpu_2(self) -> None:
        """GPU 2 is capped for pod A, then another device answers at its index."""
        self.rig.run(2, {1001: POD_A.ref.uid})
        assert self.reconciler.reconcile_once().enforced
        self.rig.run(2, {})
        self.rig.world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=2, change_to=REPLACEMENT))

    def forget(self, *uuids: str) -> int:
        return main(["forget", "--state-dir", str(self.state), *uuids], environ={})

    def requests(self) -> list[str]:
        directory = self.state / DIRECTORY
        return sorted(p.name for p in directory.iterdir()) if directory.exists() else []

    def recorded(self) -> set[str]:
        return set(json.loads((self.state / FILE_NAME).read_text())["gpus"])


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_vanished_gpu_fails_every_cycle_until_it_is_forgotten(
    node: Node, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Deferred release fails each cycle; `capwatch forget` ends that at the next cycle,
    drops the GPU from the persisted record and consumes the request."""
    node.cap_then_lose_gpu_2()
    for _ in range(2):
        report = node.reconciler.reconcile_once()
        assert not report.enforced
        assert [g.reason for g in report.gpus if g.uuid == UUIDS[2]] == [Reason.RELEASE_DEFERRED]
    assert node.forget(UUIDS[2]) == 0
    assert f"{UUIDS[2]} (index 2, 350 W)" in capsys.readouterr().out
    assert node.requests() == [UUIDS[2]]
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.forgetting"):
        report = node.reconciler.reconcile_once()
    assert report.enforced, report.failure_summary
    assert UUIDS[2] not in {g.uuid for g in report.gpus}
    assert node.requests() == []
    assert UUIDS[2] not in node.recorded()
    assert any(
        "forgot GPU" in r.getMessage() and "team/a" in r.getMessage() for r in caplog.records
    )


def test_a_visible_gpu_is_not_forgotten(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """A request for a GPU still visible is refused and consumed; the record keeps it,
    and its cap is released the usual way once its pods are gone."""
    node.rig.run(2, {1001: POD_A.ref.uid})
    node.reconciler.reconcile_once()
    assert node.forget(UUIDS[2]) == 0
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.forgetting"):
        assert node.reconciler.reconcile_once().enforced
    assert node.requests() == []
    assert node.store.get(UUIDS[2]) is not None
    assert any("refused: the GPU is visible" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("uuids", "message"),
    [
        (["GPU-00000000-0000-4000-8000-00000000dead"], "is not in the ownership record"),
        (["../ownership.json"], "is not a GPU UUID"),
        ([UUIDS[2], "GPU-nope"], "GPU-nope is not in the ownership record"),
    ],
    ids=["not-capped", "a-path", "one-of-two-bad"],
)
def test_bad_requests_are_refused_whole(
    node: Node, capsys: pytest.CaptureFixture[str], uuids: list[str], message: str
) -> None:
    """A UUID the record does not hold, or that is not a UUID, fails the command (exit 1),
    names the capped GPUs, and writes no request at all."""
    node.cap_then_lose_gpu_2()
    assert node.forget(*uuids) == 1
    err = capsys.readouterr().err
    assert message in err
    assert node.requests() == []


@pytest.mark.parametrize("where", ["empty", "missing"])
def test_forget_where_there_is_no_record_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """A state directory with no ownership record (not the agent's, or one where no agent
    ever capped a GPU) is named as such, exit 1, and no request is left behind."""
    state = tmp_path if where == "empty" else tmp_path / "nowhere"
    assert main(["forget", "--state-dir", str(state), UUIDS[0]], environ={}) == 1
    err = capsys.readouterr().err
    assert err == (
        f"capwatch forget: no ownership record in {state}: no agent has capped a GPU from "
        "this state directory (is it the agent's --state-dir?); nothing to forget\n"
    )
    assert not (state / DIRECTORY).exists()


def test_forget_with_an_empty_record_names_no_capped_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent that released everything leaves an empty record: nothing to forget."""
    (tmp_path / FILE_NAME).write_text(json.dumps({"version": FORMAT_VERSION, "gpus": {}}))
    assert main(["forget", "--state-dir", str(tmp_path), UUIDS[0]], environ={}) == 1
    assert "capped GPUs: none" in capsys.readouterr().err


def test_an_unreadable_record_is_reported_and_left_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command never moves an unreadable record aside: that is the agent's decision."""
    (tmp_path / FILE_NAME).write_text("{not json")
    assert main(["forget", "--state-dir", str(tmp_path), UUIDS[0]], environ={}) == 1
    assert "is unreadable" in capsys.readouterr().err
    assert (tmp_path / FILE_NAME).read_text() == "{not json"


@pytest.mark.parametrize("text", ["[]", "null", '"x"', "7", "[" * 50_000 + "]" * 50_000])
def test_a_record_of_the_wrong_shape_is_reported_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """Valid JSON that is no record (or too deeply nested to parse) fails the command with
    one line, exit 1, and leaves the file as it was."""
    (tmp_path / FILE_NAME).write_text(text)
    assert main(["forget", "--state-dir", str(tmp_path), UUIDS[0]], environ={}) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "is unreadable" in err
    assert (tmp_path / FILE_NAME).read_text() == text


def test_state_dir_comes_from_the_environment_twin(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    """CAPWATCH_STATE_DIR, the agent's own twin, points `capwatch forget` at the record."""
    node.cap_then_lose_gpu_2()
    assert main(["forget", UUIDS[2]], environ={"CAPWATCH_STATE_DIR": str(node.state)}) == 0
    assert node.requests() == [UUIDS[2]]


def test_stray_files_in_the_request_directory_are_discarded(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A request naming no capped GPU is logged and removed; a half-written one (dot name)
    and anything that is not a file are left alone; the cycle is unaffected."""
    node.rig.run(2, {1001: POD_A.ref.uid})
    directory = node.state / DIRECTORY
    directory.mkdir(parents=True)
    (directory / "GPU-unknown").write_text("")
    (directory / ".GPU-partial.123").write_text("")
    (directory / "a-directory").mkdir()
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.forgetting"):
        assert node.reconciler.reconcile_once().enforced
    assert node.requests() == [".GPU-partial.123", "a-directory"]
    assert any("GPU-unknown: not a GPU this agent capped" in r.getMessage() for r in caplog.records)
