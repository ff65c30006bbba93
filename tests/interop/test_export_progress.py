"""An export's progress: the library counts the stored bytes it read, and ``archive-manager
export`` draws them as a byte bar with an ETA on a terminal, and nothing when stderr is not a
terminal, with ``--json`` or with ``-q`` (docs/architecture/getting-data-out.md, "Getting data
out")."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import small_rollout

from archive_manager import ArchiveManager

pytestmark = pytest.mark.timeout(600)

WORKTREE = Path(__file__).resolve().parents[2]
ENTRY = "from archive_manager.cli import main; main()"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two archives of several chunks, with routed-expert tensors stored as tensor blobs."""
    root = tmp_path_factory.mktemp("progress") / "pool"
    with ArchiveManager.open(root, inline_limit=64, chunk_size=4) as pool:
        for i in range(2):
            pool.save(f"rollout-{i}", small_rollout(10, seed=i, r3_layers=2), rollout_id=i)
    yield root


def _calls(export: object) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    assert callable(export)
    export(lambda done, total: calls.append((done, total)))
    return calls


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".pt"])
def test_export_counts_the_bytes_it_reads(root: Path, tmp_path: Path, suffix: str) -> None:
    with ArchiveManager.open(root) as pool:
        arc = pool.open_archive("rollout-0")
        sizes = arc.payload_sizes()
        chunks = {c["digest"] for c in arc.chunks()}
        calls = _calls(
            lambda progress: pool.export("rollout-0", tmp_path / f"a{suffix}", progress=progress)
        )
        info = arc.info()
    assert len(chunks) > 1 and set(sizes) > chunks  # chunks and tensor blobs
    total = sum(sizes.values())
    # Everything but the manifest, which an export does not read.
    assert 0 < total < info.bytes
    assert {t for _, t in calls} == {total}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total
    assert len(set(done)) >= len(sizes)  # one step per blob read, not one jump at the end


def test_export_many_counts_the_bytes_of_every_archive(root: Path, tmp_path: Path) -> None:
    with ArchiveManager.open(root) as pool:
        total = sum(
            sum(pool.open_archive(n).payload_sizes().values()) for n in ("rollout-0", "rollout-1")
        )
        first = sum(pool.open_archive("rollout-0").payload_sizes().values())
        calls = _calls(
            lambda progress: pool.export_many(
                tmp_path / "out", format="jsonl", rollout_ids=(0, 1), progress=progress
            )
        )
    assert {t for _, t in calls} == {total}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total
    assert first in done  # the first archive's bytes, then the second's on top


def _export(root: Path, *args: str, tty: bool) -> tuple[int, str]:
    """Run ``archive-manager --root ROOT *args`` in a fresh process, stderr on a
    pseudo-terminal when ``tty``; its exit code and what it wrote to stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKTREE), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "120"
    argv = [sys.executable, "-c", ENTRY, "--root", str(root), *args]
    if not tty:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stderr
    master, slave = pty.openpty()
    try:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        slave = -1
        out = bytearray()
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            out += data
        code = child.wait(timeout=300)
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    return code, out.decode(errors="replace")


def test_the_cli_draws_a_byte_bar_on_a_terminal_only(root: Path, tmp_path: Path) -> None:
    code, err = _export(root, "export", "rollout-0", str(tmp_path / "a.jsonl"), tty=True)
    assert code == 0, err
    assert "exporting" in err
    assert " of " in err and "KiB" in err  # bytes done of the total, in binary units
    # A folder of archives too.
    code, err = _export(root, "export", "--rollout-id", "0..1", str(tmp_path / "many"), tty=True)
    assert code == 0, err
    assert "exporting archives" in err and " of " in err
    # Silent: -q, --json, and a stderr that is no terminal.
    for args, tty in (
        (["-q", "export", "-f", "rollout-0", str(tmp_path / "a.jsonl")], True),
        (["export", "-f", "--json", "rollout-0", str(tmp_path / "a.jsonl")], True),
        (["export", "-f", "rollout-0", str(tmp_path / "a.jsonl")], False),
    ):
        code, err = _export(root, *args, tty=tty)
        assert code == 0, (args, err)
        assert "exporting" not in err and " of " not in err, (args, err)
