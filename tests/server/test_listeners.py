"""Listeners (server/grpc/serving.py) and the server flags' validation (server/settings.py)."""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.kit.errors import ConfigError
from capwatch.server.listeners import ServeError
from capwatch.server.settings import server_settings
from tests.pem import write_certificate, write_key
from tests.server.harness import NODE, running, settings_for, start_harness


async def node_name(target: str) -> str:
    async with grpc.aio.insecure_channel(target) as channel:
        response = await pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(
            pb.GetSnapshotRequest(), timeout=5
        )
    return response.snapshot.node_name


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def other_group() -> grp.struct_group:
    """A group this process may give a file to, other than its own where there is one.

    Root may use any group; anyone else, their supplementary groups. Then a
    chown that did not happen cannot pass for one that did.
    """
    own = os.getegid()
    candidates = [g.gr_gid for g in grp.getgrall()] if os.geteuid() == 0 else os.getgroups()
    gids = [gid for gid in candidates if gid != own] or [own]
    return grp.getgrgid(gids[0])


@pytest.mark.asyncio
async def test_unix_socket_is_0660_whatever_the_umask_and_removed_on_stop(tmp_path: Path) -> None:
    """The socket is created mode 0660 even under umask 000, serves plaintext, and goes at stop."""
    path = tmp_path / "run" / "agent.sock"  # the directory is created as needed
    with umask(0):
        harness = await start_harness(settings=settings_for(f"unix://{path}", "127.0.0.1:0"))
    try:
        mode = path.lstat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o660
        assert f"unix://{path}" in harness.server.addresses
        assert await node_name(f"unix://{path}") == NODE
    finally:
        await harness.server.stop()
    assert not path.exists()


@pytest.mark.asyncio
@pytest.mark.parametrize("form", ["name", "id"])
async def test_socket_group_is_applied(tmp_path: Path, form: str) -> None:
    """--grpc-socket-group, by name or by numeric id, owns the socket."""
    group = other_group()
    value = group.gr_name if form == "name" else str(group.gr_gid)
    path = tmp_path / "agent.sock"
    settings = settings_for(f"unix://{path}", extra={"grpc_socket_group": value})
    async with running(settings=settings):
        assert path.stat().st_gid == group.gr_gid
        assert await node_name(f"unix://{path}") == NODE


@pytest.mark.asyncio
async def test_unknown_socket_group_fails_the_start_and_leaves_no_socket(tmp_path: Path) -> None:
    """A group that does not exist is a ServeError at start, and the socket file is removed."""
    path = tmp_path / "agent.sock"
    settings = settings_for(f"unix://{path}", extra={"grpc_socket_group": "no-such-group-here"})
    with pytest.raises(ServeError, match="no-such-group-here"):
        await start_harness(settings=settings)
    assert not path.exists()


@pytest.mark.asyncio
async def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    """A socket left by an agent that died is removed and bound again."""
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as leftover:
        leftover.bind(str(path))
    assert stat.S_ISSOCK(path.lstat().st_mode)
    async with running(settings=settings_for(f"unix://{path}")):
        assert await node_name(f"unix://{path}") == NODE


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "symlink"])
async def test_something_else_at_the_socket_path_is_refused(tmp_path: Path, kind: str) -> None:
    """A regular file (or a link to one) at the path is a ServeError, and it is left untouched."""
    target = tmp_path / "important.txt"
    target.write_text("not a socket")
    path = tmp_path / "agent.sock"
    if kind == "file":
        path.write_text("not a socket")
    else:
        path.symlink_to(target)
    with pytest.raises(ServeError, match="not a socket"):
        await start_harness(settings=settings_for(f"unix://{path}"))
    assert path.read_text() == "not a socket"
    assert target.read_text() == "not a socket"


