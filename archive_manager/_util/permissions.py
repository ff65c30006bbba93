"""Group-shared pools: several accounts of one group save into, release from and collect one
pool (docs/architecture/shared-pools.md, "Shared pools").

What such a pool needs on the filesystem, and why:

* every folder (root, ``blobs/``, its fan-out folders, ``tmp/``) owned by the group, with the
  group's read, write and search bits and the set-group-id bit: any member creates and
  unlinks blobs, temp files and the SQLite catalog's ``-wal``/``-shm`` there, and what is
  created inside gets the group (the set-group-id bit is inherited by new folders);
* the SQLite catalog file (and its ``-wal``/``-shm``) readable and writable by the group.
  SQLite gives new ``-wal``/``-shm`` files the database file's own mode;
* blob files read-only for everyone, as always (0444): nobody rewrites a blob, and unlinking
  one needs only its folder's write bit.  Temp files are written only by the process that
  created them, so they need no group bit either.

`share_pool` sets that up (``archive-manager init --shared-group NAME``), `shared_problems`
finds what would lock another member out (``verify`` reports it as a notice), and
`share_like_parent`, `readable_bits` and `share_new_catalog` give every folder and file the
pool writes later the pool's sharing mode whatever the umask of the account that writes it.

The pool's sharing mode is its folders' (the root's, as whoever made it or `share_pool` set
it): a folder the pool creates gets the access its parent grants (the group's bits and the
set-group-id bit of a shared pool, read and search for others where the parent has them), and
a file the pool writes for others to read (journal records and checkpoints, the identity
file and its spare, a new catalog file) is readable by every class its folder lets in.  A
member whose umask is 077 therefore writes files the others read, and an owner who keeps the
root 0700 keeps a private pool.  The module knows no catalog: it is handed the file's path.
"""

from __future__ import annotations

import grp
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

__all__ = [
    "FOLDER_BITS",
    "SharedReport",
    "readable_bits",
    "share_like_parent",
    "share_new_catalog",
    "share_pool",
    "shared_problems",
]

FOLDER_BITS = stat.S_ISGID | stat.S_IRWXG
"""What every folder of a shared pool has: set-group-id, group read, write and search."""
_CATALOG_BITS = stat.S_IRGRP | stat.S_IWGRP
_SIDE_FILES = ("", "-wal", "-shm")
_SHOWN = 3  # paths named per problem; the count says how many more


@dataclass
class SharedReport:
    """What `share_pool` did: the group, and how many folders and files it changed."""

    group: str
    gid: int
    folders: int = 0
    files: int = 0
    changed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "group": self.group,
            "gid": self.gid,
            "folders": self.folders,
            "files": self.files,
        }


def _group(group: str | int) -> tuple[str, int]:
    try:
        entry = grp.getgrgid(group) if isinstance(group, int) else grp.getgrnam(group)
    except (KeyError, OverflowError, TypeError, ValueError):
        if isinstance(group, str) and group.isdigit():
            return _group(int(group))
        raise InvalidInputError(f"there is no group {group!r} on this machine") from None
    return entry.gr_name, entry.gr_gid


# What a new folder takes from its parent: read and search for the group and for others
# (never others' write: a pool is shared with a group, not with everyone).
_INHERITED = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH


def share_like_parent(folder: str | os.PathLike[str]) -> None:
    """Give a folder just created the access its parent grants: the group's bits and the
    set-group-id bit when the parent is shared, read and search for the group and for others
    where the parent has them.  Bits are only ever added.

    NOTE: a new folder inherits its parent's group and set-group-id bit from the kernel, but
    its other bits from the creating account's umask (022 clears the group's write bit, 077
    every bit of the group and others): a fan-out folder one member creates would lock the
    others out of every blob that lands in it later.
    """
    folder = os.fspath(folder)
    try:
        parent = os.stat(os.path.dirname(os.path.abspath(folder))).st_mode
        wanted = parent & _INHERITED
        if parent & FOLDER_BITS == FOLDER_BITS:
            wanted |= FOLDER_BITS
        mode = os.lstat(folder).st_mode
        if stat.S_ISDIR(mode) and mode & wanted != wanted:
            os.chmod(folder, stat.S_IMODE(mode) | wanted)
    except OSError:
        # Made by another member, who alone may chmod it: it is theirs to share.
        return


def readable_bits(folder: str | os.PathLike[str]) -> int:
    """The read bits a file the pool writes in ``folder`` for others to read must have,
    whatever the writer's umask: the owner's, the group's where the folder lets its group in,
    others' where it lets others in (the search bit: who may reach the file may read it)."""
    try:
        mode = os.stat(folder).st_mode
    except OSError:
        return stat.S_IRUSR
    bits = stat.S_IRUSR
    if mode & stat.S_IXGRP:
        bits |= stat.S_IRGRP
    if mode & stat.S_IXOTH:
        bits |= stat.S_IROTH
    return bits


