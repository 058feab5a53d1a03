"""``capwatch demo``: the agent on simulated GPUs, its gRPC stream, and a live table.

Everything a newcomer needs to see the product work on a laptop: the built-in
scenario (a write that fails for a few cycles, then recovers), every cycle
printed as a per-GPU table, and the same stream served over gRPC for
``capwatch watch`` and ``grpcurl``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

from agent.assembly import load_settings_scenario
from agent.rendering import render_report
from agent.reports import CycleReport
from agent.settings import BackendKind, agent_settings
from server.launch import run_agent
from server.logs import configure_logging
from server.serving import AgentServer
from server.settings import server_settings

DEFAULT_DEMO_LISTEN = "127.0.0.1:50051"


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", help="scenario file (default: the built-in scenario)")
    parser.add_argument("--interval", help="seconds between cycles (default: the scenario's)")
    parser.add_argument("--cycles", type=int, default=None, help="stop after this many cycles")
    parser.add_argument(
        "--grpc-listen",
        action="append",
        help=f"address to serve the stream on, repeatable (default {DEFAULT_DEMO_LISTEN})",
    )


def run_demo(args: argparse.Namespace) -> int:
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
    # No metrics endpoint: a demo must start anywhere, and 9400 may be taken.
    serving = server_settings(
        argparse.Namespace(grpc_listen=args.grpc_listen or [DEFAULT_DEMO_LISTEN], metrics_port="0"),
        {},
    )
    configure_logging(settings.log_level, settings.log_format)
    print(f"capwatch demo: {scenario.description.strip() or scenario.source}")
    print(
        f"node {settings.node_name or scenario.node_name}, {len(scenario.gpus)} simulated GPUs, "
        f"a cycle every {settings.interval_s:g}s; Ctrl-C stops and restores caps.",
        flush=True,
    )

    def serving_on(server: AgentServer) -> None:
        tcp = next((a for a in server.addresses if not a.startswith("unix:")), None)
        target = tcp or server.addresses[0]
        print(
            f"the stream is served on {', '.join(server.addresses)}; in another terminal:\n"
            f"  capwatch watch --target {target}\n"
            f"  capwatch watch --target {target} --dra v1\n"
            f"  grpcurl -plaintext {target} list\n",
            flush=True,
        )

    def show(report: CycleReport) -> None:
        print(render_report(report) + "\n", flush=True)

    return asyncio.run(
        run_agent(settings, serving, on_report=show, on_serving=serving_on, max_cycles=args.cycles)
    )
