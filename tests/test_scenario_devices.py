"""The scenario's ``device_faults`` section: every kind it takes, and strict validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from capwatch.agent.health.telemetry import ThrottleReason
from capwatch.agent.sim.cycles import ALWAYS, CycleRange
from capwatch.agent.sim.scenario import load_scenario, parse_scenario
from capwatch.agent.sim.scenario_devices import COUNT_MAX, XID_MAX, DeviceFaultKind, DeviceFaultSpec
from capwatch.kit.errors import ConfigError, ScenarioError

K = DeviceFaultKind


def base(*faults: dict[str, Any]) -> dict[str, Any]:
    """Two GPUs and the given device faults."""
    return {
        "node_name": "n",
        "safe_default_watts": 300,
        "gpus": [
            {"uuid": "GPU-0", "min_watts": 100, "max_watts": 400, "default_watts": 400},
            {"uuid": "GPU-1", "min_watts": 100, "max_watts": 400, "default_watts": 400},
        ],
        "device_faults": list(faults),
    }


def parsed(*faults: dict[str, Any]) -> tuple[DeviceFaultSpec, ...]:
    return parse_scenario(base(*faults), source="t").device_faults


def test_a_scenario_without_device_faults_has_none() -> None:
    """The section is optional: absent, the scenario has no device faults."""
    doc = base()
    del doc["device_faults"]
    assert parse_scenario(doc, source="t").device_faults == ()
    assert parsed() == ()


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            {"kind": "xid", "gpu": 1, "code": 79, "cycles": 3},
            DeviceFaultSpec(kind=K.XID, gpu=1, code=79, cycles=CycleRange(first=3, last=3)),
        ),
        (
            {"kind": "xid", "gpu": 0, "code": XID_MAX, "count": 10_000},
            DeviceFaultSpec(kind=K.XID, gpu=0, code=XID_MAX, count=10_000),
        ),
        ({"kind": "ecc", "gpu": 0}, DeviceFaultSpec(kind=K.ECC, gpu=0)),
        ({"kind": "ecc", "gpu": 0, "count": 3}, DeviceFaultSpec(kind=K.ECC, gpu=0, count=3)),
        (
            {"kind": "lost", "gpu": 1, "cycles": {"from": 2, "to": 4}},
            DeviceFaultSpec(kind=K.LOST, gpu=1, cycles=CycleRange(first=2, last=4)),
        ),
        (
            {"kind": "row_remap_failure", "gpu": 0, "cycles": {"from": 5}},
            DeviceFaultSpec(kind=K.ROW_REMAP_FAILURE, gpu=0, cycles=CycleRange(first=5)),
        ),
        (
            {"kind": "row_remap_pending", "gpu": 0},
            DeviceFaultSpec(kind=K.ROW_REMAP_PENDING, gpu=0),
        ),
        (
            {"kind": "throttle", "gpu": 0, "reasons": ["hw_thermal_slowdown", "hw_slowdown"]},
            DeviceFaultSpec(
                kind=K.THROTTLE,
                gpu=0,
                reasons=frozenset({ThrottleReason.HW_THERMAL_SLOWDOWN, ThrottleReason.HW_SLOWDOWN}),
            ),
        ),
        (
            {"kind": "unsupported", "gpu": 0, "reads": ["ecc", "row_remap"]},
            DeviceFaultSpec(kind=K.UNSUPPORTED, gpu=0, reads=frozenset({"ecc", "row_remap"})),
        ),
        (
            {"kind": "failing", "gpu": 1, "reads": ["power_draw"]},
            DeviceFaultSpec(kind=K.FAILING, gpu=1, reads=frozenset({"power_draw"})),
        ),
        ({"kind": "older_part", "gpu": 1}, DeviceFaultSpec(kind=K.OLDER_PART, gpu=1)),
    ],
    ids=lambda v: v["kind"] if isinstance(v, dict) else "",
)
def test_each_kind_parses_to_its_spec(item: dict[str, Any], expected: DeviceFaultSpec) -> None:
    """Every documented kind parses, with its own keys, to the spec it names; without
    ``cycles`` a fault holds in every cycle."""
    assert parsed(item) == (expected,)
    if "cycles" not in item:
        assert expected.cycles == ALWAYS


def test_every_kind_is_documented_and_parsed() -> None:
    """No kind is left out of the cases above or of docs/scenario.md."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "scenario.md").read_text()
    for kind in DeviceFaultKind:
        assert f"| `{kind.value}` |" in docs, kind


def test_faults_keep_their_file_order() -> None:
    """Several faults on one GPU, overlapping or not, are kept as listed."""
    items = [
        {"kind": "lost", "gpu": 0, "cycles": 2},
        {"kind": "xid", "gpu": 0, "code": 48, "cycles": 2},
        {"kind": "xid", "gpu": 0, "code": 13},
    ]
    assert [(f.kind, f.code) for f in parsed(*items)] == [(K.LOST, 0), (K.XID, 48), (K.XID, 13)]