def share_new_catalog(catalog_file: str | os.PathLike[str]) -> None:
    """Give a SQLite catalog file this process just created (and its ``-wal``/``-shm``) the
    pool's sharing mode: read for every class its folder lets in, and the group's write bit
    in a shared folder (`share_pool`'s bits), whatever the creating account's umask.

    NOTE: SQLite creates the file 0644 minus the umask and gives ``-wal``/``-shm`` the file's
    own mode: a catalog a member with umask 077 creates (a rebuild after a lost catalog)
    would lock every other member, and every reader of a pool readable by others, out.
    """
    path = Path(catalog_file)
    folder = path.absolute().parent
    wanted = readable_bits(folder)
    try:
        if os.stat(folder).st_mode & FOLDER_BITS == FOLDER_BITS:
            wanted |= _CATALOG_BITS
    except OSError:
        return
    for side in _SIDE_FILES:
        target = Path(f"{path}{side}")
        try:
            st = os.lstat(target)
            if stat.S_ISREG(st.st_mode) and st.st_mode & wanted != wanted:
                os.chmod(target, stat.S_IMODE(st.st_mode) | wanted)
        except OSError:
            continue  # gone (a -wal checkpointed away), or not ours to change


def _folders(root: Path) -> list[Path]:
    """The pool's folders that exist: root, blobs/ and its two fan-out levels, tmp/,
    journal/ (docs/architecture/retention-journal.md, "Retention journal") and its damaged/."""
    found = [root]
    for top in (root / "blobs", root / "tmp", root / "journal", root / "journal" / "damaged"):
        if top.is_dir() and not top.is_symlink():
            found.append(top)
    blobs = root / "blobs"
    if blobs in found:
        for outer in sorted(blobs.iterdir()):
            if outer.is_dir() and not outer.is_symlink() and len(outer.name) == 2:
                found.append(outer)
                found.extend(
                    inner
                    for inner in sorted(outer.iterdir())
                    if inner.is_dir() and not inner.is_symlink() and len(inner.name) == 2
                )
    return found


def _member_read_files(root: Path) -> list[Path]:
    """The files every member must read that exist: the identity file and its spare
    (docs/architecture/pool-identity.md, "Pool identity"), and the retention journal's records and
    checkpoints (GC, verify and rebuild replay them)."""
    found = [root / "archive-pool.json", root / "blobs" / ".archive-pool.json"]
    journal = root / "journal"  # not its damaged/: evidence kept for the operator only
    if journal.is_dir() and not journal.is_symlink():
        found.extend(sorted(journal.iterdir()))
    return [p for p in found if p.is_file() and not p.is_symlink()]


def _group_may_read(st: os.stat_result, gid: int) -> bool:
    # NOTE: POSIX tests a member of the file's group against the group bits only and never
    # falls through to the others bits, so a 0604 file of the pool's group locks members out.
    # A file of another group is read by a member through the others bits.
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def _catalog_files(catalog_file: Path | None) -> list[Path]:
    if catalog_file is None:
        return []
    return [p for p in (Path(f"{catalog_file}{s}") for s in _SIDE_FILES) if p.is_file()]


def share_pool(
    root: str | os.PathLike[str], group: str | int, *, catalog_file: Path | None = None
) -> SharedReport:
    """Give the pool at ``root`` to ``group`` (see the module docstring); idempotent.

    Files other than the catalog's (blobs, the identity files) get the group and keep their
    modes plus group read.

    Raises:
        InvalidInputError: no such group.
        OSError: a folder or file could not be changed (not owned by this account).
    """
    name, gid = _group(group)
    root = Path(root)
    _refuse_linked_files(root, catalog_file, name)
    report = SharedReport(name, gid)
    try:
        _share(root, gid, catalog_file, report)
    except PermissionError as exc:
        raise PermissionError(
            exc.errno,
            f"cannot give {exc.filename} to group {name} ({exc.strerror}): run this as the "
            f"owner of the pool's files, who must be a member of {name}, or as root",
        ) from exc
    return report


