"""Counts and ports take ASCII digits only: another script's digits or a superscript is a
one-line configuration error (exit 2), never a traceback or a number read from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from capwatch.cli import main

CASES = [
    ("agent", "--grpc-max-subscribers"),
    ("agent", "--metrics-port"),
    ("demo", "--readyz-port"),
    ("demo", "--cycles"),
    ("watch", "--count"),
    ("controller", "--shards"),
    ("controller", "--shard-index"),
    ("controller", "--agent-port"),
    ("pool", "--nodes"),
]


@pytest.mark.parametrize("digits", ["²", "٣", "1²"])
@pytest.mark.parametrize(("command", "flag"), CASES, ids=[f"{c} {f}" for c, f in CASES])
def test_a_number_in_other_digits_is_one_line_exit_2(
    command: str, flag: str, digits: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--flag ²`` (or Arabic-Indic three) names the flag on one line, exit 2."""
    extra = {
        "agent": ["--gpu-backend", "sim", "--state-dir", str(tmp_path)],
        "controller": ["--namespace", "capwatch"],
    }.get(command, [])
    code = main([command, *extra, flag, digits], {})
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert flag in err
    assert "Traceback" not in err
