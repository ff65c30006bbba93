"""An export killed (kill -9) between writing its temp file and renaming it over the target:
the target keeps what it held, and the export's own error path never ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_rollout

from archive_manager import ArchiveManager

_CHILD = """
import os, sys, time
real = os.replace
def stalled(src, dst, *a, **k):
    if str(dst) == sys.argv[3]:
        print("renaming", flush=True)
        time.sleep(600)
    return real(src, dst, *a, **k)
os.replace = stalled
from archive_manager import ArchiveManager
with ArchiveManager.open(sys.argv[1]) as pool:
    pool.export(sys.argv[2], sys.argv[3], overwrite=True)
"""


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_an_export_killed_before_its_rename_leaves_the_target_as_it_was(
    tmp_path: Path, suffix: str
) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(8), rollout_id=1)
    out = tmp_path / f"a{suffix}"
    out.write_bytes(b"the previous export")
    # The with-block closes the pipe whatever happens (an unclosed one is a ResourceWarning).
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), "a", str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "renaming"
            temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            assert len(temps) == 1 and temps[0].stat().st_size > 0  # written, fsynced, not renamed
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
    assert out.read_bytes() == b"the previous export"
    with ArchiveManager.open(root) as pool:
        assert pool.verify().ok
