"""The child processes a bench starts, and how it drives them; every one is stopped on the
way out.

- :class:`Child`: a spawned process holding one object (a *side*: a server or a client of
  the stream bench), driven one command at a time over a pipe: the command names one of
  the side's coroutine methods, run on that process's event loop;
- :class:`Children`: processes started by command line (``python -m ...``), read line by
  line with :func:`expect`, each run until SIGTERM (:func:`until_terminated`); one
  started with asyncio is stopped with :func:`stop_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# A side: an object whose coroutine methods are the commands, ``stop`` among them.
Side = Any


async def _serve(conn: Connection, side: Side) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            command, *args = await loop.run_in_executor(None, conn.recv)
        except EOFError:  # the parent went away
            command, args = "stop", []
        try:
            conn.send(("ok", await getattr(side, command)(*args)))
        except Exception:  # noqa: BLE001 - handed to the parent, which raises it
            with contextlib.suppress(OSError):
                conn.send(("error", traceback.format_exc()))
        if command == "stop":
            return


def child_main(conn: Connection, make: Callable[[], Side]) -> None:
    asyncio.run(_serve(conn, make()))


class Child:
    """A spawned process holding ``make()``, driven one command at a time. ``make`` is a
    module-level class or function (the spawned process imports it by name)."""

    def __init__(self, make: Callable[[], Side], name: str) -> None:
        context = multiprocessing.get_context("spawn")  # grpc does not survive a fork
        self.conn, theirs = context.Pipe()
        self.name = name
        self.process = context.Process(
            target=child_main, args=(theirs, make), name=name, daemon=True
        )
        self.process.start()
        theirs.close()

    def send(self, command: str, *args: object) -> None:
        self.conn.send((command, *args))

    def result(self, command: str, timeout_s: float = 60.0) -> Any:
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"{self.name}: {command} took over {timeout_s:g}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name}: {command} failed:\n{value}")
        return value

    def call(self, command: str, *args: object, timeout_s: float = 60.0) -> Any:
        self.send(command, *args)
        return self.result(command, timeout_s)

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP or SIGCONT: a frozen client reads nothing, not even at the TCP level."""
        os.kill(self.process.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def close(self) -> None:
        """Stop it cleanly if it answers within 10 s; kill it otherwise."""
        with contextlib.suppress(OSError):
            self.freeze(False)
        with contextlib.suppress(Exception):
            self.call("stop", timeout_s=10)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class Children:
    """Processes started by command line, their stderr kept in ``work``."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[str]:
        """``python ARGV`` (this interpreter), its stdout a pipe to read with :func:`expect`."""
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=(self.work / f"{name}.err").open("w"),
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs = []


def expect(proc: subprocess.Popen[str], word: str, timeout_s: float, what: str) -> str:
    """The rest of the first line ``proc`` prints starting with ``word``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    # select before each line: a child that stays silent must not hold the bench past its
    # deadline (the children print their few lines seconds apart: none waits in a buffer).
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([proc.stdout], [], [], left)[0]:
            break
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} ended before saying {word!r} (exit {proc.wait()})")
        if line.startswith(word):
            return line[len(word) :].strip()
    raise RuntimeError(f"{what}: no {word!r} within {timeout_s:.0f} s")


async def stop_process(proc: asyncio.subprocess.Process, timeout_s: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit status."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode


async def until_terminated() -> None:
    """Return once this process is sent SIGTERM (a child's way to run until stopped)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