@pytest.mark.asyncio
async def test_tcp_port_in_use_fails_the_start_and_leaves_no_socket(tmp_path: Path) -> None:
    """A port another process listens on is a ServeError; the unix socket bound before it goes."""
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        settings = settings_for(f"unix://{path}", f"127.0.0.1:{port}")
        with pytest.raises(ServeError, match=str(port)):
            await start_harness(settings=settings)
    assert not path.exists()


@pytest.mark.asyncio
async def test_several_listeners_serve_at_once(tmp_path: Path) -> None:
    """Two TCP listeners and a unix socket, each with its resolved address, all serving."""
    path = tmp_path / "agent.sock"
    settings = settings_for(f"unix://{path}", "127.0.0.1:0", "localhost:0")
    async with running(settings=settings) as harness:
        unix, numeric, named = harness.server.addresses
        assert unix == f"unix://{path}"
        assert numeric.startswith("127.0.0.1:")
        assert named.startswith("localhost:")
        assert all(int(a.rsplit(":", 1)[1]) > 0 for a in (numeric, named))  # ports as bound
        for target in harness.server.addresses:
            assert await node_name(target) == NODE


def parse(values: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    namespace: dict[str, Any] = {"grpc_listen": ["127.0.0.1:0"]}
    namespace.update(values)
    return server_settings(argparse.Namespace(**namespace), environ or {})


RESERVED = "--grpc-reserved-local-subscribers"
PER_PEER = "--grpc-max-streams-per-peer"


def _bad_settings() -> list[Any]:
    listen = "--grpc-listen"
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("listen-no-port", {"grpc_listen": ["localhost"]}, listen),
        ("listen-port-range", {"grpc_listen": ["127.0.0.1:65536"]}, listen),
        ("listen-port-name", {"grpc_listen": ["127.0.0.1:http"]}, listen),
        ("listen-scheme", {"grpc_listen": ["http://127.0.0.1:80"]}, listen),
        ("listen-relative-unix", {"grpc_listen": ["unix://run/agent.sock"]}, listen),
        ("listen-twice", {"grpc_listen": ["127.0.0.1:0", "127.0.0.1:0"]}, listen),
        ("listen-none", {"grpc_listen": []}, listen),
        ("template-no-field", {"dra_device_name": "gpu"}, "--dra-device-name"),
        ("template-unknown-field", {"dra_device_name": "gpu-{name}"}, "--dra-device-name"),
        ("template-positional", {"dra_device_name": "gpu-{0}"}, "--dra-device-name"),
        ("template-unbalanced", {"dra_device_name": "gpu-{index"}, "--dra-device-name"),
        ("template-index-item", {"dra_device_name": "gpu-{index[0]}"}, "--dra-device-name"),
        ("template-attribute", {"dra_device_name": "gpu-{index.nope}"}, "--dra-device-name"),
        ("template-upper", {"dra_device_name": "GPU-{index}"}, "--dra-device-name"),
        ("template-dot", {"dra_device_name": "gpu.{index}"}, "--dra-device-name"),
        ("template-hyphen-end", {"dra_device_name": "{index}-"}, "--dra-device-name"),
        ("template-long", {"dra_device_name": "g" * 63 + "{index}"}, "--dra-device-name"),
        ("pool-upper", {"dra_pool_name": "Pool-A"}, "--dra-pool-name"),
        ("pool-underscore", {"dra_pool_name": "pool_a"}, "--dra-pool-name"),
        ("pool-leading-hyphen", {"dra_pool_name": "-pool"}, "--dra-pool-name"),
        ("pool-long", {"dra_pool_name": "a" * 254}, "--dra-pool-name"),
        ("subscribers-zero", {"grpc_max_subscribers": "0"}, "--grpc-max-subscribers"),
        ("subscribers-negative", {"grpc_max_subscribers": "-1"}, "--grpc-max-subscribers"),
        ("subscribers-word", {"grpc_max_subscribers": "many"}, "--grpc-max-subscribers"),
        ("subscribers-fraction", {"grpc_max_subscribers": "1.5"}, "--grpc-max-subscribers"),
        ("subscribers-too-many", {"grpc_max_subscribers": "20001"}, "--grpc-max-subscribers"),
        ("reserved-negative", {"grpc_reserved_local_subscribers": "-1"}, RESERVED),
        ("reserved-word", {"grpc_reserved_local_subscribers": "some"}, RESERVED),
        (
            "reserved-all",
            {"grpc_max_subscribers": "16", "grpc_reserved_local_subscribers": "16"},
            RESERVED,
        ),
        ("reserved-default-over-max", {"grpc_max_subscribers": "8"}, RESERVED),
        ("per-peer-zero", {"grpc_max_streams_per_peer": "0"}, PER_PEER),
        ("per-peer-word", {"grpc_max_streams_per_peer": "lots"}, PER_PEER),
        ("per-peer-too-many", {"grpc_max_streams_per_peer": "20001"}, PER_PEER),
        ("grace-word", {"grpc_grace": "soon"}, "--grpc-grace"),
        ("grace-negative", {"grpc_grace": "-1"}, "--grpc-grace"),
        ("grace-nan", {"grpc_grace": "nan"}, "--grpc-grace"),
        ("grace-long", {"grpc_grace": "301"}, "--grpc-grace"),
        ("group-space", {"grpc_socket_group": "gpu users"}, "--grpc-socket-group"),
        ("group-leading-hyphen", {"grpc_socket_group": "-g"}, "--grpc-socket-group"),
    ]
    return [pytest.param(values, flag, id=name) for name, values, flag in cases]


