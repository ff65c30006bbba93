"""Helpers of tests/pool/test_shared_pools.py: what the machine allows (a private mount namespace,
throwaway users), a byte-for-byte picture of a pool's folder, and running Python as another
account.

The read-only mount and two-user tests need root, ``unshare -m``, ``mount`` and
``useradd``/``groupadd``; where one is missing they skip with the reason, unless
``$ARCHIVE_MANAGER_REQUIRE_SHARING`` is set (CI sets it: CI runs as root on a machine that has
them all), which turns the skip into a failure.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REQUIRE_ENV = "ARCHIVE_MANAGER_REQUIRE_SHARING"
WORKTREE = Path(__file__).resolve().parents[1]


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``, or fail where CI said the capability must be there."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{reason} (and ${REQUIRE_ENV} is set)")
    pytest.skip(reason)


@functools.lru_cache(maxsize=1)
def _mount_namespace_problem() -> str | None:
    if os.geteuid() != 0:
        return "a read-only bind mount needs root (unshare -m, mount)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare or mount is missing"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind / /mnt && mount -o remount,ro,bind /mnt"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"this sandbox allows no private read-only bind mount: {probe.stderr.strip()}"
    return None


def require_mount_namespace() -> None:
    """Skip (or fail, see `REQUIRE_ENV`) unless a private read-only bind mount works here."""
    problem = _mount_namespace_problem()
    if problem is not None:
        skip_or_fail(problem)


def require_users() -> None:
    """Skip (or fail) unless throwaway users and groups can be made (and a mount namespace)."""
    require_mount_namespace()
    missing = [
        t for t in ("useradd", "groupadd", "userdel", "groupdel", "setpriv") if not shutil.which(t)
    ]
    if missing:
        skip_or_fail(f"{', '.join(missing)} missing: no throwaway users")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python: this worktree's package first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(WORKTREE), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    for name in (
        "ARCHIVE_MANAGER_READ_ONLY",
        "ARCHIVE_MANAGER_CATALOG_URL",
        "ARCHIVE_MANAGER_ROOT",
    ):
        env.pop(name, None)  # the tester's own settings must not reach the child
    env.update(extra)
    return env


def run_python(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c script args...`` in a child with `child_env`, its output captured as text
    (for what must be seen from outside the process: a crash by signal, an exit)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout,
    )


def read_only_mount_command(source: Path, mount: Path, command: list[str]) -> list[str]:
    """``command`` run in a private mount namespace where ``mount`` is a read-only bind mount
    of ``source`` (nothing of it is visible outside the namespace)."""
    script = 'mount --bind "$1" "$2" && mount -o remount,ro,bind "$2" && shift 2 && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", str(source), str(mount), *command]


def tree(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every path under ``root`` (root itself included): mode, mtime and, for files, bytes."""
    out: dict[str, tuple[int, int, bytes | None]] = {}
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = Path(folder) / name
            st = os.lstat(path)
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, data)
    return out


# --------------------------------------------------------------------------- other accounts


def _python_paths() -> set[Path]:
    """The folders this Python's files live in: interpreter, standard library, site-packages
    (a virtual environment's and its base's)."""
    wanted = {Path(sys.base_prefix), Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])}
    wanted.add(Path(os.path.realpath(sys.executable)).parent)
    return wanted


def blocking_ancestors(targets: set[Path]) -> dict[Path, set[str]]:
    """Every folder on the way to ``targets`` that other accounts cannot enter, with the
    children leading on, outermost first: ``/root`` for a pyenv build in root's home, and a
    private temp folder holding a virtual environment, at once."""
    found: dict[Path, set[str]] = {}
    for target in targets:
        parts = target.resolve().parts
        for i in range(1, len(parts)):
            folder = Path(*parts[:i])
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                found.setdefault(folder, set()).add(parts[i])
    return dict(sorted(found.items(), key=lambda item: len(item[0].parts)))


def as_user_prefix(user: str, group: str, scratch: Path) -> tuple[str, list[str]]:
    """Shell lines to run first in the mount namespace so that ``user`` can run this Python,
    and the command prefix that runs a command as ``user`` (primary group ``group``, umask 022).

    NOTE: this Python may live in root's home (pyenv), which other accounts cannot enter,
    with its shared library found there by absolute path, and its virtual environment in
    another such folder.  Inside the private namespace only, a world-enterable stand-in of
    each such folder is mounted over it, holding just the ways to the Python (bind mounts of
    the real child folders): the files keep their paths.  Outer folders go first, so an inner
    one is reached through its outer stand-in.
    """
    setup = ""
    for folder, children in blocking_ancestors(_python_paths()).items():
        stand_in = scratch / f"stand-in-{uuid.uuid4().hex[:8]}"
        stand_in.mkdir(parents=True)
        os.chmod(stand_in, 0o755)
        for child in sorted(children):
            (stand_in / child).mkdir()
            setup += f'mount --bind "{folder / child}" "{stand_in / child}" && '
        setup += f'mount --rbind "{stand_in}" "{folder}" && '
    prefix = ["setpriv", "--reuid", user, "--regid", group, "--clear-groups", "--"]
    return setup, prefix


@contextmanager
def throwaway_users(count: int) -> Iterator[tuple[str, list[str]]]:
    """A new group and ``count`` new users whose primary group it is; removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    group = f"amg{tag}"
    users = [f"amu{tag}{i}" for i in range(count)]
    made: list[str] = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for user in users:
            subprocess.run(
                ["useradd", "-M", "-N", "-g", group, "-s", "/bin/sh", user],
                check=True,
                capture_output=True,
            )
            made.append(user)
        yield group, users
    finally:
        for user in made:
            subprocess.run(["userdel", user], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
