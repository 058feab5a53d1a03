"""The demos' child processes, seen from the demo: started, followed, stopped.

Each is a capwatch command run through :mod:`capwatch.child` (so it dies with
the demo, however the demo ends) in a session of its own (a Ctrl-C on the
terminal is the demo's to handle, in order), with none of the demo's
``CAPWATCH_*`` twins. The node demo runs its readiness shim this way, the
cluster demo its pool and its controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from capwatch.demo.settings import DemoError

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


def logged(message: str) -> Callable[[Mapping[str, Any]], bool]:
    """A readiness test: the child logged a record whose message starts with ``message``."""
    return lambda record: str(record.get("message", "")).startswith(message)


class Child:
    """A capwatch command run as a child process that dies with the demo.

    Its JSON log (stderr) is followed: it is ready once it logs a record ``is_ready``
    accepts; the records it logged are kept by message, its last line that was not
    JSON (a one-line error) is its last words, and ``on_line`` sees each line of its
    standard output. A death after it was ready is reported to ``on_death``.
    """

    def __init__(
        self,
        what: str,
        argv: list[str],
        *,
        is_ready: Callable[[Mapping[str, Any]], bool],
        start_timeout_s: float = START_TIMEOUT_S,
        on_record: Callable[[Mapping[str, Any]], None] = lambda record: None,
        on_line: Callable[[str], None] | None = None,
        on_death: Callable[[str], None] = lambda why: None,
    ) -> None:
        self.what = what
        self._argv = argv
        self._is_ready = is_ready
        self._start_timeout_s = start_timeout_s
        self._on_record = on_record
        self._on_line = on_line
        self._on_death = on_death
        self.records: dict[str, Mapping[str, Any]] = {}
        self.said = ""
        self._ready = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start it and wait until it says it serves. Raises DemoError."""
        # Its own session: a Ctrl-C on the terminal is the demo's to handle, in order.
        # None of the demo's CAPWATCH_* twins: the child gets its flags and nothing else.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPWATCH_")}
        process = self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "capwatch.child",
            str(os.getpid()),
            *self._argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL if self._on_line is None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._readers.append(
            asyncio.create_task(self._read_log(process), name=f"capwatch-demo-{self._argv[0]}-log")
        )
        if self._on_line is not None:
            self._readers.append(
                asyncio.create_task(self._read_out(process), name=f"capwatch-demo-{self._argv[0]}")
            )
        exited = asyncio.create_task(process.wait())
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait(
                {exited, ready}, timeout=self._start_timeout_s, return_when="FIRST_COMPLETED"
            )
        finally:
            ready.cancel()
            exited.cancel()
        if not self._ready.is_set():
            if process.returncode is not None:
                await asyncio.gather(*self._readers)  # its last words
            why = self.said or f"no word from it in {self._start_timeout_s:g}s"
            raise DemoError(f"{self.what} did not start: {why}")

    async def stop(self) -> None:
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        for reader in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read_log(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None  # created with stderr=PIPE
        async for raw in process.stderr:
            text = raw.decode(errors="replace").strip()
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                self.said = text or self.said
                continue
            message = str(record.get("message", ""))
            self.records[message] = record
            if self._is_ready(record):
                self._ready.set()
            self._on_record(record)
        code = await process.wait()
        if not self._stopping and self._ready.is_set():
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            said = f": {self.said}" if self.said else ""
            self._on_death(f"{self.what} {how}{said}")

    async def _read_out(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None  # created with stdout=PIPE when on_line is given
        assert self._on_line is not None
        async for raw in process.stdout:
            self._on_line(raw.decode(errors="replace").rstrip("\n"))
