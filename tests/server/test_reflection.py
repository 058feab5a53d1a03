"""Server reflection: the services are listed and their types resolve, as grpcurl needs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from tests.server.harness import ServerHarness

pytestmark = pytest.mark.asyncio

SERVICES = {
    "capwatch.v1.NodeHealthService",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


def fields(descriptor: Descriptor) -> list[tuple[str, int, int, bool, bool]]:
    return [(f.name, f.number, f.type, f.is_repeated, f.has_presence) for f in descriptor.fields]


def resolve(
    target: str, names: list[str]
) -> tuple[set[str], dict[str, Descriptor], DescriptorPool]:
    """What a reflection client (sync API, so run in a thread) learns from the server."""
    with grpc.insecure_channel(target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        services = set(database.get_services())
        messages = {name: pool.FindMessageTypeByName(name) for name in names}
        # Touch the service too, so its file and imports resolve while connected.
        pool.FindServiceByName("capwatch.v1.NodeHealthService")
        return services, messages, pool


async def test_reflection_lists_exactly_the_served_services(harness: ServerHarness) -> None:
    """list_services names the five services, no more, no fewer (over the async stub as well)."""
    async with harness.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        stream = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        responses = [response async for response in stream]
    [response] = responses
    assert {s.name for s in response.list_services_response.service} == SERVICES
    services, _, _ = await asyncio.to_thread(resolve, harness.target, [])
    assert services == SERVICES


async def test_reflection_resolves_messages_and_their_fields(harness: ServerHarness) -> None:
    """DeviceStatus, WatchRequest and the kubelet's v1.DeviceHealth resolve with the real fields."""
    names = ["capwatch.v1.DeviceStatus", "capwatch.v1.WatchRequest", "v1.DeviceHealth"]
    _, messages, pool = await asyncio.to_thread(resolve, harness.target, names)
    assert fields(messages["capwatch.v1.DeviceStatus"]) == fields(pb.DeviceStatus.DESCRIPTOR)
    assert fields(messages["capwatch.v1.WatchRequest"]) == fields(pb.WatchRequest.DESCRIPTOR)
    assert fields(messages["v1.DeviceHealth"]) == fields(v1_pb.DeviceHealth.DESCRIPTOR)
    status = messages["capwatch.v1.DeviceStatus"]
    assert status.fields_by_name["health"].enum_type.full_name == "capwatch.v1.DeviceHealth"
    assert status.fields_by_name["owners"].message_type.full_name == "capwatch.v1.PodRef"
    assert (
        status.fields_by_name["last_transition_time"].message_type.full_name
        == "google.protobuf.Timestamp"
    )
    service = pool.FindServiceByName("capwatch.v1.NodeHealthService")
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"Watch", "GetSnapshot"}
    assert methods["Watch"].output_type.full_name == "capwatch.v1.WatchResponse"


async def test_reflection_serves_the_file_with_its_imports(harness: ServerHarness) -> None:
    """file_containing_symbol returns node_health.proto and the well-known types it imports."""
    request = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="capwatch.v1.NodeHealthService"
    )
    async with harness.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        [response] = [r async for r in stub.ServerReflectionInfo(iter([request]))]
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    by_name = {f.name: f for f in files}
    [own] = [f for f in files if f.package == "capwatch.v1"]
    assert {s.name for s in own.service} == {"NodeHealthService"}
    assert set(own.dependency) <= set(by_name)  # every import travels with it


async def test_reflection_reports_an_unknown_symbol_as_not_found(harness: ServerHarness) -> None:
    """An unknown symbol is a NOT_FOUND error response, not a broken stream."""

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(file_containing_symbol="capwatch.v1.Nope")

    async with harness.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        stream = stub.ServerReflectionInfo(requests())
        [response] = [r async for r in stream]
        assert await stream.code() == grpc.StatusCode.OK
    assert response.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