def _refuse_linked_files(root: Path, catalog_file: Path | None, group: str) -> None:
    """InvalidInputError if a file `_share` would change has other names (hard links).

    NOTE: a copy made with ``cp -al`` or ``rsync --link-dest`` shares each file's inode with
    the original: a chown or chmod through the copy's name changes the original's file too,
    giving another pool's files to the group.  The pool itself never links its files.
    """
    paths = [*_catalog_files(catalog_file), root / "archive-pool.json"]
    for folder in _folders(root)[1:]:
        paths.extend(p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    linked = []
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            linked.append(str(path))
    if linked:
        raise InvalidInputError(
            f"{len(linked)} file(s) of the pool at {root} are hard links, shared with files "
            f"elsewhere ({_listed(linked)}; a copy made with 'cp -al' or 'rsync "
            f"--link-dest'?): giving them to group {group} would change the other files too. "
            "Nothing was changed; share a copy made with 'cp -a', or the original"
        )


def _share(root: Path, gid: int, catalog_file: Path | None, report: SharedReport) -> None:
    def chown(path: Path, st: os.stat_result) -> None:
        if st.st_gid != gid:
            os.chown(path, -1, gid, follow_symlinks=False)

    for folder in _folders(root):
        st = os.lstat(folder)
        chown(folder, st)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_gid != gid or mode & FOLDER_BITS != FOLDER_BITS:
            # chown may clear set-group-id: chmod comes after it.
            os.chmod(folder, mode | FOLDER_BITS)
            report.folders += 1
            report.changed.append(str(folder))
    catalog = set(_catalog_files(catalog_file))
    others: list[Path] = [root / "archive-pool.json"]
    for folder in _folders(root)[1:]:
        others.extend(p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    for path in [*sorted(catalog), *others]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        wanted = mode | (_CATALOG_BITS if path in catalog else stat.S_IRGRP)
        if st.st_gid != gid or mode != wanted:
            chown(path, st)
            os.chmod(path, wanted)
            report.files += 1
            report.changed.append(str(path))


def _listed(paths: list[str]) -> str:
    """The first `_SHOWN` paths, and how many more."""
    more = len(paths) - _SHOWN
    return ", ".join(paths[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _fix_command(root: Path, group: str, catalog_url: str | None) -> str:
    url = f" --catalog-url {shlex.quote(catalog_url)}" if catalog_url else ""
    return f"archive-manager --root {shlex.quote(str(root))}{url} init --shared-group {group}"


def shared_problems(
    root: str | os.PathLike[str] | object,
    *,
    catalog_file: Path | None = None,
    catalog_url: str | None = None,
) -> list[str]:
    """What would lock another member of a shared pool's group out, one sentence each with
    the command that fixes it; empty for a pool that is not shared.

    A pool is shared when its root has the set-group-id bit (`share_pool` sets it); then every
    folder must have the root's group and `FOLDER_BITS`, the catalog file and its
    ``-wal``/``-shm`` the root's group with group read and write, and the identity files and
    the journal's files must be readable by the group.  ``catalog_url`` (no
    password) is shown in the fixing command when the catalog is not the root's own.
    """
    if not isinstance(root, (str, os.PathLike)):
        return []  # a root on an object store: access is the bucket's policy, not bits
    root = Path(root)
    try:
        top = os.stat(root)
    except OSError:
        return []
    if not top.st_mode & stat.S_ISGID:
        return []
    gid = top.st_gid
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    folders: list[str] = []
    for folder in _folders(root):
        st = os.lstat(folder)
        if st.st_gid != gid or st.st_mode & FOLDER_BITS != FOLDER_BITS:
            folders.append(str(folder))
    files: list[str] = []
    for path in _catalog_files(catalog_file):
        st = os.lstat(path)
        if st.st_gid != gid or st.st_mode & _CATALOG_BITS != _CATALOG_BITS:
            files.append(str(path))
    # NOTE: files written before the pool was shared, or by an earlier version under umask
    # 077 (which wrote the identity file and journal records 0600): every other member's
    # open, or GC, then fails reading them.
    unreadable = [str(p) for p in _member_read_files(root) if not _group_may_read(os.lstat(p), gid)]
    fix = _fix_command(root, group, catalog_url)
    problems = []
    if folders:
        problems.append(
            f"{len(folders)} folder(s) of the pool shared with group {group} lack the group, "
            f"its write bit or the set-group-id bit ({_listed(folders)}): other members "
            f"cannot save, release or collect there; fix it with: {fix} (as the owner of "
            "those files, or root)"
        )
    if unreadable:
        problems.append(
            f"{len(unreadable)} file(s) every member must read ({_listed(unreadable)}) of the "
            f"pool shared with group {group} are not readable by the group: other members "
            "cannot open the pool (its identity file) or collect and verify it (its journal); "
            f"fix it with: {fix} (as the owner of those files, or root)"
        )
    if files:
        problems.append(
            f"the catalog file(s) {', '.join(files)} of the pool shared with group {group} are "
            f"not readable and writable by the group: other members cannot open the pool; "
            f"fix it with: {fix} (as the owner of those files, or root)"
        )
    return problems
