"""The ``capwatch`` command line: ``agent``, ``shim``, ``watch``, ``demo``, ``forget``,
``controller``, ``pool`` and ``probe``.

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
from typing import TYPE_CHECKING, Any, NoReturn

from capwatch.kit.errors import CapwatchError, ConfigError

if TYPE_CHECKING:
    from capwatch.kit.flags import Option

log = logging.getLogger("capwatch")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Each subcommand's modules are imported only when it runs (or when its options
# are defined): the readiness shim, a container of its own in every agent pod,
# would otherwise load the agent, the simulator and prometheus_client it never
# uses (about 7 MiB of its 48 MiB request).
COMMANDS = {
    "agent": "run the node agent",
    "demo": "run the agent on simulated GPUs and print every cycle as a table",
    "watch": "follow an agent's health stream: a table per cycle, or JSON lines",
    "shim": "serve GET /readyz for the kubelet from the agent's stream",
    "forget": "tell the agent on this node that a GPU it capped is gone for good",
    "controller": "run the cluster controller ('controller cleanup' removes its Node condition)",
    "pool": "serve many simulated nodes from one process (scale tests, demos)",
    "probe": "show what this node's GPUs answer through NVML (reads, events); writes nothing",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed; a flag nobody knows is reported before a missing command (argparse
    says only that the command is missing), and after a command in its name: its
    subparser collected it."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        prog = "capwatch" if args.command is None else f"capwatch {args.command}"
        _Parser(prog=prog).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error(f"a command is required: one of {', '.join(COMMANDS)} (see --help)")
    return args


class _Version(argparse.Action):
    """``--version``: reads the installed package's metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=kwargs.get("help"))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from importlib import metadata

        try:
            version = metadata.version("capwatch")
        except metadata.PackageNotFoundError:  # run from a source tree without installing
            version = "(version unknown: not installed)"
        print(f"capwatch {version}")
        parser.exit(EXIT_OK)


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``only``, the options of that subcommand alone ("": none)."""
    parser = _Parser(prog="capwatch", description="GPU power-cap agent for Kubernetes nodes.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    # Not required=True: _parse says a command is missing once no flag is unknown.
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    for name, summary in COMMANDS.items():
        command = commands.add_parser(name, help=summary)
        if only in (None, name):
            _add_arguments(name, command)
    return parser


def _add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    if command == "agent":
        from capwatch.agent.settings import add_agent_arguments
        from capwatch.server.settings import add_server_arguments

        add_agent_arguments(parser)
        add_server_arguments(parser)
    elif command == "demo":
        from capwatch.demo.settings import add_demo_arguments

        add_demo_arguments(parser)
    elif command == "watch":
        from capwatch.watch.command import add_watch_arguments

        add_watch_arguments(parser)
    elif command == "shim":
        from capwatch.shim import add_shim_arguments

        add_shim_arguments(parser)
    elif command == "pool":
        from capwatch.pool import add_pool_arguments

        add_pool_arguments(parser)
    elif command == "probe":
        from capwatch.agent.nvml.probe import add_probe_arguments

        add_probe_arguments(parser)
    elif command == "controller":
        from capwatch.controller.settings import add_controller_arguments

        parser.add_argument(
            "action",
            nargs="?",
            choices=("run", "cleanup"),
            default="run",
            help="run (the default), or cleanup: remove GPUPowerCapEnforced from every Node",
        )
        add_controller_arguments(parser)
    else:
        from capwatch.agent.forgetting import add_forget_arguments
        from capwatch.kit.flags import add_options

        add_forget_arguments(parser)
        add_options(parser, _forget_logging())


def _forget_logging() -> tuple[Option, ...]:
    from capwatch.kit.flags import LOG_FORMAT_OPTION, log_level_option

    return (log_level_option("warning"), LOG_FORMAT_OPTION)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else list(argv)
    # No subcommand named (--help, a typo): none of their options are needed.
    only = argv[0] if argv and argv[0] in COMMANDS else ""
    args = _parse(_parser(only), argv)
    prog = f"capwatch {args.command}"
    try:
        return _run(args, environ)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CapwatchError as exc:
        print(f"{prog}: cannot start: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.command == "agent":
        from capwatch.agent.settings import agent_settings
        from capwatch.launch import run_agent, settle_heap_when_serving
        from capwatch.logs import configure_logging
        from capwatch.server.settings import server_settings

        settings = agent_settings(args, environ)
        serving = server_settings(args, environ)
        configure_logging(settings.log_level, settings.log_format)
        return asyncio.run(run_agent(settings, serving, on_serving=settle_heap_when_serving))
    if args.command == "shim":
        from capwatch.shim import main_shim

        return main_shim(args, environ)
    if args.command == "watch":
        from capwatch.logs import configure_logging
        from capwatch.watch.command import run_watch, watch_settings

        watching = watch_settings(args, environ)
        configure_logging(watching.log_level, watching.log_format)
        return run_watch(watching)
    if args.command == "forget":
        from capwatch.agent.forgetting import run_forget
        from capwatch.kit.flags import read_options
        from capwatch.logs import configure_logging

        logging_values = read_options(args, environ, _forget_logging())
        configure_logging(logging_values["log_level"], logging_values["log_format"])
        return run_forget(args, environ, sys.stdout)
    if args.command == "controller":
        return _controller(args, environ)
    if args.command == "probe":
        from capwatch.agent.nvml.probe import probe_settings, run_probe
        from capwatch.kit.flags import LogFormat
        from capwatch.logs import configure_logging

        probing = probe_settings(args, environ)
        configure_logging("WARNING", LogFormat.TEXT)
        return run_probe(probing, sys.stdout)
    if args.command == "pool":
        from capwatch.logs import configure_logging
        from capwatch.pool import pool_command, run_pool

        command = pool_command(args, environ)
        configure_logging(command.log_level, command.log_format)
        return asyncio.run(run_pool(command))
    from capwatch.demo.node import run_demo
    from capwatch.demo.settings import demo_settings

    demo = demo_settings(args, environ)
    if demo.cluster:
        from capwatch.demo.cluster import run_cluster_demo

        return run_cluster_demo(demo)
    return run_demo(demo)


def _controller(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from capwatch.controller.settings import controller_settings
    from capwatch.logs import configure_logging

    settings = controller_settings(args, environ)
    configure_logging(settings.log_level, settings.log_format)
    if args.action == "cleanup":
        from capwatch.controller.cleanup import run_cleanup

        return asyncio.run(run_cleanup(settings, out=sys.stdout))
    from capwatch.controller.running import run_controller

    return asyncio.run(run_controller(settings))


if __name__ == "__main__":
    sys.exit(main())
