"""Shell completion (``_ARCHIVE_MANAGER_COMPLETE=bash_complete``, in a fresh process): it
offers only published archives and writes nothing beside the catalog, not even the -wal and
-shm files a read-only SQLite open would make or rewrite."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import die_before_publish, small_rollout

from archive_manager import ArchiveManager

WORKTREE = Path(__file__).resolve().parents[2]


def _complete(root: Path, words: str, *options: str) -> list[str]:
    """What bash completion of ``archive-manager --root ROOT [options] words`` offers (fresh
    process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARCHIVE_MANAGER_", "_ARCH"))}
    env["PYTHONPATH"] = str(WORKTREE)
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    env.update(
        _ARCHIVE_MANAGER_COMPLETE="bash_complete",
        COMP_WORDS=" ".join(["archive-manager", "--root", str(root), *options, words]),
        COMP_CWORD=str(cword + 3 + len(options)),
    )
    done = subprocess.run(
        [sys.executable, "-c", "from archive_manager.cli import main; main()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def _files(root: Path) -> dict[str, str]:
    """Every catalog file beside the pool's root and its digest."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.glob("catalog.db*")}


def test_completion_creates_no_wal_or_shm_file(tmp_path: Path) -> None:
    # Break: a plain `mode=ro` open of a WAL catalog that no process holds creates -wal and
    # -shm beside it (owned by whoever pressed TAB, with their umask), so completion wrote.
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("rollout-1", small_rollout(3, seed=1), rollout_id=1)
    before = _files(root)
    assert set(before) == {"catalog.db"}
    assert _complete(root, "show ") == ["plain,rollout-1"]
    assert _files(root) == before


def test_completion_leaves_a_dead_writers_wal_files_unchanged(tmp_path: Path) -> None:
    # Break: with a dead writer's -wal and -shm left behind, `mode=ro` without readonly_shm
    # rebuilds the wal-index in -shm and writes read marks into it.
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("rollout-1", small_rollout(3, seed=1), rollout_id=1)
    script = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "c.execute(\"UPDATE archives SET attrs = attrs WHERE name = 'rollout-1'\")\n"
        "os._exit(0)\n"  # no checkpoint, no close: -wal and -shm stay as a dead writer's
    )
    subprocess.run([sys.executable, "-c", script, str(root / "catalog.db")], check=True)
    before = _files(root)
    assert set(before) == {"catalog.db", "catalog.db-wal", "catalog.db-shm"}
    # Scramble the wal-index header so a reader must rebuild it, as after a crash.
    shm = root / "catalog.db-shm"
    shm.write_bytes(b"\0" * shm.stat().st_size)
    before = _files(root)
    assert _complete(root, "show ") == ["plain,rollout-1"]
    assert _files(root) == before


@pytest.mark.parametrize("options", ["", "?timeout=5"], ids=["sqlite3", "library"])
def test_completion_never_offers_a_pending_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: str
) -> None:
    # Break: completion listed every row of `archives`, a save in progress (or one that died
    # before publishing) included; `show` of that name then fails.
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("rollout-1", small_rollout(3, seed=1), rollout_id=1)
        die_before_publish(pool, "rollout-2", small_rollout(3, seed=2), monkeypatch)
        assert {i.name for i in pool.find(state=None)} == {"rollout-1", "rollout-2"}
    # A catalog URL with options is read through the library's read-only open instead.
    url = ["--catalog-url", f"sqlite:///{root / 'catalog.db'}{options}"] if options else []
    assert _complete(root, "show roll", *url) == ["plain,rollout-1"]
