"""The scenario file format: the built-in scenario, the docs example, and strict validation."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from capwatch.agent.dra.claims import API_VERSION, KIND
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.sim.proctree import CgroupLayout, QosClass
from capwatch.agent.sim.scenario import (
    ALWAYS,
    CycleRange,
    FaultOp,
    FaultSpec,
    default_scenario,
    load_scenario,
    parse_scenario,
)
from capwatch.agent.sim.scenario_devices import DeviceFaultKind
from capwatch.kit.errors import ConfigError, ScenarioError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "scenario.md"
KEY = "capwatch.io/gpu-power-limit"
UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-8999-aaaaaaaaaaaa"


def base() -> dict[str, Any]:
    """A small valid document every invalid case below starts from."""
    return {
        "node_name": "n",
        "safe_default_watts": 300,
        "gpus": [
            {"uuid": "GPU-0", "min_watts": 100, "max_watts": 400, "default_watts": 400},
            {"uuid": "GPU-1", "min_watts": 100, "max_watts": 400, "default_watts": 400},
        ],
        "pods": [
            {"namespace": "ns", "name": "a", "uid": UID_A, "annotations": {KEY: "250"}},
            {"namespace": "ns", "name": "b", "uid": UID_B, "cycles": {"from": 2, "to": 4}},
        ],
        "processes": [
            {"gpu": 0, "pid": 10, "pod": UID_A},
            {"gpu": 1, "pid": 20, "pod": UID_B},
            {"gpu": 1, "pid": 30},
        ],
        "faults": [{"op": "set_limit", "gpu": 0, "error": "no_permission", "cycles": 3}],
    }


def test_the_base_document_is_valid_and_parses_every_field() -> None:
    """The fixture is valid, so each invalid case below fails for its one mutation only."""
    s = parse_scenario(base(), source="t")
    assert s.node_name == "n"
    assert s.safe_default_watts == 300
    assert [g.uuid for g in s.gpus] == ["GPU-0", "GPU-1"]
    assert s.pods[0].annotations == {KEY: "250"}
    assert s.pods[0].cycles == ALWAYS
    assert s.pods[1].cycles == CycleRange(first=2, last=4)
    assert s.processes[2].pod is None
    # A process without cycles lives as long as its pod.
    assert s.processes[1].cycles == CycleRange(first=2, last=4)
    assert s.processes[0].qos is QosClass.BURSTABLE
    assert s.processes[0].cgroup_layout is CgroupLayout.V2_SYSTEMD_CONTAINERD
    assert s.faults == (
        FaultSpec(
            op=FaultOp.SET_LIMIT,
            gpu=0,
            error=GpuErrorClass.NO_PERMISSION,
            cycles=CycleRange(first=3, last=3),
        ),
    )
    assert s.interval_seconds is None
    assert s.description == ""
    assert s.source == "t"


def test_default_scenario_is_the_documented_demo() -> None:
    """The built-in scenario parses and contains each story the demo promises, the lost
    GPU's and the claim's included: the batch job's claim asks a cap for GPU 5 from the
    cycle its pod is bound, two cycles before its process starts."""
    s = default_scenario()
    assert s.node_name == "sim-node-0"
    assert s.safe_default_watts == 300
    assert s.interval_seconds == 2
    assert s.source == "builtin:default.yaml"
    assert all((g.min_watts, g.max_watts, g.default_watts) == (200, 700, 700) for g in s.gpus)
    values = {p.name: p.annotations.get(KEY) for p in s.pods}
    assert values["trainer-0"] == "450"
    assert values["server-a"] == values["server-b"] == "350"
    assert values["notebook"] is not None
    assert not values["notebook"].isdigit()
    assert int(values["frames-7"] or 0) > 700
    busy = {p.gpu for p in s.processes}
    assert len(s.gpus) - len(busy) == 1, "exactly one GPU is idle throughout"
    assert any(p.pod is None for p in s.processes), "a non-Kubernetes process"
    transient = next(p for p in s.pods if p.cycles != ALWAYS)
    assert transient.cycles == CycleRange(first=3, last=8)
    assert KEY not in transient.annotations, "its cap comes from its claim"
    assert [(p.gpu, p.cycles) for p in s.processes if p.pod == transient.uid] == [
        (5, CycleRange(first=5, last=8))
    ]
    (claim,) = s.claims
    assert (str(claim), claim.reserved_for, claim.cycles) == (
        "batch/nightly-etl-gpu",
        (transient.ref,),
        transient.cycles,
    )
    assert [d.device for d in claim.devices] == ["gpu-5"]
    assert claim.cap is not None
    assert claim.cap.value == {"apiVersion": API_VERSION, "kind": KIND, "watts": 250}
    assert s.slices is None, "the node's slice is derived from its GPUs"
    (fault,) = s.faults
    assert (fault.op, fault.error, fault.cycles) == (
        FaultOp.SET_LIMIT,
        GpuErrorClass.NO_PERMISSION,
        CycleRange(first=4, last=6),
    )
    (device_fault,) = s.device_faults  # GPU 4 is lost for three cycles, then answers again
    assert (device_fault.kind, device_fault.gpu, device_fault.cycles) == (
        DeviceFaultKind.LOST,
        4,
        CycleRange(first=12, last=14),
    )
    assert 4 not in busy, "the lost GPU is the idle one: nothing of the other stories changes"


def test_docs_examples_are_valid_scenarios() -> None:
    """Every yaml example in docs/scenario.md parses (the slices example and the annotated
    one, last), so the docs cannot rot silently."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 2, "docs/scenario.md has its two yaml examples"
    *_, s = [parse_scenario(yaml.safe_load(b), source="docs") for b in blocks]
    assert [f.op for f in s.faults] == [FaultOp.UUID, FaultOp.PROCESSES, FaultOp.POD_VIEW]
    assert [str(c) for c in s.claims] == ["team-a/train-gpu", "team-b/short-job-gpu"]
    assert s.faults[0].identity_check_only
    assert s.processes[3].cycles == CycleRange(first=6, last=6)