@pytest.mark.parametrize(("values", "flag"), _bad_settings())
def test_bad_server_flags_raise_config_error_naming_the_flag(
    values: dict[str, Any], flag: str
) -> None:
    """Each bad value is a ConfigError whose option is the flag (one line at the CLI, exit 2)."""
    with pytest.raises(ConfigError) as caught:
        parse(values)
    assert caught.value.option == flag


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, str]:
    """A certificate, its key and a CA that load (the settings load them as grpc will),
    and a path that does not exist."""
    paths = {
        "cert": str(write_certificate(tmp_path / "cert.pem")),
        "key": str(write_key(tmp_path / "key.pem")),
        "ca": str(write_certificate(tmp_path / "ca.pem")),
    }
    paths["missing"] = str(tmp_path / "missing.pem")
    return paths


@pytest.mark.parametrize(
    ("combination", "flag"),
    [
        ({"grpc_tls_cert": "cert"}, "--grpc-tls-cert"),  # a cert needs its key
        ({"grpc_tls_key": "key"}, "--grpc-tls-cert"),  # and a key its cert
        ({"grpc_tls_client_ca": "ca"}, "--grpc-tls-client-ca"),  # mTLS needs TLS
        ({"grpc_tls_client_ca": "ca", "grpc_tls_key": "key"}, "--grpc-tls-cert"),
        ({"grpc_tls_cert": "missing", "grpc_tls_key": "key"}, "--grpc-tls-cert"),
        ({"grpc_tls_cert": "cert", "grpc_tls_key": "missing"}, "--grpc-tls-key"),
        (
            {"grpc_tls_cert": "cert", "grpc_tls_key": "key", "grpc_tls_client_ca": "missing"},
            "--grpc-tls-client-ca",
        ),
    ],
    ids=["cert-only", "key-only", "ca-only", "ca-and-key", "no-cert", "no-key", "no-ca"],
)
def test_tls_flag_combinations_are_checked(
    pem_files: dict[str, str], combination: dict[str, str], flag: str
) -> None:
    """TLS flags go together and name readable files; the error names the flag at fault."""
    with pytest.raises(ConfigError) as caught:
        parse({key: pem_files[name] for key, name in combination.items()})
    assert caught.value.option == flag


