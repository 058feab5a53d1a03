"""The ``capwatch`` command line: ``agent`` and ``demo``.

Configuration errors print one line (``capwatch agent: error: --interval: ...``)
and exit 2; an agent that cannot start (no GPUs, no NVML) exits 1; a stop by
SIGTERM or SIGINT restores caps and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from agent.assembly import build_agent, load_settings_scenario
from agent.errors import CapwatchError, ConfigError
from agent.rendering import render_report
from agent.reports import CycleReport
from agent.settings import AgentSettings, BackendKind, add_agent_arguments, agent_settings
from server.logs import configure_logging

log = logging.getLogger("capwatch")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="capwatch", description="GPU power-cap agent for Kubernetes nodes.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    agent = commands.add_parser("agent", help="run the node agent")
    add_agent_arguments(agent)
    demo = commands.add_parser(
        "demo", help="run the agent on simulated GPUs and print every cycle as a table"
    )
    demo.add_argument("--scenario", help="scenario file (default: the built-in scenario)")
    demo.add_argument("--interval", help="seconds between cycles (default: the scenario's, or 2)")
    demo.add_argument("--cycles", type=int, default=None, help="stop after this many cycles")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    parser = _parser()
    args = parser.parse_args(argv)
    prog = f"capwatch {args.command}"
    try:
        if args.command == "agent":
            settings = agent_settings(args, environ)
            configure_logging(settings.log_level, settings.log_format)
            return asyncio.run(run_agent(settings))
        return _demo(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CapwatchError as exc:
        print(f"{prog}: cannot start: {exc}", file=sys.stderr)
        return EXIT_FAILED


async def run_agent(
    settings: AgentSettings,
    *,
    on_report: Callable[[CycleReport], None] | None = None,
    max_cycles: int | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or ``max_cycles``), then stop in order. Returns the exit code."""
    agent = build_agent(settings, on_report=on_report)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = agent.start(stop, max_cycles=max_cycles)
    await stop.wait()
    log.info("stopping: restoring default caps on owned GPUs")
    summary = await agent.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    died = task.done() and not task.cancelled() and task.exception() is not None
    log.info("stopped clean=%s restored=%d", str(summary.clean).lower(), len(summary.restored))
    return EXIT_FAILED if died else EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    flags = {
        "gpu_backend": BackendKind.SIM.value,
        "scenario": args.scenario,
        "state_dir": tempfile.mkdtemp(prefix="capwatch-demo-state-"),
        "log_level": "warning",
    }
    settings = agent_settings(argparse.Namespace(**flags, interval=args.interval), {})
    scenario = load_settings_scenario(settings)
    if args.interval is None and scenario.interval_seconds:
        interval = str(scenario.interval_seconds)
        settings = agent_settings(argparse.Namespace(**flags, interval=interval), {})
    configure_logging(settings.log_level, settings.log_format)
    print(f"capwatch demo: {scenario.description.strip() or scenario.source}")
    print(
        f"node {settings.node_name or scenario.node_name}, {len(scenario.gpus)} simulated GPUs, "
        f"a cycle every {settings.interval_s:g}s; Ctrl-C stops and restores caps.\n",
        flush=True,
    )

    def show(report: CycleReport) -> None:
        print(render_report(report) + "\n", flush=True)

    return asyncio.run(run_agent(settings, on_report=show, max_cycles=args.cycles))


if __name__ == "__main__":
    sys.exit(main())
