"""The kubelet's DRA health API, compiled at test time from tests/dra/kubelet/.

The copies are compiled with grpc_tools.protoc into a descriptor set and loaded
into a fresh DescriptorPool: the default pool already holds capwatch's own
``v1alpha1.*`` and ``v1.*`` classes under the same names, and the point is to
decode the server's bytes with definitions that share nothing with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc_tools  # type: ignore[import-untyped]
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message
from grpc_tools import protoc

KUBELET_PROTO = Path(__file__).resolve().parent / "kubelet"
VERSIONS = ("v1alpha1", "v1")


@dataclass(frozen=True, kw_only=True)
class KubeletApi:
    """One version's message classes and method path, as the kubelet defines them."""

    version: str
    file: FileDescriptor
    request: type[Message]
    response: type[Message]
    health: dict[str, int]  # HealthStatus value by name

    @property
    def method(self) -> str:
        return f"/{self.version}.DRAResourceHealth/NodeWatchResources"


def compile_descriptor_set(into: Path) -> descriptor_pb2.FileDescriptorSet:
    """protoc both copies into one FileDescriptorSet (with imports, of which there are none)."""
    out = into / "kubelet.binpb"
    args = [
        "protoc",
        f"-I{KUBELET_PROTO}",
        f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
        f"--descriptor_set_out={out}",
        "--include_imports",
        *(f"{version}/api.proto" for version in VERSIONS),
    ]
    if protoc.main(args) != 0:
        raise AssertionError(f"protoc failed on {KUBELET_PROTO}")
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def load(descriptors: descriptor_pb2.FileDescriptorSet) -> dict[str, KubeletApi]:
    """Each version's API from a fresh pool (never the default one)."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptors.file:
        pool.Add(file)

    def message(name: str) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        return cls

    apis = {}
    for version in VERSIONS:
        status = pool.FindEnumTypeByName(f"{version}.HealthStatus")
        apis[version] = KubeletApi(
            version=version,
            file=pool.FindFileByName(f"{version}/api.proto"),
            request=message(f"{version}.NodeWatchResourcesRequest"),
            response=message(f"{version}.NodeWatchResourcesResponse"),
            health={value.name: value.number for value in status.values},
        )
    return apis


def shape(file: FileDescriptor) -> dict[str, Any]:
    """What the wire and the method path depend on, element by element.

    Package, services and methods, messages and fields (name, number, type,
    label, type name), enum values. Not file names, options or comments, nor
    ``json_name``: protoc fills it into descriptor sets but not into generated
    Python code, and neither copy sets one explicitly.
    """
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return shape_of(proto)


def shape_of(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """:func:`shape` of a FileDescriptorProto (so tests can alter one and see it differ)."""
    result: dict[str, Any] = {"package": proto.package, "syntax": proto.syntax}
    for service in proto.service:
        result[f"service {service.name}"] = [
            (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            for m in service.method
        ]
    for message in proto.message_type:
        if message.nested_type or message.enum_type or message.oneof_decl:
            result[f"nested in {message.name}"] = True  # neither side has any
        result[f"message {message.name}"] = [
            (
                f.name,
                f.number,
                descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                f.type_name,
                f.proto3_optional,
            )
            for f in message.field
        ]
    for enum in proto.enum_type:
        result[f"enum {enum.name}"] = [(v.name, v.number) for v in enum.value]
    return result