def test_tls_settings_are_built_from_good_flags(pem_files: dict[str, str]) -> None:
    """Cert and key give TLS; adding a client CA gives mutual TLS; none gives plaintext."""
    assert parse({}).tls is None
    tls = parse({"grpc_tls_cert": pem_files["cert"], "grpc_tls_key": pem_files["key"]}).tls
    assert tls is not None
    assert (str(tls.cert), str(tls.key), tls.client_ca) == (
        pem_files["cert"],
        pem_files["key"],
        None,
    )
    mutual = parse(
        {
            "grpc_tls_cert": pem_files["cert"],
            "grpc_tls_key": pem_files["key"],
            "grpc_tls_client_ca": pem_files["ca"],
        }
    ).tls
    assert mutual is not None
    assert str(mutual.client_ca) == pem_files["ca"]


@pytest.mark.parametrize(
    "values",
    [
        {"grpc_listen": ["unix:///run/capwatch/agent.sock", "[::1]:50051", ":50051"]},
        {"dra_pool_name": "node-1.example.com"},
        {"grpc_max_subscribers": "1", "grpc_reserved_local_subscribers": "0"},
        {"grpc_max_subscribers": "20000"},
        {"grpc_max_subscribers": "17"},  # the default reserve (16) leaves TCP one slot
        {"grpc_max_streams_per_peer": "1"},
        {"grpc_max_streams_per_peer": "20000"},
        {"grpc_socket_group": "1000"},
        {"grpc_grace": "0"},
    ],
    ids=[
        "listeners",
        "pool",
        "one-subscriber",
        "most-subscribers",
        "reserve-leaves-one",
        "one-per-peer",
        "most-per-peer",
        "gid",
        "no-grace",
    ],
)
def test_good_server_flags_are_accepted(values: dict[str, Any]) -> None:
    """Valid values parse: IPv6 and any-host listeners, DNS pool names, the bounds themselves."""
    settings = parse(values)
    assert len(settings.listeners) == len(values.get("grpc_listen", ["127.0.0.1:0"]))


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("gpu-{index}", "gpu-7"),
        ("nvidia-gpu-{index}", "nvidia-gpu-7"),
        ("{uuid}", "gpu-5e5e5e5e-0000-4000-8000-000000000007"),
        ("node-a-{index}-{uuid}", "node-a-7-gpu-5e5e5e5e-0000-4000-8000-000000000007"),
    ],
)
def test_device_name_templates_name_gpus(template: str, expected: str) -> None:
    """A valid --dra-device-name gives DNS-label names; UUIDs are lower-cased."""
    namer = parse({"dra_device_name": template}).device_namer()
    assert namer(7, "GPU-5E5E5E5E-0000-4000-8000-000000000007") == expected


def test_env_twin_errors_name_the_variable() -> None:
    """A bad value from the environment names the flag and the variable it came from."""
    with pytest.raises(ConfigError) as caught:
        parse({}, {"CAPWATCH_GRPC_MAX_SUBSCRIBERS": "0"})
    assert caught.value.option == "--grpc-max-subscribers (from $CAPWATCH_GRPC_MAX_SUBSCRIBERS)"


def test_stream_limits_default_to_a_local_reserve_and_a_limit_per_address() -> None:
    """By default 16 of the subscriber slots are kept for the unix socket and one TCP
    address holds at most 64 streams; the flags and their twins change both."""
    default = parse({})
    assert (default.reserved_local_subscribers, default.max_streams_per_peer) == (16, 64)
    chosen = parse(
        {"grpc_reserved_local_subscribers": "0"},
        {
            "CAPWATCH_GRPC_MAX_STREAMS_PER_PEER": "500",
            "CAPWATCH_GRPC_RESERVED_LOCAL_SUBSCRIBERS": "9",  # the flag wins
        },
    )
    assert (chosen.reserved_local_subscribers, chosen.max_streams_per_peer) == (0, 500)
