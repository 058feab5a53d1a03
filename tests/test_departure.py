"""Leaving the node: the DaemonSet controller's rules over real-shaped objects, the
reads and what their failures mean, and the stop sequence that restores only when
capwatch is leaving (docs/upgrades.md)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from capwatch.agent import lifecycle
from capwatch.agent.capping import Mode
from capwatch.agent.departure import Departure
from capwatch.agent.kube.departure import KubeDepartureCheck
from capwatch.agent.kube.selection import judge, not_selected
from capwatch.kube.client import ObjectReadError
from capwatch.kube.wire import ApiStatusError
from tests.contract.conftest import POD_A
from tests.contract.rigs import DEFAULT_W
from tests.test_running import build, wait_until

NODE = "gpu-1"
NS = "capwatch"
POD = "capwatch-abcde"
DS = "capwatch"


def node(labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "labels": labels or {}, **extra}, "spec": {}}


def daemonset(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": DS, **meta}, "spec": {"template": {"spec": spec or {}}}}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


# -- the rules ---------------------------------------------------------------------------


def test_a_daemonset_that_still_selects_the_node_keeps_the_caps():
    """Present, not deleting, nodeSelector and affinity matching: staying."""
    spec = {"nodeSelector": {"gpu": "yes"}} | required(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    )
    verdict = judge(
        daemonset=daemonset(spec), name=f"{NS}/{DS}", node=node({"gpu": "yes", "zone": "b"}),
        node_name=NODE,
    )  # fmt: skip
    assert not verdict.leaving
    assert (
        verdict.reason
        == f"DaemonSet {NS}/{DS} still runs on node {NODE}: its next pod adopts the caps"
    )


@pytest.mark.parametrize(
    ("ds", "found_node", "why"),
    [
        (None, node(), f"DaemonSet {NS}/{DS} is deleted"),
        (daemonset(deletionTimestamp="2026-12-04T00:00:00Z"), node(), "is being deleted"),
        (daemonset(), None, f"node {NODE} is deleted"),
        (
            daemonset(),
            node(deletionTimestamp="2026-12-04T00:00:00Z"),
            "node gpu-1 is being deleted",
        ),
        (daemonset({"nodeSelector": {"gpu": "yes"}}), node({"gpu": "no"}), "nodeSelector gpu=yes"),
    ],
)
def test_gone_deleting_or_unselected_is_leaving(ds, found_node, why):
    """The DaemonSet or the node deleted or being deleted, or a nodeSelector the node no
    longer matches: leaving, and the reason says which."""
    verdict = judge(daemonset=ds, name=f"{NS}/{DS}", node=found_node, node_name=NODE)
    assert verdict.leaving
    assert why in verdict.reason


def gen(operator: str, value: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "gen", "operator": operator, "values": [value]}]}


@pytest.mark.parametrize(
    ("term", "labels", "selected"),
    [
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]},
            {"gen": "9"},
            True,
        ),
        (
            {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["8"]}]},
            {"gen": "9"},
            False,
        ),
        (
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]},
            {"gen": "x"},
            False,
        ),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}, {}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}, {}, False),
        ({}, {"gpu": "yes"}, False),  # an empty term matches no node
    ],
)
def test_required_node_affinity_as_the_scheduler_reads_it(term, labels, selected):
    """Each operator of a node selector term, on labels and on the node's name."""
    assert (not_selected(required(term), node(labels)) is None) is selected


def test_terms_are_ored_and_expressions_anded():
    """One matching term is enough; within a term every expression must hold."""
    both = {"matchExpressions": [
        {"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"},
    ]}  # fmt: skip
    other = {"matchExpressions": [{"key": "c", "operator": "Exists"}]}
    assert not_selected(required(both, other), node({"a": "1"})) == "required node affinity"
    assert not_selected(required(both, other), node({"a": "1", "b": "1"})) is None
    assert not_selected(required(both, other), node({"c": "1"})) is None


