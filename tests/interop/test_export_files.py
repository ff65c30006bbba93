"""What an export leaves where it writes: a file of the user's umask, like any file a program
makes; and when the medium fails (a full disk, a file size limit, a read-only filesystem, no
permission) nothing at all, and one error: `OutputWriteError` (an `OSError` with the OS's
errno) from the API, one ``error:`` line and exit 1 from the CLI. For every format, one file
per archive (``export --rollout-id``) and ``stats --plot``; also where torch hides the OS's
error inside its own (a full disk under ``export NAME out.pt`` printed torch's 79-line
traceback).

The full and read-only filesystems are real tmpfs mounts in a private mount namespace (root,
``unshare -m``; skipped with the reason elsewhere unless ``$ARCHIVE_MANAGER_REQUIRE_SHARING``
is set, as in CI); the file size limit (EFBIG, torch's and pyarrow's writes failing in C++)
needs no privilege.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _media import run_calls
from _sharing import child_env, require_mount_namespace
from click.testing import CliRunner
from helpers import tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import OutputWriteError

pytestmark = pytest.mark.timeout(300)

#: The CLI calls that write outside the pool; ``{out}`` is the folder they write into.
WRITERS = {
    "pt": ["export", "r", "{out}/r.pt"],
    "parquet": ["export", "r", "{out}/r.parquet"],
    "jsonl": ["export", "r", "{out}/r.jsonl"],
    "one file per archive": ["export", "--rollout-id", "1..2", "{out}/many", "--format", "pt"],
    "plot": ["stats", "--plot", "{out}/drift.png"],
}


@pytest.fixture(scope="module")
def pool_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pool of two archives, the first of which exports to more than 24 KB in every
    format (and draws a larger figure)."""
    root = tmp_path_factory.mktemp("exports") / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r", tiny_rollout(64, seed=1, rollout_id=1), rollout_id=1)
        pool.save("s", tiny_rollout(8, seed=2, rollout_id=2), rollout_id=2)
    return root


