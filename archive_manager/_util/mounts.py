"""Which filesystem holds a path, from the mount table: a pure parser plus a thin reader.

Below every other module (docs/architecture/index.md, "Layers"): the catalog refuses a SQLite file
on a networked filesystem (`catalog.engine.check_local_filesystem`), a pool's blob reads are
retried there (`blobs.local.resolve_read_retry`, docs/architecture/shared-pools.md "Shared
pools"), and the manager probes FUSE mounts that refuse writes.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["NETWORK_FILESYSTEMS", "filesystem_type", "is_network_filesystem", "read_mount_table"]

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "9p",
        "afs",
        "fuse",
        # distributed filesystems of GPU clusters: other hosts change the files behind this
        # kernel, as on lustre, gpfs and beegfs (WekaFS, Panasas PanFS, OrangeFS)
        "wekafs",
        "panfs",
        "pvfs2",
    }
)
# NOTE: every fuse.* type counts as networked (juicefs, sshfs, s3fs, gcsfuse, ...), except
# these, which are local by construction (rootless container root filesystems).
_LOCAL_FUSE = frozenset({"fuse.fuse-overlayfs"})

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mount_field(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in mount points as \040 etc.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mount_lines(mount_table: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line of ``/proc/self/mountinfo`` or ``/proc/mounts``."""
    mounts: list[tuple[str, str]] = []
    for line in mount_table.splitlines():
        fields = line.split()
        if len(fields) >= 10 and "-" in fields[6:]:
            # mountinfo: id parent major:minor root mount-point options [optional...] - type src
            sep = fields.index("-", 6)
            if sep + 1 < len(fields):
                mounts.append((_unescape_mount_field(fields[4]), fields[sep + 1]))
        elif len(fields) >= 3:
            # mounts / fstab style: source mount-point type options dump pass
            mounts.append((_unescape_mount_field(fields[1]), fields[2]))
    return mounts


def _is_under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    mount_point = mount_point.rstrip("/")
    return path == mount_point or path.startswith(mount_point + "/")


def filesystem_type(path: str, mount_table: str) -> str | None:
    """The filesystem type holding absolute ``path``, from a mount table's text.

    Args:
        path: An absolute, symlink-free path.
        mount_table: The text of ``/proc/self/mountinfo`` or ``/proc/mounts``.

    Returns:
        The type of the mount with the longest matching mount point (the last one listed
        when several are stacked on one point), or None when no mount matches.
    """
    best_len, best_type = -1, None
    for mount_point, fstype in _mount_lines(mount_table):
        if _is_under(path, mount_point) and len(mount_point) >= best_len:
            best_len, best_type = len(mount_point), fstype
    return best_type


def is_network_filesystem(fstype: str) -> bool:
    """True for filesystem types on which SQLite's file locking cannot be trusted."""
    fstype = fstype.lower()
    if fstype in _LOCAL_FUSE:
        return False
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def read_mount_table() -> str | None:
    """The text of this process's mount table, or None where there is none (not Linux)."""
    for candidate in ("/proc/self/mountinfo", "/proc/mounts"):
        try:
            return Path(candidate).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
    return None
