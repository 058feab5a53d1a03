"""The ``capwatch`` command line: ``agent``, ``shim``, ``watch`` and ``demo``.

Configuration errors print one line (``capwatch agent: error: --interval: ...``)
and exit 2; an agent that cannot start (no GPUs, no NVML) exits 1; a stop by
SIGTERM or SIGINT restores caps and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from agent.errors import CapwatchError, ConfigError
from agent.settings import add_agent_arguments, agent_settings
from server.demo import add_demo_arguments, run_demo
from server.launch import run_agent
from server.logs import configure_logging
from server.settings import add_server_arguments, server_settings
from server.shim import add_shim_arguments, main_shim
from server.watch import add_watch_arguments, run_watch, watch_settings

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
    add_server_arguments(agent)
    demo = commands.add_parser(
        "demo", help="run the agent on simulated GPUs and print every cycle as a table"
    )
    add_demo_arguments(demo)
    watch = commands.add_parser(
        "watch", help="follow an agent's health stream: a table per cycle, or JSON lines"
    )
    add_watch_arguments(watch)
    shim = commands.add_parser(
        "shim", help="serve GET /readyz for the kubelet from the agent's stream"
    )
    add_shim_arguments(shim)
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    parser = _parser()
    args = parser.parse_args(argv)
    prog = f"capwatch {args.command}"
    try:
        if args.command == "agent":
            settings = agent_settings(args, environ)
            serving = server_settings(args, environ)
            configure_logging(settings.log_level, settings.log_format)
            return asyncio.run(run_agent(settings, serving))
        if args.command == "shim":
            return main_shim(args, environ)
        if args.command == "watch":
            return run_watch(watch_settings(args, environ))
        return run_demo(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CapwatchError as exc:
        print(f"{prog}: cannot start: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