def test_json_and_yaml_files_load_alike(tmp_path: Path) -> None:
    """A JSON file is accepted (JSON is YAML) and gives the same scenario as YAML."""
    as_json = tmp_path / "s.json"
    as_json.write_text(json.dumps(base()), encoding="utf-8")
    as_yaml = tmp_path / "s.yaml"
    as_yaml.write_text(yaml.safe_dump(base()), encoding="utf-8")
    loaded_json, loaded_yaml = load_scenario(as_json), load_scenario(as_yaml)
    assert loaded_json.source == str(as_json)
    assert loaded_json.gpus == loaded_yaml.gpus
    assert loaded_json.processes == loaded_yaml.processes
    assert loaded_json.faults == loaded_yaml.faults


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, CycleRange(first=3, last=3)),
        ({"from": 2}, CycleRange(first=2)),
        ({"from": 2, "to": None}, CycleRange(first=2)),
        ({"from": 2, "to": 5}, CycleRange(first=2, last=5)),
    ],
)
def test_cycle_range_forms(value: object, expected: CycleRange) -> None:
    """Each documented form of ``cycles`` parses to the range it names."""
    doc = base()
    doc["faults"][0]["cycles"] = value
    assert parse_scenario(doc, source="t").faults[0].cycles == expected


def test_cycle_range_contains_is_inclusive_and_always_covers_startup() -> None:
    """Both ends are inclusive; ALWAYS also covers cycle 0 (start-up), explicit ranges do not."""
    r = CycleRange(first=4, last=6)
    assert [c for c in range(9) if r.contains(c)] == [4, 5, 6]
    assert CycleRange(first=2).contains(10**9)
    assert not CycleRange(first=2).contains(1)
    assert ALWAYS.contains(0)
    assert ALWAYS.contains(1)
    assert not CycleRange(first=1).contains(0)
    with pytest.raises(ValueError, match="invalid cycle range"):
        CycleRange(first=5, last=4)


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``a.b[0].c``-style ``path`` in the document to ``value``."""

    def mutate(doc: dict[str, Any]) -> None:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        target: Any = doc
        for part in parts[:-1]:
            target = target[int(part[1:-1])] if part.startswith("[") else target[part]
        last = parts[-1]
        target[int(last[1:-1]) if last.startswith("[") else last] = value

    return mutate


def _delete(path: str, key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            target = target[int(part[1:-1])] if part.startswith("[") else target[part]
        del target[key]

    return mutate


def _fault(**fields: object) -> Callable[[dict[str, Any]], None]:
    return _set("faults[0]", fields)


INVALID = [
    # (id, mutation, option, fragment of the reason)
    ("unknown top key", _set("gpu", []), "gpu", "unknown key 'gpu'; did you mean 'gpus'?"),
    ("unknown gpu key", _set("gpus[1].max_wats", 1), "gpus[1].max_wats", "did you mean"),
    ("not a mapping", lambda d: d.clear() or d.update(x=1), "x", "unknown key"),
    ("missing node_name", _delete("", "node_name"), "node_name", "required key is missing"),
    ("missing gpu uuid", _delete("gpus[0]", "uuid"), "gpus[0].uuid", "required key is missing"),
    ("node_name not str", _set("node_name", 5), "node_name", "expected a string, got number 5"),
    ("empty node_name", _set("node_name", " "), "node_name", "must not be empty"),
    ("gpus not list", _set("gpus", {"a": 1}), "gpus", "expected a list, got a mapping"),
    ("gpu not mapping", _set("gpus[0]", "GPU-0"), "gpus[0]", "expected a mapping"),
    ("watts is bool", _set("safe_default_watts", True), "safe_default_watts", "boolean true"),
    ("watts is float", _set("gpus[0].max_watts", 350.5), "gpus[0].max_watts", "integer"),
    ("watts is str", _set("gpus[0].max_watts", "350"), "gpus[0].max_watts", "string '350'"),
    ("zero watts", _set("safe_default_watts", 0), "safe_default_watts", "must be >= 1, got 0"),
    ("min above max", _set("gpus[1].min_watts", 500), "gpus[1].min_watts", "above max_watts"),
    ("default out", _set("gpus[0].default_watts", 50), "gpus[0].default_watts", "outside"),
    ("dup uuid", _set("gpus[1].uuid", "GPU-0"), "gpus[1].uuid", "duplicate uuid 'GPU-0'"),
    (
        "int annotation",
        lambda d: d["pods"][0]["annotations"].update({KEY: 250}),
        f'pods[0].annotations["{KEY}"]',
        f'must be strings, got number 250; quote it: {KEY}: "250"',
    ),
    ("annotations list", _set("pods[0].annotations", ["x"]), "pods[0].annotations", "mapping"),
    ("pod uid not uuid", _set("pods[0].uid", "pod-a"), "pods[0].uid", "not a lower-case UUID"),
    ("upper pod uid", _set("pods[1].uid", UID_B.upper()), "pods[1].uid", "lower-case UUID"),
    ("dup pod uid", _set("pods[1].uid", UID_A), "pods[1].uid", "duplicate pod uid"),
    ("dup pod name", _set("pods[1].name", "a"), "pods[1].name", "ns/a is also pods[0]"),
    ("dangling gpu", _set("processes[0].gpu", 9), "processes[0].gpu", "no GPU at index 9"),
    ("negative gpu", _set("processes[0].gpu", -1), "processes[0].gpu", "must be >= 0"),
    ("dangling pod", _set("processes[0].pod", UID_A[:-1] + "0"), "processes[0].pod", "no pod"),
    ("zero pid", _set("processes[0].pid", 0), "processes[0].pid", "must be >= 1"),
    ("dup pid", _set("processes[2].pid", 20), "processes[2].pid", "duplicate pid 20 on gpu 1"),
    (
        "pid two cgroups",
        _set("processes[2]", {"gpu": 0, "pid": 20}),
        "processes[2].pid",
        "one cgroup",
    ),
    ("bad qos", _set("processes[0].qos", "gold"), "processes[0].qos", "expected one of"),
    ("bad layout", _set("processes[0].cgroup_layout", "v3"), "processes[0].cgroup_layout", "v2-"),
    ("cycles zero", _set("pods[1].cycles", 0), "pods[1].cycles", "must be >= 1"),
    ("cycles to<from", _set("pods[1].cycles.to", 1), "pods[1].cycles.to", "ends before"),
    ("cycles no from", _set("pods[1].cycles", {"to": 3}), "pods[1].cycles.from", "missing"),
    ("cycles str", _set("pods[1].cycles", "3-5"), "pods[1].cycles", "{from: N, to: M}"),
    ("cycles key", _set("pods[1].cycles.until", 9), "pods[1].cycles.until", "unknown key"),
    ("unknown op", _fault(op="set_power", gpu=0, error="unknown"), "faults[0].op", "set_limit"),
    (
        "error and hang",
        _fault(op="set_limit", gpu=0, error="unknown", hang=1),
        "faults[0]",
        "exactly one of error or hang; found both error and hang",
    ),
    ("no action", _fault(op="restore", gpu=0), "faults[0]", "found none"),
    (
        "unknown error",
        _fault(op="uuid", gpu=0, error="nopermission"),
        "faults[0].error",
        "unknown value 'nopermission'; expected one of: uninitialized,",
    ),
    (
        "gpu on device_count",
        _fault(op="device_count", gpu=0, error="unknown"),
        "faults[0].gpu",
        "not per GPU",
    ),
    ("gpu on pod_view", _fault(op="pod_view", gpu=1, hang=1), "faults[0].gpu", "not per GPU"),
    ("missing gpu", _fault(op="processes", error="unknown"), "faults[0].gpu", "required"),
    ("fault gpu dangling", _fault(op="uuid", gpu=2, hang=1), "faults[0].gpu", "no GPU at index 2"),
    ("zero hang", _fault(op="uuid", gpu=0, hang=0), "faults[0].hang", "positive"),
    ("inf hang", _fault(op="uuid", gpu=0, hang=float("inf")), "faults[0].hang", "finite"),
    (
        "change_to off uuid",
        _fault(op="set_limit", gpu=0, change_to="GPU-9"),
        "faults[0].change_to",
        "only the 'uuid' op",
    ),
    (
        "change_to own",
        _fault(op="uuid", gpu=0, change_to="GPU-0"),
        "faults[0].change_to",
        "own uuid",
    ),
    (
        "check_only not bool",
        _fault(op="uuid", gpu=0, error="unknown", identity_check_only="yes"),
        "faults[0].identity_check_only",
        "true or false",
    ),
    ("interval", _set("interval_seconds", -2), "interval_seconds", "positive"),
    ("description", _set("description", 7), "description", "expected a string"),
]


@pytest.mark.parametrize(
    ("mutate", "option", "fragment"),
    [pytest.param(m, o, f, id=i) for i, m, o, f in INVALID],
)
def test_invalid_documents_name_the_bad_key(
    mutate: Callable[[dict[str, Any]], None], option: str, fragment: str
) -> None:
    """Each invalid document raises ScenarioError at the path of its bad key, saying why."""
    doc = copy.deepcopy(base())
    mutate(doc)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(doc, source="case.yaml")
    assert caught.value.option == option
    assert fragment in caught.value.reason
    assert caught.value.reason.endswith("(in case.yaml)")
    assert isinstance(caught.value, ConfigError)  # the CLI's one-line error path


@pytest.mark.parametrize(
    ("document", "fragment"),
    [(None, "the document is empty"), ([1, 2], "expected a mapping, got a list")],
)
def test_document_that_is_not_a_mapping(document: object, fragment: str) -> None:
    """An empty document or a non-mapping top level is reported against ``scenario``."""
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(document, source="t")
    assert caught.value.option == "scenario"
    assert fragment in caught.value.reason


def test_unreadable_file_is_a_scenario_error_chained_from_the_cause(tmp_path: Path) -> None:
    """A missing file and a directory both raise ScenarioError chained from the OSError."""
    for path in (tmp_path / "missing.yaml", tmp_path):
        with pytest.raises(ScenarioError) as caught:
            load_scenario(path)
        assert caught.value.option == "scenario"
        assert f"cannot read {path}" in caught.value.reason
        assert isinstance(caught.value.__cause__, OSError)


def test_non_utf8_file_is_a_scenario_error(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are reported as unreadable, not as a crash."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"node_name: n\xe9\n")
    with pytest.raises(ScenarioError, match="cannot read") as caught:
        load_scenario(path)
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("node_name: [unclosed\n", "2:1", "expected ',' or ']', but got '<stream end>'"),
        ("gpus: []\n\tnode_name: x\n", "2:1", "found character '\\t' that cannot start"),
        ("node_name: a\nnode_name: b\n", "2:1", "found duplicate key 'node_name'"),
        ("gpus:\n  - {uuid: a, uuid: b}\n", "2:15", "found duplicate key 'uuid'"),
    ],
)
def test_non_yaml_file_is_a_scenario_error_chained_from_the_cause(
    tmp_path: Path, text: str, where: str, fragment: str
) -> None:
    """Syntax errors and duplicate keys raise ScenarioError chained from PyYAML's error,
    on one line that says file:line:column (the second of two equal keys)."""
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.option == "scenario"
    assert caught.value.reason.startswith(f"not valid YAML at {path}:{where}: ")
    assert fragment in caught.value.reason
    assert "\n" not in caught.value.reason
    assert isinstance(caught.value.__cause__, yaml.YAMLError)


def _alias_bomb(levels: int) -> str:
    """A "billion laughs": each level nine aliases of the one before, 9**levels values."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("node_name: &name n1\n", "1:12"),
        ("node_name: n1\ngpus:\n  - &gpu {uuid: GPU-0}\n", "3:5"),
        ("defaults: &d {a: 1}\ngpus:\n  - <<: *d\n", "1:11"),
        (_alias_bomb(7), "1:5"),
        (_alias_bomb(9), "1:5"),  # 387 million values: never finished before
    ],
    ids=["scalar-anchor", "mapping-anchor", "merge-key", "bomb-7", "bomb-9"],
)
def test_anchors_and_aliases_are_refused_where_the_first_one_is(
    tmp_path: Path, text: str, where: str
) -> None:
    """No shipped scenario uses anchors or aliases, and a few lines of nested aliases
    expand beyond any validator's walk: the first anchor (or alias) is a one-line
    ScenarioError at its file:line:column, before anything is expanded."""
    path = tmp_path / "aliases.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.reason == (
        f"not valid YAML at {path}:{where}: anchors and aliases (&name, *name) are not "
        "supported: write each value out"
    )


