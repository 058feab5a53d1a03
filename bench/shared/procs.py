"""A process read from outside, as an operator would: its CPU time and memory from /proc,
its Prometheus metrics from its endpoint."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

# A sample's name and sorted labels -> its value.
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds so far (fields 14 and 15 of /proc/PID/stat; the
    command name, field 2, may hold spaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int | str, field: str = "VmRSS") -> int:
    """A memory figure of /proc/PID/status (``pid`` "self" for this process), in KiB;
    RuntimeError where it has none (a process that has exited)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def rss_mib(pid: int | str) -> float:
    """The resident set now, in MiB; 0 for a process that has exited (a sample taken as
    it goes is no figure)."""
    try:
        return status_kib(pid) / 1024
    except RuntimeError:
        return 0.0


def parse_metrics(text: str) -> Metrics:
    # Imported here: the heap profiler imports this module before it starts tracing, and
    # the process it traces loads the parser itself.
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> Metrics:
    """The metrics a process serves on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return parse_metrics(answer.read().decode())
