"""``capwatch pool``'s command line: a bad flag or an unwritable file is one line, and the
targets file lists every node at the address bound."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.cli import main
from capwatch.pool import add_pool_arguments, pool_command, run_pool
from tests.server.harness import eventually

QUIET = ["--log-level", "warning", "--grpc-listen", "127.0.0.1:0"]


def test_a_targets_file_that_cannot_be_written_is_one_line_exit_2(capsys, tmp_path: Path):
    """--targets-out in a directory that does not exist: the pool stops (its server too) and
    says so in one line naming the flag, exit 2; no traceback."""
    missing = tmp_path / "missing" / "targets.txt"
    assert main(["pool", "--nodes", "2", "--targets-out", str(missing), *QUIET], {}) == 2
    err = capsys.readouterr().err
    assert err == (
        f"capwatch pool: error: --targets-out: cannot write {missing}: No such file or directory\n"
    )


def test_the_targets_file_lists_every_node_at_the_address_served(tmp_path: Path):
    """--targets-out: one 'NODE ADDRESS' line per node, the address the pool bound (port 0
    resolved), which serves each of them; nothing else is left in the directory."""
    targets = tmp_path / "targets.txt"
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    args = ["--nodes", "3", "--gpus", "1", "--interval", "0.2", "--targets-out", str(targets)]
    command = pool_command(parser.parse_args([*args, *QUIET]), {})

    async def written() -> bool:
        return targets.exists()

    async def serve_and_ask() -> list[str]:
        stop = asyncio.Event()
        running = asyncio.create_task(run_pool(command, stop=stop))
        try:
            await eventually(written, timeout=10)
            lines = targets.read_text().splitlines()
            async with grpc.aio.insecure_channel(lines[0].split()[1]) as channel:
                stub = pb_grpc.NodeHealthServiceStub(channel)
                for line in lines:
                    name = line.split()[0]
                    answer = await stub.GetSnapshot(pb.GetSnapshotRequest(node_name=name))
                    assert answer.snapshot.node_name == name
            return lines
        finally:
            stop.set()
            assert await running == 0

    lines = [line.split() for line in asyncio.run(serve_and_ask())]
    assert [name for name, _ in lines] == ["sim-node-0", "sim-node-1", "sim-node-2"]
    (address,) = {address for _, address in lines}
    assert address.startswith("127.0.0.1:")
    assert not address.endswith(":0")
    assert [p.name for p in tmp_path.iterdir()] == ["targets.txt"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nodes", "²"], "--nodes: must be an integer from 1 to 20000, got '²'"),
        (["--gpus", "٣"], "--gpus: must be an integer from 1 to 64, got '٣'"),
        (["--first-index", "¹"], "--first-index: must be a non-negative integer, got '¹'"),
    ],
)
def test_a_count_in_other_digits_is_one_line_exit_2(argv: list[str], expected: str, capsys):
    """Digits str.isdigit() accepts but int() does not (superscripts), or that are not
    ASCII, are refused in one line like any other bad count, not with a traceback."""
    assert main(["pool", *argv, *QUIET], {}) == 2
    assert capsys.readouterr().err == f"capwatch pool: error: {expected}\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--name-prefix=-gpu"], "--name-prefix: nodes would be named '-gpu0', ..."),
        (["--name-prefix", "gpu..x"], "--name-prefix: nodes would be named 'gpu..x0', ..."),
        (["--name-prefix", "gpu-.x"], "--name-prefix: nodes would be named 'gpu-.x0', ..."),
        (["--name-prefix", "grüne-"], "--name-prefix: nodes would be named 'grüne-0', ..."),
        (
            ["--name-prefix", "n" * 200, "--first-index", "1" + "0" * 60],
            "--first-index: the last node's name would be 261 characters long, more than a "
            "Kubernetes node name's 253",
        ),
    ],
)
def test_node_names_kubernetes_would_refuse_are_one_line_exit_2(
    argv: list[str], expected: str, capsys
):
    """The pool's node names are valid Kubernetes node names (RFC 1123 subdomains of at
    most 253 characters), or the pool does not start: a controller's targets file, and a
    cluster, would refuse them."""
    assert main(["pool", "--nodes", "2", *argv, *QUIET], {}) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"capwatch pool: error: {expected}")
    assert err.count("\n") == 1


def test_a_prefix_is_lowered_and_may_hold_dots_and_dashes(tmp_path: Path):
    """Upper case is lowered; dots and dashes inside are fine: 'GPU.rack-7-' names
    'gpu.rack-7-0', ... which the controller's targets file takes."""
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    command = pool_command(parser.parse_args(["--name-prefix", "GPU.rack-7-"]), {})
    assert command.pool.name_prefix == "gpu.rack-7-"


def test_the_same_listen_address_twice_is_one_line_exit_2(capsys):
    """--grpc-listen is repeatable; an address given twice is refused before anything
    binds, in one line naming the flag."""
    argv = ["pool", "--nodes", "2", "--log-level", "warning"]
    assert main([*argv, "--grpc-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"], {}) == 2
    err = capsys.readouterr().err
    assert err == "capwatch pool: error: --grpc-listen: the same address is given twice\n"