INVALID = [
    # (id, item, option, fragment of the reason)
    ("not a mapping", "lost", "device_faults[0]", "expected a mapping, got string 'lost'"),
    ("no kind", {"gpu": 0}, "device_faults[0].kind", "required key is missing"),
    ("no gpu", {"kind": "lost"}, "device_faults[0].gpu", "required key is missing"),
    (
        "kind typo",
        {"kind": "xdi", "gpu": 0, "code": 79},
        "device_faults[0].kind",
        "unknown kind 'xdi'; did you mean 'xid'? (expected one of: xid, ecc, lost,",
    ),
    ("kind not str", {"kind": 79, "gpu": 0}, "device_faults[0].kind", "unknown kind 79"),
    (
        "key typo",
        {"kind": "xid", "gpu": 0, "cod": 79},
        "device_faults[0].cod",
        "unknown key 'cod'; did you mean 'code'?",
    ),
    (
        "key of another kind",
        {"kind": "ecc", "gpu": 0, "code": 79},
        "device_faults[0].code",
        "kind 'ecc' takes no 'code'; it takes count",
    ),
    (
        "count on a state",
        {"kind": "lost", "gpu": 0, "count": 2},
        "device_faults[0].count",
        "kind 'lost' takes no 'count'",
    ),
    ("xid no code", {"kind": "xid", "gpu": 0}, "device_faults[0].code", "required key"),
    ("xid zero", {"kind": "xid", "gpu": 0, "code": 0}, "device_faults[0].code", "must be >= 1"),
    ("xid negative", {"kind": "xid", "gpu": 0, "code": -79}, "device_faults[0].code", ">= 1"),
    (
        "xid too big",
        {"kind": "xid", "gpu": 0, "code": XID_MAX + 1},
        "device_faults[0].code",
        f"an XID number is at most 4294967295, got {XID_MAX + 1}",
    ),
    (
        "xid string",
        {"kind": "xid", "gpu": 0, "code": "79"},
        "device_faults[0].code",
        "expected an XID number, got string '79'",
    ),
    (
        "xid float",
        {"kind": "xid", "gpu": 0, "code": 79.0},
        "device_faults[0].code",
        "expected an XID number",
    ),
    ("xid bool", {"kind": "xid", "gpu": 0, "code": True}, "device_faults[0].code", "boolean"),
    ("zero count", {"kind": "ecc", "gpu": 0, "count": 0}, "device_faults[0].count", ">= 1"),
    (
        "huge count",
        {"kind": "ecc", "gpu": 0, "count": COUNT_MAX + 1},
        "device_faults[0].count",
        f"at most {COUNT_MAX} events a cycle",
    ),
    (
        "gpu out of range",
        {"kind": "lost", "gpu": 2},
        "device_faults[0].gpu",
        "no GPU at index 2; the scenario declares 2 GPU(s)",
    ),
    ("gpu negative", {"kind": "lost", "gpu": -1}, "device_faults[0].gpu", "must be >= 0"),
    ("gpu string", {"kind": "lost", "gpu": "0"}, "device_faults[0].gpu", "a GPU index"),
    (
        "bad cycles",
        {"kind": "lost", "gpu": 0, "cycles": {"from": 4, "to": 2}},
        "device_faults[0].cycles.to",
        "ends before it starts",
    ),
    ("no reasons", {"kind": "throttle", "gpu": 0}, "device_faults[0].reasons", "required key"),
    (
        "empty reasons",
        {"kind": "throttle", "gpu": 0, "reasons": []},
        "device_faults[0].reasons",
        "must name at least one reason; expected some of: gpu_idle,",
    ),
    (
        "reasons not list",
        {"kind": "throttle", "gpu": 0, "reasons": "hw_slowdown"},
        "device_faults[0].reasons",
        "expected a list, got string 'hw_slowdown'",
    ),
    (
        "reason typo",
        {"kind": "throttle", "gpu": 0, "reasons": ["hw_slowdown", "hw_thermal_slowdwn"]},
        "device_faults[0].reasons[1]",
        "unknown reason 'hw_thermal_slowdwn'; did you mean 'hw_thermal_slowdown'?",
    ),
    (
        "reason twice",
        {"kind": "throttle", "gpu": 0, "reasons": ["hw_slowdown", "hw_slowdown"]},
        "device_faults[0].reasons[1]",
        "'hw_slowdown' is listed twice",
    ),
    (
        "read typo",
        {"kind": "unsupported", "gpu": 0, "reads": ["eccc"]},
        "device_faults[0].reads[0]",
        "unknown read 'eccc'; did you mean 'ecc'? (expected one of: power_draw,",
    ),
    ("read not str", {"kind": "failing", "gpu": 0, "reads": [1]}, "device_faults[0].reads[0]", "1"),
    ("no reads", {"kind": "failing", "gpu": 0}, "device_faults[0].reads", "required key"),
    (
        "reads on throttle",
        {"kind": "throttle", "gpu": 0, "reasons": ["hw_slowdown"], "reads": ["ecc"]},
        "device_faults[0].reads",
        "kind 'throttle' takes no 'reads'; it takes reasons",
    ),
]


