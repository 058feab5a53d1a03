"""The scenario's ``claims`` and ``slices`` sections: what they parse to, and strict
validation with the path (and file:line:column) of each bad key."""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.dra.claims import API_VERSION, KIND
from capwatch.agent.sim.cycles import ALWAYS, CycleRange
from capwatch.agent.sim.scenario import load_scenario, parse_scenario
from capwatch.agent.sim.scenario_claims import (
    GPU_DRIVER,
    CapParameters,
    ClaimDeviceSpec,
    SliceDeviceSpec,
    SliceSpec,
)
from capwatch.kit.errors import ConfigError, ScenarioError

UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-8999-aaaaaaaaaaaa"
UID_C = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
GPU0, GPU1 = "GPU-0", "GPU-1"


def power_cap(watts: object, **changes: object) -> dict[str, object]:
    return {"apiVersion": API_VERSION, "kind": KIND, "watts": watts, **changes}


def base() -> dict[str, Any]:
    """A small valid document with two claims; every invalid case below starts from it."""
    return {
        "node_name": "n",
        "safe_default_watts": 300,
        "gpus": [
            {"uuid": GPU0, "min_watts": 100, "max_watts": 400, "default_watts": 400},
            {"uuid": GPU1, "min_watts": 100, "max_watts": 400, "default_watts": 400},
        ],
        "pods": [
            {"namespace": "ns", "name": "a", "uid": UID_A},
            {"namespace": "ns", "name": "b", "uid": UID_B, "cycles": {"from": 2, "to": 4}},
            {"namespace": "other", "name": "a", "uid": UID_C},
        ],
        "claims": [
            {
                "namespace": "ns",
                "name": "c0",
                "reserved_for": ["a"],
                "devices": [0],
                "parameters": power_cap(250),
            },
            {
                "namespace": "ns",
                "name": "c1",
                "reserved_for": [UID_B],
                "devices": ["gpu-1"],
                "request": "big/large",
                "parameters": power_cap("250"),
                "cycles": {"from": 2, "to": 4},
            },
        ],
    }


def given_slices() -> list[dict[str, Any]]:
    """A node slice naming its devices otherwise (one without a UUID), and another
    node's slice."""
    return [
        {
            "driver": "gpu.example.com",
            "pool": "pool-n",
            "uuid_attribute": "gpu.example.com/uuid",
            "devices": [
                {"name": "card-1", "uuid": GPU1},
                {"name": "card-0", "uuid": GPU0},
                {"name": "card-9"},
            ],
        },
        {"node": "elsewhere", "devices": [{"name": "far-0", "uuid": "GPU-far"}]},
    ]


def test_claims_parse_to_what_the_agent_is_served() -> None:
    """Devices by GPU index become the derived slice's ``gpu-N``, by name stay so; pods by
    name (in the claim's namespace) or uid become their refs; parameters are kept exactly
    as written, invalid ones included; request defaults to ``gpu``, cycles to always."""
    s = parse_scenario(base(), source="t")
    assert s.slices is None
    first, second = s.claims
    assert (first.namespace, first.name, first.request, first.cycles) == ("ns", "c0", "gpu", ALWAYS)
    assert [p.uid for p in first.reserved_for] == [UID_A]
    assert first.devices == (ClaimDeviceSpec(driver=GPU_DRIVER, pool=None, device="gpu-0"),)
    assert first.cap == CapParameters(value=power_cap(250))
    assert [p.uid for p in second.reserved_for] == [UID_B]
    assert second.devices == (ClaimDeviceSpec(driver=GPU_DRIVER, pool=None, device="gpu-1"),)
    assert second.request == "big/large"
    assert second.cap == CapParameters(value=power_cap("250")), "an invalid cap, simulated"
    assert second.cycles == CycleRange(first=2, last=4)
    assert first.uid != second.uid
    assert parse_scenario(base(), source="t").claims[0].uid == first.uid, "deterministic"


@pytest.mark.parametrize(
    "parameters",
    [power_cap(450, kind="PowerLimit"), power_cap(None), power_cap([450]), {"watts": 1.5}, {}],
)
def test_any_json_object_is_accepted_for_the_agent_to_judge(parameters: object) -> None:
    """The parser does not judge the PowerCap (the agent does): any JSON object, as the
    API server accepts, is a claim's parameters."""
    doc = base()
    doc["claims"][0]["parameters"] = parameters
    assert parse_scenario(doc, source="t").claims[0].cap == CapParameters(value=parameters)


def test_a_claim_without_parameters_has_no_capwatch_config() -> None:
    """Without ``parameters`` the claim carries no capwatch.io config (cap None), and
    ``reserved_for`` may be empty (allocated, not yet reserved)."""
    doc = base()
    del doc["claims"][0]["parameters"]
    doc["claims"][0]["reserved_for"] = []
    claim = parse_scenario(doc, source="t").claims[0]
    assert (claim.cap, claim.reserved_for) == (None, ())


