"""The pool's sharing mode whatever the writer's umask (docs/architecture/shared-pools.md, "Shared
pools"): every folder the pool creates gets the access its parent grants, and every file it writes
for others to read (journal records and checkpoints, the identity file and its spare, a new
catalog file and its ``-wal``/``-shm``) is readable by every class its folder lets in.

Issue 36, case 6: in a group-shared pool, a member with umask 077 wrote journal records 0400
(blobs were forced to 0444, journal records were not); after a lost catalog another member's
rebuild could not read them, called them damaged, ``--resolve`` quarantined them, and GC then
deleted an archive a checkpoint retained.  The writes run in a child process under the umask
(the umask is the process's); the checks read mode bits, which hold as root too.  The same
pool with a real second account is in ``test_shared_pools.py``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _sharing import child_env

from archive_manager import ArchiveManager
from archive_manager._util.permissions import FOLDER_BITS

# Everything a pool writes, under the umask given: decisions (journal records), a GC (a
# checkpoint), a lost catalog rebuilt (a new catalog file, the identity written again, a
# checkpoint) with a damaged record accepted (journal/damaged/), and a spare identity file
# written back.  Prints every path's mode while the catalog is open (its -wal and -shm exist).
_WRITER = """
import json, os, sys
from pathlib import Path
os.umask(int(sys.argv[2], 8))
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
root = Path(sys.argv[1])
tiny = dict(prompt_len=8, response_min=4, response_max=12, group_size=2)
with ArchiveManager.open(root) as pool:
    pool.save("a", make_rollout(6, seed=1, **tiny), rollout_id=1)
    pool.save("b", make_rollout(6, seed=2, **tiny), rollout_id=2)
    pool.retain("checkpoint:1", "a")
    pool.open_archive("b").release()
    pool.gc(grace=0)
for side in ("", "-wal", "-shm"):
    Path(f"{root}/catalog.db{side}").unlink(missing_ok=True)
(root / "blobs" / ".archive-pool.json").unlink()
(root / "journal" / f"{1:020d}-{'0' * 32}.rec").write_bytes(b"torn")
with ArchiveManager.open(root, recover=True) as pool:
    report = pool.rebuild_catalog(resolve=True)
    assert report.archives == ["a"] and report.reclaimed == ["b"], report
with ArchiveManager.open(root) as pool:
    owners = sorted(pool.open_archive("a").owners())
    modes = {
        str(p.relative_to(root)): os.lstat(p).st_mode
        for p in [root, *root.rglob("*")]
    }
    print(json.dumps({"owners": owners, "modes": modes}))
"""


def _write_under_umask(root: Path, umask: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(root), f"{umask:o}"],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["owners"] == ["archive:a", "checkpoint:1"]
    modes: dict[str, int] = out["modes"]
    return modes


def _expected(root_mode: int, path: str, mode: int) -> int:
    """The bits ``path`` must have in a pool whose root has ``root_mode``."""
    shared = root_mode & FOLDER_BITS == FOLDER_BITS
    if stat.S_ISDIR(mode):
        return root_mode & 0o055 | (FOLDER_BITS if shared else 0) | stat.S_IRWXU
    readable = stat.S_IRUSR
    if root_mode & stat.S_IXGRP:
        readable |= stat.S_IRGRP
    if root_mode & stat.S_IXOTH:
        readable |= stat.S_IROTH
    if Path(path).name.startswith("catalog.db"):
        return readable | stat.S_IWUSR | (stat.S_IWGRP if shared else 0)
    return readable


@pytest.mark.parametrize(
    ("kind", "umask"),
    [("group-shared", 0o077), ("readable-by-all", 0o077), ("readable-by-all", 0o027)],
)
def test_every_file_the_pool_writes_has_its_sharing_mode_whatever_the_umask(
    tmp_path: Path, kind: str, umask: int
) -> None:
    """A group-shared pool (``init --shared-group``) and a pool whose root lets everyone in
    (0755: readers on other accounts), written whole by a process whose umask is 077 or
    027: every folder and file the others must read lets them read it."""
    root = tmp_path / "pool"
    if kind == "group-shared":
        with ArchiveManager.open(root) as pool:
            pool.share_with_group(os.getgid())
    else:
        root.mkdir()
        root.chmod(0o755)
    modes = _write_under_umask(root, umask)
    root_mode = modes.pop(".")
    assert root_mode & 0o055 == 0o055 and (kind != "group-shared" or root_mode & FOLDER_BITS)
    journal = [p for p in modes if p.startswith("journal/") and p.endswith((".rec", ".ckpt"))]
    assert journal and "catalog.db-wal" in modes and "blobs/.archive-pool.json" in modes
    assert "journal/damaged" in modes
    wrong = {}
    for path, mode in sorted(modes.items()):
        if path.startswith("journal/damaged/"):
            continue  # evidence for the operator, moved there as it was found
        if path.startswith("blobs/") and len(Path(path).name) == 32:
            if stat.S_IMODE(mode) != 0o444:
                wrong[path] = oct(mode)
            continue
        wanted = _expected(root_mode, path, mode)
        if mode & wanted != wanted:
            wrong[path] = f"{oct(stat.S_IMODE(mode))}, wanted at least {oct(wanted)}"
    assert not wrong, wrong


def test_a_root_made_in_a_shared_folder_gets_its_sharing_mode_whatever_the_umask(
    tmp_path: Path,
) -> None:
    """A pool created under umask 077 inside a setgid group folder (the team's folder): every
    folder below the root got the group's bits, the root itself none (2700), so the group
    could not enter a pool that `verify` called shared."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    root = team / "runs" / "pool"
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; os.umask(0o077); from archive_manager import ArchiveManager; "
            "ArchiveManager.open(sys.argv[1]).close()",
            str(root),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    for folder in (root.parent, root, root / "blobs", root / "journal"):
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        assert mode & FOLDER_BITS == FOLDER_BITS, (folder, oct(mode))