@pytest.mark.parametrize(
    ("item", "option", "fragment"), [pytest.param(t, o, f, id=i) for i, t, o, f in INVALID]
)
def test_invalid_device_faults_name_the_bad_key(item: object, option: str, fragment: str) -> None:
    """Each invalid item raises ScenarioError at the path of its bad key, saying why, on
    one line, after a valid item (the index is the bad one's)."""
    doc = base({"kind": "lost", "gpu": 0}, item)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(copy.deepcopy(doc), source="case.yaml")
    assert caught.value.option == option.replace("[0]", "[1]", 1)
    assert fragment in caught.value.reason
    assert caught.value.reason.endswith("(in case.yaml)")
    assert "\n" not in caught.value.reason
    assert isinstance(caught.value, ConfigError)  # the CLI's one-line error path


def test_device_faults_not_a_list_is_an_error() -> None:
    """The section itself must be a list."""
    doc = base()
    doc["device_faults"] = {"kind": "lost", "gpu": 0}
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(doc, source="t")
    assert caught.value.option == "device_faults"
    assert "expected a list, got a mapping" in caught.value.reason


def test_a_top_level_typo_suggests_the_section() -> None:
    """``device_fault:`` is caught with a did-you-mean, not ignored."""
    doc = base()
    doc["device_fault"] = doc.pop("device_faults")
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(doc, source="t")
    assert caught.value.option == "device_fault"
    assert "did you mean 'device_faults'?" in caught.value.reason


FILE = """\
node_name: n
safe_default_watts: 300
gpus:
  - {uuid: GPU-0, min_watts: 100, max_watts: 400, default_watts: 400}
device_faults:
  - {kind: lost, gpu: 0, cycles: {from: 2, to: 3}}
  - kind: throttle
    gpu: 0
    reasons: [sw_thermal_slowdown, hw_power_brake_slowdown]
"""


@pytest.mark.parametrize(
    ("old", "new", "option", "where"),
    [
        ("kind: lost", "kind: lots", "device_faults[0].kind", "6:6"),
        ("gpu: 0, cycles", "gpu: 1, cycles", "device_faults[0].gpu", "6:18"),
        ("to: 3}", "to: 1}", "device_faults[0].cycles.to", "6:44"),
        ("hw_power_brake_slowdown", "hw_power_break", "device_faults[1].reasons[1]", "9:36"),
        ("    gpu: 0\n", "    gpu: 0\n    code: 79\n", "device_faults[1].code", "9:5"),
        ("    gpu: 0\n", "", "device_faults[1].gpu", "7:5"),  # missing: at its mapping
        ("kind: throttle", "kind: xid", "device_faults[1].reasons", "9:5"),
    ],
)
def test_errors_in_a_file_name_file_line_and_column(
    tmp_path: Path, old: str, new: str, option: str, where: str
) -> None:
    """A bad device fault in a file is reported at its file, line and column."""
    assert old in FILE
    path = tmp_path / "s.yaml"
    path.write_text(FILE.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.option == option
    assert caught.value.reason.endswith(f"(in {path}:{where})")


def test_the_file_the_position_cases_edit_is_valid(tmp_path: Path) -> None:
    """The file above is valid, so each position case fails for its one edit only."""
    path = tmp_path / "s.yaml"
    path.write_text(FILE, encoding="utf-8")
    lost, throttle = load_scenario(path).device_faults
    assert lost == DeviceFaultSpec(kind=K.LOST, gpu=0, cycles=CycleRange(first=2, last=3))
    assert throttle.reasons == {
        ThrottleReason.SW_THERMAL_SLOWDOWN,
        ThrottleReason.HW_POWER_BRAKE_SLOWDOWN,
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": K.XID, "gpu": 0},  # no code
        {"kind": K.XID, "gpu": 0, "code": XID_MAX + 1},
        {"kind": K.ECC, "gpu": 0, "code": 3},
        {"kind": K.LOST, "gpu": -1},
        {"kind": K.LOST, "gpu": 0, "count": 2},
        {"kind": K.ECC, "gpu": 0, "count": 0},
        {"kind": K.THROTTLE, "gpu": 0},
        {"kind": K.LOST, "gpu": 0, "reasons": frozenset({ThrottleReason.HW_SLOWDOWN})},
        {"kind": K.FAILING, "gpu": 0},
        {"kind": K.FAILING, "gpu": 0, "reads": frozenset({"temperature"})},
        {"kind": K.ECC, "gpu": 0, "reads": frozenset({"ecc"})},
    ],
)
def test_device_fault_spec_rejects_inconsistent_construction(fields: dict[str, Any]) -> None:
    """Building a spec in code enforces the invariants the parser reports."""
    with pytest.raises(ValueError, match="inconsistent device fault"):
        DeviceFaultSpec(**fields)


def test_the_docs_annotated_example_has_device_faults() -> None:
    """The annotated example in docs/scenario.md shows the common kinds, and parses."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "scenario.md").read_text()
    section = docs.split("## An annotated example", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    kinds = [f.kind for f in parse_scenario(yaml.safe_load(example), source="docs").device_faults]
    assert kinds == [K.XID, K.XID, K.ECC, K.LOST, K.ROW_REMAP_FAILURE, K.THROTTLE, K.UNSUPPORTED]