def test_given_slices_replace_the_derived_one_and_gpu_indexes_follow_uuids() -> None:
    """With ``slices`` a GPU index names the device of this node's slices carrying its
    UUID; names find devices in any slice; defaults fill driver and uuid_attribute."""
    doc = base()
    doc["slices"] = given_slices()
    doc["claims"][1]["devices"] = ["card-9", "far-0"]
    s = parse_scenario(doc, source="t")
    assert s.slices == (
        SliceSpec(
            driver="gpu.example.com",
            pool="pool-n",
            uuid_attribute="gpu.example.com/uuid",
            devices=(
                SliceDeviceSpec(name="card-1", uuid=GPU1),
                SliceDeviceSpec(name="card-0", uuid=GPU0),
                SliceDeviceSpec(name="card-9"),
            ),
        ),
        SliceSpec(node="elsewhere", devices=(SliceDeviceSpec(name="far-0", uuid="GPU-far"),)),
    )
    assert s.claims[0].devices == (
        ClaimDeviceSpec(driver="gpu.example.com", pool="pool-n", device="card-0"),
    )
    assert s.claims[1].devices == (
        ClaimDeviceSpec(driver="gpu.example.com", pool="pool-n", device="card-9"),
        ClaimDeviceSpec(driver=GPU_DRIVER, pool="elsewhere", device="far-0"),
    )
    doc["slices"] = []
    doc["claims"] = []
    assert parse_scenario(doc, source="t").slices == (), "a node with no slices"


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


