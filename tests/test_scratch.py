"""Scratch directories (kit/scratch.py): removed by their process, or, when it was
SIGKILLed before it could, by the next one made with the same prefix; never one whose
process is alive."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from capwatch.kit.scratch import ScratchDirectory, sweep

PREFIX = "capwatch-test-scratch-"
# A process that makes a scratch directory, says where, and waits to be killed.
HOLDER = (
    "import sys, time; from pathlib import Path; "
    "from capwatch.kit.scratch import ScratchDirectory; "
    f"made = ScratchDirectory({PREFIX!r}, parent=Path(sys.argv[1])); "
    "(made.path / 'file').write_text('x'); print(made.path, flush=True); time.sleep(600)"
)


@contextlib.contextmanager
def holder(parent: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A live process holding a scratch directory under ``parent``; killed at the end."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(parent)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ) as process:
        assert process.stdout is not None
        try:
            yield process, Path(process.stdout.readline().strip())
        finally:
            process.kill()


def test_a_sigkilled_processs_directory_goes_at_the_next_start(tmp_path: Path) -> None:
    """SIGKILL (no handler, no finally) leaves the directory, named with the pid; the next
    ScratchDirectory of that prefix removes it, with what is in it."""
    with holder(tmp_path) as (process, left):
        assert left.name.startswith(f"{PREFIX}{process.pid}-")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert (left / "file").exists()
    with ScratchDirectory(PREFIX, parent=tmp_path) as mine:
        assert not left.exists()
        assert mine.is_dir()
    assert not mine.exists()


def test_a_live_processs_directory_is_left_alone(tmp_path: Path) -> None:
    """Another live process's directory, and this process's own, survive a sweep."""
    with holder(tmp_path) as (_, theirs), ScratchDirectory(PREFIX, parent=tmp_path) as mine:
        assert sweep(PREFIX, tmp_path) == []
        assert (theirs / "file").exists()
        assert mine.is_dir()
    assert sweep(PREFIX, tmp_path) == [theirs]


def test_only_names_it_gives_are_swept(tmp_path: Path) -> None:
    """Other prefixes, names without a pid (tempfile's), and files are never touched."""
    kept = [
        tmp_path / "capwatch-test-scratch-abc123",  # tempfile.mkdtemp's form: no pid
        tmp_path / "capwatch-other-4242-abc",
        tmp_path / f"{PREFIX}4242-abc.txt",
    ]
    for path in kept[:2]:
        path.mkdir()
    kept[2].write_text("a file")
    assert sweep(PREFIX, tmp_path) == []
    assert all(path.exists() for path in kept)