VALID_FILE = """\
node_name: n
safe_default_watts: 300
gpus:
  - {uuid: GPU-0, min_watts: 100, max_watts: 400, default_watts: 400}
pods:
  - namespace: ns
    name: a
    uid: 11111111-2222-4333-8444-555555555555
    annotations:
      capwatch.io/gpu-power-limit: "250"
"""


@pytest.mark.parametrize(
    ("old", "new", "option", "where"),
    [
        ("max_watts: 400", "max_watts: lots", "gpus[0].max_watts", "4:35"),
        ("    name: a\n", "    name: a\n    nmae: b\n", "pods[0].nmae", "8:5"),
        ("    name: a\n", "", "pods[0].name", "6:5"),  # missing: where its mapping starts
        ('"250"', "250", 'pods[0].annotations["capwatch.io/gpu-power-limit"]', "10:7"),
        ("safe_default_watts: 300\n", "", "safe_default_watts", "1:1"),
    ],
)
def test_invalid_value_in_a_file_names_file_line_and_column(
    tmp_path: Path, old: str, new: str, option: str, where: str
) -> None:
    """A value the validator refuses is reported at the file, line and column it is on
    (a missing key at its mapping's), after the path to it."""
    assert old in VALID_FILE
    path = tmp_path / "s.yaml"
    path.write_text(VALID_FILE.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.option == option
    assert caught.value.reason.endswith(f"(in {path}:{where})")


def test_valid_file_fixture_is_valid(tmp_path: Path) -> None:
    """The file the position cases edit is valid, so each fails for its one edit only."""
    path = tmp_path / "s.yaml"
    path.write_text(VALID_FILE, encoding="utf-8")
    assert load_scenario(path).pods[0].annotations == {KEY: "250"}


def test_fault_spec_rejects_inconsistent_construction() -> None:
    """Building a FaultSpec in code enforces the same invariants the parser reports."""
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.SET_LIMIT, gpu=0)  # no action
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.SET_LIMIT, gpu=0, error=GpuErrorClass.UNKNOWN, hang_seconds=1)
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.POD_VIEW, gpu=0, error=GpuErrorClass.UNKNOWN)
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.RESTORE, error=GpuErrorClass.UNKNOWN)  # no gpu
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.RESTORE, gpu=0, change_to="GPU-x")
    with pytest.raises(ValueError, match="inconsistent fault"):
        FaultSpec(op=FaultOp.UUID, gpu=0, hang_seconds=-1.0)
    assert FaultSpec(op=FaultOp.UUID, gpu=0, change_to="GPU-x").cycles == ALWAYS