def tainted(*taints: dict[str, str]) -> dict[str, Any]:
    found = node()
    found["spec"]["taints"] = list(taints)
    return found


def test_only_an_untolerated_noexecute_taint_drops_the_pod():
    """NoSchedule taints leave a running DaemonSet pod be; a NoExecute one it does not
    tolerate evicts it; the not-ready and unreachable taints are tolerated by every
    DaemonSet pod (the controller adds those tolerations)."""
    assert not_selected({}, tainted({"key": "maint", "effect": "NoSchedule"})) is None
    assert (
        not_selected({}, tainted({"key": "maint", "value": "now", "effect": "NoExecute"}))
        == "taint maint=now:NoExecute not tolerated"
    )
    down = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    assert not_selected({}, tainted(down)) is None


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),  # tolerates everything
        ({"key": "maint", "operator": "Exists"}, True),
        ({"key": "maint", "operator": "Equal", "value": "now"}, True),
        ({"key": "maint", "value": "now", "effect": "NoExecute"}, True),  # Equal by default
        ({"key": "maint", "value": "later"}, False),
        ({"key": "maint", "operator": "Exists", "effect": "NoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_as_the_api_defines_them(toleration, tolerated):
    """Key, value, operator and effect, with their defaults."""
    taint = tainted({"key": "maint", "value": "now", "effect": "NoExecute"})
    assert (not_selected({"tolerations": [toleration]}, taint) is None) is tolerated


# -- the reads -----------------------------------------------------------------------------


class FakeObjects:
    """GETs answered from a dict of paths; an exception in it is raised instead."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def get(self, path: str) -> dict[str, Any]:
        self.asked.append(path)
        answer = self.answers.get(path, ApiStatusError(status=404, reason="Not Found"))
        if isinstance(answer, BaseException):
            raise answer
        return answer


POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"
DS_PATH = f"/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}"
NODE_PATH = f"/api/v1/nodes/{NODE}"
OWNED = {
    "metadata": {
        "name": POD,
        "ownerReferences": [{"kind": "DaemonSet", "name": DS, "controller": True}],
    }
}


def check(answers: dict[str, Any]) -> tuple[Departure, list[str]]:
    objects = FakeObjects(answers)
    verdict = KubeDepartureCheck(objects, namespace=NS, pod_name=POD, node_name=NODE).check()
    return verdict, objects.asked


def test_the_reads_are_pod_then_daemonset_then_node():
    """Three GETs: the pod names its DaemonSet; the DaemonSet and the node decide."""
    verdict, asked = check({POD_PATH: OWNED, DS_PATH: daemonset(), NODE_PATH: node()})
    assert not verdict.leaving
    assert asked == [POD_PATH, DS_PATH, NODE_PATH]


def test_a_deleted_daemonset_is_leaving_without_asking_for_the_node():
    """helm uninstall: the DaemonSet is gone (404) by the time its pods stop."""
    verdict, asked = check({POD_PATH: OWNED})
    assert verdict.leaving
    assert verdict.reason == f"DaemonSet {NS}/{DS} is deleted"
    assert asked == [POD_PATH, DS_PATH]


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_leaving(status):
    """The release's service account or binding already deleted: uninstall."""
    verdict, _ = check({POD_PATH: ApiStatusError(status=status, reason="no")})
    assert verdict.leaving
    assert f"HTTP {status}" in verdict.reason


@pytest.mark.parametrize(
    "failure",
    [
        ApiStatusError(status=500, reason="etcd timeout"),
        ApiStatusError(status=429, reason="slow down"),
        ObjectReadError(f"GET {DS_PATH}: ReadTimeoutError: timed out"),
    ],
)
def test_what_cannot_be_told_keeps_the_caps(failure):
    """An API server that fails, throttles or times out: staying, saying why."""
    verdict, _ = check({POD_PATH: OWNED, DS_PATH: failure})
    assert not verdict.leaving
    assert verdict.reason.startswith("cannot tell whether capwatch is leaving the node (")


def test_a_pod_not_found_is_unknown_and_a_pod_of_no_daemonset_leaves():
    """Our own pod missing cannot be explained: the caps stay. A bare pod (no DaemonSet
    controls it) has no next pod to adopt its caps: leaving."""
    missing, _ = check({})
    assert not missing.leaving
    bare, _ = check({POD_PATH: {"metadata": {"name": POD, "ownerReferences": []}}})
    assert bare.leaving
    assert "not run by a DaemonSet" in bare.reason


# -- the stop sequence -------------------------------------------------------------------


class Answer:
    def __init__(self, departure: Departure | None, hang: threading.Event | None = None) -> None:
        self.departure, self.hang = departure, hang

    def check(self) -> Departure:
        if self.hang is not None:
            self.hang.wait(30)
        assert self.departure is not None
        return self.departure


async def run_and_stop(tmp_path, **kwargs):
    rig, _, hub, agent = build(tmp_path, **kwargs)
    rig.run(0, {1001: POD_A.ref.uid})
    stop = asyncio.Event()
    agent.start(stop)
    await wait_until(lambda: hub.readiness().ready)
    stop.set()
    return rig, await agent.stop()


@pytest.mark.asyncio
async def test_staying_leaves_the_caps_for_the_next_agent(tmp_path):
    """A rollout: the DaemonSet still runs here, so the stop writes nothing."""
    staying = Departure(leaving=False, reason="DaemonSet still runs on node rig")
    rig, summary = await run_and_stop(tmp_path, departure=Answer(staying))
    assert summary.departure == staying
    assert summary.restored == ()
    assert rig.limit_mw(0) == 350_000
    assert [w.milliwatts for w in rig.writes()] == [350_000]


@pytest.mark.asyncio
async def test_leaving_restores_the_defaults(tmp_path):
    """An uninstall: every GPU this agent capped gets its default back."""
    leaving = Departure(leaving=True, reason="DaemonSet capwatch/capwatch is deleted")
    rig, summary = await run_and_stop(tmp_path, departure=Answer(leaving))
    assert summary.departure == leaving
    assert [r.outcome.value for r in summary.restored] == ["released"]
    assert rig.limit_mw(0) == DEFAULT_W * 1000


@pytest.mark.asyncio
async def test_a_check_that_never_answers_keeps_the_caps(tmp_path, monkeypatch):
    """A departure check stuck past its bound: cannot tell, so the caps stay."""
    monkeypatch.setattr(lifecycle, "DEPARTURE_TIMEOUT_S", 0.2)
    hang = threading.Event()
    try:
        rig, summary = await run_and_stop(
            tmp_path, departure=Answer(Departure(leaving=True, reason="late"), hang)
        )
    finally:
        hang.set()
    assert summary.departure is not None
    assert not summary.departure.leaving
    assert "no answer within 0.2s" in summary.departure.reason
    assert rig.limit_mw(0) == 350_000


@pytest.mark.asyncio
async def test_observe_mode_neither_asks_nor_restores(tmp_path):
    """Observe mode wrote nothing and restores nothing, whatever the node's fate."""
    leaving = Answer(Departure(leaving=True, reason="DaemonSet gone"))
    rig, summary = await run_and_stop(tmp_path, departure=leaving, mode=Mode.OBSERVE)
    assert summary.departure is None
    assert rig.writes() == []


@pytest.mark.asyncio
async def test_no_pod_name_restores_as_a_standalone_agent(tmp_path):
    """Not run by a DaemonSet (no --agent-pod-name): nothing adopts the caps."""
    rig, summary = await run_and_stop(tmp_path)
    assert summary.departure is not None
    assert summary.departure.leaving
    assert rig.limit_mw(0) == DEFAULT_W * 1000