def _delete(index: int, key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        del doc["claims"][index][key]

    return mutate


def _slices(*changes: Callable[[list[dict[str, Any]]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["slices"] = given_slices()
        doc["claims"][1]["devices"] = ["card-1"]
        for change in changes:
            change(doc["slices"])

    return mutate


INVALID = [
    # (id, mutation, option, fragment of the reason)
    ("claims not list", _set("claims", {}), "claims", "expected a list, got a mapping"),
    ("claim key typo", _set("claims[0].device", [0]), "claims[0].device", "did you mean 'devices'"),
    ("no namespace", _delete(0, "namespace"), "claims[0].namespace", "required key is missing"),
    ("no devices", _delete(0, "devices"), "claims[0].devices", "required key is missing"),
    ("no reserved_for", _delete(0, "reserved_for"), "claims[0].reserved_for", "missing"),
    ("empty name", _set("claims[0].name", ""), "claims[0].name", "must not be empty"),
    ("name not str", _set("claims[0].name", 7), "claims[0].name", "expected a string, got number"),
    (
        "dup claim",
        _set("claims[1].name", "c0"),
        "claims[1].name",
        "claim ns/c0 is also claims[0] in the same cycles",
    ),
    ("reserved not list", _set("claims[0].reserved_for", "a"), "claims[0].reserved_for", "list"),
    (
        "no such pod",
        _set("claims[0].reserved_for", ["nobody"]),
        "claims[0].reserved_for[0]",
        "no pod with uid 'nobody', nor named so in namespace 'ns', in pods",
    ),
    (
        "pod of another namespace",
        _set("claims[0].reserved_for", [UID_C]),
        "claims[0].reserved_for[0]",
        "pod other/a is not in the claim's namespace 'ns'",
    ),
    (
        "pod twice",
        _set("claims[0].reserved_for", ["a", UID_A]),
        "claims[0].reserved_for[1]",
        "pod ns/a is listed twice",
    ),
    (
        "ambiguous pod name",
        lambda d: (
            d["pods"].append({"namespace": "ns", "name": "a", "uid": UID_C[:-1] + "0", "cycles": 9})
            or d["pods"][0].update(cycles={"from": 1, "to": 8})
        ),
        "claims[0].reserved_for[0]",
        "ns/a names several pods (pods[0], pods[3]); give its uid",
    ),
    ("no device", _set("claims[0].devices", []), "claims[0].devices", "at least one device"),
    (
        "gpu index out",
        _set("claims[0].devices", [2]),
        "claims[0].devices[0]",
        "no GPU at index 2; the scenario declares 2 GPU(s)",
    ),
    ("negative gpu", _set("claims[0].devices", [-1]), "claims[0].devices[0]", "must be >= 0"),
    (
        "unknown device",
        _set("claims[0].devices", ["gpu-9"]),
        "claims[0].devices[0]",
        "no device 'gpu-9' in the scenario's slices (gpu-0, gpu-1)",
    ),
    (
        "device not int or str",
        _set("claims[0].devices", [True]),
        "claims[0].devices[0]",
        "expected a GPU index or a device name, got boolean true",
    ),
    (
        "device twice",
        _set("claims[0].devices", [0, "gpu-0"]),
        "claims[0].devices[1]",
        "device 'gpu-0' is listed twice",
    ),
    ("bad request", _set("claims[0].request", "GPU_0"), "claims[0].request", "not a request name"),
    (
        "date in parameters",
        _set("claims[0].parameters", power_cap(datetime.date(2025, 1, 1))),
        "claims[0].parameters.watts",
        "date datetime.date(2025, 1, 1) is not a JSON value",
    ),
    (
        "null parameters",
        _set("claims[0].parameters", None),
        "claims[0].parameters",
        "expected a mapping (a claim's opaque parameters are a JSON object), got null",
    ),
    (
        "string parameters",
        _set("claims[0].parameters", "450"),
        "claims[0].parameters",
        "got string '450'",
    ),
    (
        "int key in parameters",
        _set("claims[0].parameters", {1: "x"}),
        "claims[0].parameters",
        "keys of JSON objects are strings, got number 1",
    ),
    (
        "nan in parameters",
        _set("claims[0].parameters", power_cap(float("nan"))),
        "claims[0].parameters.watts",
        "nan is not a JSON number",
    ),
    ("claim cycles", _set("claims[1].cycles", {"from": 0}), "claims[1].cycles.from", ">= 1"),
    ("slices not list", _set("slices", {}), "slices", "expected a list, got a mapping"),
    (
        "slice key typo",
        _slices(lambda s: s[0].update(devics=[])),
        "slices[0].devics",
        "did you mean 'devices'",
    ),
    ("slice no devices", _slices(lambda s: s[1].pop("devices")), "slices[1].devices", "missing"),
    (
        "slice empty pool",
        _slices(lambda s: s[0].update(pool=" ")),
        "slices[0].pool",
        "must not be empty",
    ),
    (
        "slice device no name",
        _slices(lambda s: s[0]["devices"][0].pop("name")),
        "slices[0].devices[0].name",
        "missing",
    ),
    (
        "dup device name",
        _slices(lambda s: s[1]["devices"][0].update(name="card-0")),
        "slices[1].devices[0].name",
        "duplicate device name 'card-0' (also slices[0].devices[1])",
    ),
    (
        "uuid of no gpu",
        _slices(lambda s: s[0]["devices"][2].update(uuid="GPU-7")),
        "slices[0].devices[2].uuid",
        "'GPU-7' is the uuid of none of the scenario's GPUs",
    ),
    (
        "dup uuid",
        _slices(lambda s: s[0]["devices"][2].update(uuid=GPU0)),
        "slices[0].devices[2].uuid",
        "duplicate uuid 'GPU-0' (also slices[0].devices[1])",
    ),
    (
        "gpu with no slice device",
        _slices(lambda s: s[0]["devices"].pop(0)),
        "claims[1].devices[0]",  # card-1 is gone
        "no device 'card-1' in the scenario's slices",
    ),
    (
        "gpu index with no uuid in slices",
        _slices(lambda s: s[0]["devices"].pop(1)),
        "claims[0].devices[0]",
        "no device of this node's slices has GPU 0's uuid 'GPU-0'; name the device instead",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "option", "fragment"),
    [pytest.param(m, o, f, id=i) for i, m, o, f in INVALID],
)
def test_invalid_claims_and_slices_name_the_bad_key(
    mutate: Callable[[dict[str, Any]], None], option: str, fragment: str
) -> None:
    """Each invalid claim or slice raises ScenarioError at the path of its bad key, saying
    why."""
    doc = copy.deepcopy(base())
    mutate(doc)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(doc, source="case.yaml")
    assert caught.value.option == option
    assert fragment in caught.value.reason
    assert caught.value.reason.endswith("(in case.yaml)")
    assert isinstance(caught.value, ConfigError)  # the CLI's one-line error path


VALID_FILE = """\
node_name: n
safe_default_watts: 300
gpus:
  - {uuid: GPU-0, min_watts: 100, max_watts: 400, default_watts: 400}
pods:
  - {namespace: ns, name: a, uid: 11111111-2222-4333-8444-555555555555}
claims:
  - namespace: ns
    name: c0
    reserved_for: [a]
    devices: [0]
    parameters: {apiVersion: capwatch.io/v1alpha1, kind: PowerCap, watts: 250}
slices:
  - devices:
      - {name: gpu-0, uuid: GPU-0}
"""


@pytest.mark.parametrize(
    ("old", "new", "option", "where"),
    [
        ("devices: [0]", "devices: [0, gpu-7]", "claims[0].devices[1]", "11:18"),
        ("reserved_for: [a]", "reserved_for: [b]", "claims[0].reserved_for[0]", "10:20"),
        ("watts: 250}", "watts: 2025-01-01}", "claims[0].parameters.watts", "12:68"),
        ("    name: c0\n", "    nmae: c0\n", "claims[0].nmae", "9:5"),
        (
            "{name: gpu-0, uuid: GPU-0}",
            "{name: gpu-0, uuid: GPU-9}",
            "slices[0].devices[0].uuid",
            "15:23",
        ),
    ],
)
def test_invalid_claim_in_a_file_names_file_line_and_column(
    tmp_path: Path, old: str, new: str, option: str, where: str
) -> None:
    """A claim or slice the validator refuses is reported at the file, line and column it
    is on, after the path to it."""
    path = tmp_path / "s.yaml"
    path.write_text(VALID_FILE, encoding="utf-8")
    assert [str(c) for c in load_scenario(path).claims] == ["ns/c0"], "the fixture is valid"
    assert old in VALID_FILE
    path.write_text(VALID_FILE.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.option == option
    assert caught.value.reason.endswith(f"(in {path}:{where})")
