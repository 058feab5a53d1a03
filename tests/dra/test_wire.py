"""capwatch's DRA mirrors against an independent copy of the kubelet's API.

Same shape (descriptor by descriptor) and same bytes (both ways).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool

from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from tests.dra.kubelet_api import KUBELET_PROTO, VERSIONS, KubeletApi, shape, shape_of

ROOT = Path(__file__).resolve().parents[2]
PROJECT: dict[str, ModuleType] = {"v1alpha1": v1alpha1_pb, "v1": v1_pb}


def _kubelet_file_proto(api: KubeletApi) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api.file.CopyToProto(proto)
    return proto


@pytest.mark.parametrize("version", VERSIONS)
def test_project_descriptors_match_the_kubelets(
    kubelet: dict[str, KubeletApi], version: str
) -> None:
    """Package, service, method, every message's fields (name, number, type, label,
    type name) and every enum value agree with the kubelet's copy, element by element."""
    ours, theirs = shape(PROJECT[version].DESCRIPTOR), shape(kubelet[version].file)
    assert sorted(ours) == sorted(theirs)
    for element, expected in theirs.items():
        assert ours[element] == expected, element
    # The parts the wire and the method path hinge on, spelled out.
    assert theirs["package"] == version
    assert theirs["service DRAResourceHealth"] == [
        (
            "NodeWatchResources",
            f".{version}.NodeWatchResourcesRequest",
            f".{version}.NodeWatchResourcesResponse",
            False,
            True,
        )
    ]
    assert [(f[0], f[1]) for f in theirs["message DeviceHealth"]] == [
        ("device", 1),
        ("health", 2),
        ("last_updated_time", 3),
        ("health_check_timeout_seconds", 4),
        ("message", 5),
    ]
    assert theirs["enum HealthStatus"] == [("UNKNOWN", 0), ("HEALTHY", 1), ("UNHEALTHY", 2)]


def _renumber(proto: descriptor_pb2.FileDescriptorProto) -> None:
    next(m for m in proto.message_type if m.name == "DeviceHealth").field[3].number = 6


def _retype(proto: descriptor_pb2.FileDescriptorProto) -> None:
    field = next(m for m in proto.message_type if m.name == "DeviceHealth").field[2]
    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_INT32


def _relabel(proto: descriptor_pb2.FileDescriptorProto) -> None:
    field = next(m for m in proto.message_type if m.name == "DeviceHealth").field[4]
    field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


def _rename_value(proto: descriptor_pb2.FileDescriptorProto) -> None:
    proto.enum_type[0].value[0].name = "HEALTH_STATUS_UNSPECIFIED"


def _unary(proto: descriptor_pb2.FileDescriptorProto) -> None:
    proto.service[0].method[0].server_streaming = False


def _repackage(proto: descriptor_pb2.FileDescriptorProto) -> None:
    proto.package = "k8s.io.kubelet.v1alpha1"


def _extra_field(proto: descriptor_pb2.FileDescriptorProto) -> None:
    message = next(m for m in proto.message_type if m.name == "DeviceIdentifier")
    message.field.add(name="uuid", number=3, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)


@pytest.mark.parametrize(
    "drift", [_renumber, _retype, _relabel, _rename_value, _unary, _repackage, _extra_field]
)
def test_descriptor_comparison_catches_drift(
    kubelet: dict[str, KubeletApi], drift: Callable[[descriptor_pb2.FileDescriptorProto], None]
) -> None:
    """Each kind of drift (field number, type, label, enum value name, streaming,
    package, an extra field) makes the shapes differ, so the comparison can fail."""
    proto = _kubelet_file_proto(kubelet["v1alpha1"])
    before = shape_of(proto)
    drift(proto)
    assert shape_of(proto) != before


@pytest.mark.parametrize("version", VERSIONS)
def test_bytes_decode_the_same_both_ways(kubelet: dict[str, KubeletApi], version: str) -> None:
    """A response built with capwatch's classes decodes field for field with the
    kubelet's, and re-encodes to the same bytes (and the other way round)."""
    pb, api = PROJECT[version], kubelet[version]
    ours = pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name="pool-a", device_name=f"gpu-{i}"),
                health=health,
                last_updated_time=1_700_000_000 + i,
                health_check_timeout_seconds=90,
                message=f"message {i}",
            )
            for i, health in enumerate((pb.UNKNOWN, pb.HEALTHY, pb.UNHEALTHY))
        ]
    )
    wire = ours.SerializeToString(deterministic=True)
    theirs: Any = api.response.FromString(wire)
    assert [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.last_updated_time,
            d.health_check_timeout_seconds,
            d.message,
        )
        for d in theirs.devices
    ] == [
        ("pool-a", "gpu-0", api.health["UNKNOWN"], 1_700_000_000, 90, "message 0"),
        ("pool-a", "gpu-1", api.health["HEALTHY"], 1_700_000_001, 90, "message 1"),
        ("pool-a", "gpu-2", api.health["UNHEALTHY"], 1_700_000_002, 90, "message 2"),
    ]
    assert theirs.SerializeToString(deterministic=True) == wire
    assert pb.NodeWatchResourcesResponse.FromString(wire) == ours
    # The kubelet's (empty) request is what the server must accept.
    assert api.request().SerializeToString() == b""
    assert pb.NodeWatchResourcesRequest.FromString(b"") == pb.NodeWatchResourcesRequest()


def test_kubelet_copies_are_independent_of_the_project(kubelet: dict[str, KubeletApi]) -> None:
    """The copies live in their own descriptor pool, not in the default one that
    holds capwatch's generated classes of the same full names."""
    for version, api in kubelet.items():
        assert api.file.pool is not descriptor_pool.Default()
        assert api.response is not PROJECT[version].NodeWatchResourcesResponse
        assert api.response.DESCRIPTOR.full_name == f"{version}.NodeWatchResourcesResponse"
        assert api.response.DESCRIPTOR is not PROJECT[version].NodeWatchResourcesResponse.DESCRIPTOR


def test_kubelet_copies_stay_out_of_the_buf_module() -> None:
    """buf lints and breaking-checks only its module paths; the kubelet copies (which
    follow the kubelet's naming, not buf STANDARD) must not fall under any of them."""
    config = yaml.safe_load((ROOT / "buf.yaml").read_text())
    module_roots = [(ROOT / module["path"]).resolve() for module in config["modules"]]
    assert module_roots, "buf.yaml lists no modules"
    for root in module_roots:
        assert not KUBELET_PROTO.is_relative_to(root), root
        assert not root.is_relative_to(KUBELET_PROTO), root