def _calls(out: Path) -> list[list[str]]:
    """`WRITERS`' calls into ``out`` (the plot where matplotlib is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        kinds = [k for k in WRITERS if k != "plot"]
    else:
        kinds = list(WRITERS)
    return [[a.format(out=out) for a in WRITERS[k]] for k in kinds]


def _one_line(stderr: str, returncode: int) -> str:
    """The one ``error:`` line of a failed CLI call."""
    lines = stderr.strip().splitlines()
    assert returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (
        returncode,
        stderr[-3000:],
    )
    return lines[0]


def _left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --------------------------------------------------------------------------- real media


def _check(results: list[dict[str, Any]], out: Path, says: str) -> None:
    """Each call failed with one ``error:`` line naming its file and saying ``says``, and
    left nothing in ``out`` (no partial file, no temp file, no folder made for it) and
    nothing of it open."""
    for result in results:
        shown = (result["args"], result["code"], result["stderr"][-2000:])
        assert not result["raised"] and result["code"] == 1, shown
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {out}/"), shown
        assert says in lines[0], shown
        assert result["left"] == [] and result["held"] == [], shown


#: Real filesystems that fail: tmpfs mount options, whether it is filled up first, and
#: what the error line says.
MOUNTS: dict[str, tuple[str, bool, str]] = {
    "a disk full before it starts": ("size=64k", True, "no space left on the device (ENOSPC)"),
    "a disk that fills up midway": ("size=16k", False, "no space left on the device (ENOSPC)"),
    "a read-only filesystem": ("ro,size=64k", False, "the filesystem is read-only (EROFS)"),
}


def test_a_full_or_read_only_filesystem_is_one_line_and_leaves_nothing(
    pool_root: Path, tmp_path: Path
) -> None:
    """Every writer onto real tmpfs mounts (a child in a private mount namespace): the
    kernel's error met inside torch's, pyarrow's and matplotlib's own writers as much as in
    Python's; the one file per archive export fails on its first archive, "r"."""
    require_mount_namespace()
    out = tmp_path / "out"
    out.mkdir()
    media = {name: (options, fill) for name, (options, fill, _) in MOUNTS.items()}
    script = Path(__file__).resolve().parents[1] / "_media.py"
    arguments = [str(pool_root), str(out), json.dumps(media), json.dumps(_calls(out))]
    done = subprocess.run(
        ["unshare", "-m", sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert list(results) == list(MOUNTS)
    for name, (_, _, says) in MOUNTS.items():
        _check(results[name], out, says)


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """This process may not write a file past ``limit`` bytes (``ulimit -f``): writes
    fail with EFBIG (SIGXFSZ ignored, which would kill it).

    No bytecode is written meanwhile: a module first imported under the limit would have its
    ``.pyc`` cut short (importlib writes it with one ``write`` and does not check the count)
    and put in place, and every later import of it, in any process sharing the cache, fails
    with "marshal data too short"."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    no_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        sys.dont_write_bytecode = no_bytecode
        signal.signal(signal.SIGXFSZ, handler)


def test_a_file_size_limit_is_one_line_and_leaves_nothing(pool_root: Path, tmp_path: Path) -> None:
    """EFBIG from the kernel once a file passes 24 KB (needs no privilege, unlike a mount)."""
    out = tmp_path / "out"
    out.mkdir()
    with _file_size_limit(24_000):
        results = run_calls(str(pool_root), out, _calls(out))
    _check(results, out, "this process's file size limit (EFBIG)")


# --------------------------------------------------------------------------- in process


@pytest.fixture
def pool(pool_root: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(pool_root, read_only=True) as opened:
        yield opened


def _deny_writes_under(folder: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every file or folder creation under ``folder`` fails with ``code`` (chmod does not stop
    root, whom CI runs as)."""
    real_open, real_mkdir = os.open, os.mkdir
    inside = str(folder) + os.sep

    def open_(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if str(path).startswith(inside) and flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    def mkdir(path: object, *args: object, **kwargs: object) -> None:
        if str(path).startswith(inside):
            raise OSError(code, os.strerror(code), str(path))
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)


@pytest.mark.parametrize("suffix", [".pt", ".parquet", ".jsonl"])
def test_no_permission_is_an_output_error_and_a_read_failure_is_not(
    pool: ArchiveManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = out / f"r{suffix}"
    with monkeypatch.context() as patch:
        _deny_writes_under(out, patch, errno.EACCES)
        with pytest.raises(OutputWriteError) as info:
            pool.export("r", target)
        result = CliRunner().invoke(
            cli, ["--root", str(pool.root), "--read-only", "export", "r", str(target)]
        )
    assert (
        isinstance(info.value, OSError)
        and info.value.errno == errno.EACCES
        and info.value.filename == str(target)
    )
    assert str(info.value) == (
        f"cannot write {target}: permission denied (EACCES); no partial file was left; "
        "write to a folder you may write"
    )
    assert _one_line(result.stderr, result.exit_code) == f"error: {info.value}"
    assert _left(out) == []
    # An existing file stays as it was, and the message says so.
    target.write_bytes(b"the previous export")
    with monkeypatch.context() as patch:
        _deny_writes_under(out, patch, errno.EROFS)
        with pytest.raises(OutputWriteError, match="the file there was left as it was"):
            pool.export("r", target, overwrite=True)
    assert target.read_bytes() == b"the previous export" and _left(out) == [target.name]
    # The pool failing to give a blob mid-export is the pool's error, not the file's.
    target.unlink()

    def broken_get(digest: str) -> bytes:
        raise OSError(errno.EIO, "Input/output error", "a blob")

    monkeypatch.setattr(pool.store, "get", broken_get)
    monkeypatch.setattr(pool.store, "get_view", broken_get)
    with pytest.raises(OSError) as failed:
        pool.export("r", target)
    assert not isinstance(failed.value, OutputWriteError) and failed.value.errno == errno.EIO
    assert _left(out) == []


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_every_export_follows_the_umask(pool: ArchiveManager, tmp_path: Path, umask: int) -> None:
    """Like any file a program writes for its user (a .pt export was 0600 whatever the
    umask, while Parquet and JSONL followed it)."""
    old = os.umask(umask)
    try:
        paths = [pool.export("r", tmp_path / f"r{s}") for s in (".pt", ".parquet", ".jsonl")]
        paths += pool.export_many(tmp_path / "many", format="pt")
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            pass
        else:
            plot = tmp_path / "drift.svg"
            result = CliRunner().invoke(
                cli, ["--root", str(pool.root), "--read-only", "stats", "--plot", str(plot)]
            )
            assert result.exit_code == 0, result.output
            paths.append(plot)
    finally:
        os.umask(old)
    for path in paths:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
