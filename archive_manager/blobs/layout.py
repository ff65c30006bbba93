"""Where a blob lives: the one mapping from a digest to its location
(docs/architecture/blob-store-contract.md, "Blob store contract").

A blob of digest ``d`` is at ``<d[0:2]>/<d[2:4]>/<d>`` below the store's top: two levels of
256 fan-out folders keep every folder small (a pool of 10 million blobs has ~150 files per
leaf folder), and an object store can use the same string as its key.  Every store and every
tool that names a blob's location goes through here.
"""

from __future__ import annotations

from .._util.digest import check_digest, is_digest

__all__ = ["BLOBS_DIR", "FANOUT_NAMES", "TEMP_DIR", "blob_key", "fanout", "is_blob_name"]

#: The folder (or key prefix) of the blobs below a pool root.
BLOBS_DIR = "blobs"
#: The folder of a filesystem store's temp files below a pool root.
TEMP_DIR = "tmp"
#: The names a fan-out folder may have: two lowercase hex digits.
FANOUT_NAMES = frozenset(f"{i:02x}" for i in range(256))


def fanout(digest: str) -> tuple[str, str]:
    """The two fan-out folder names of a canonical ``digest`` (not checked: callers check)."""
    return digest[0:2], digest[2:4]


def blob_key(digest: str) -> str:
    """``ab/cd/abcd…``: the location of ``digest`` below the blobs' top, ``/``-separated.

    Raises:
        InvalidNameError: ``digest`` is not canonical (so no location ever escapes the store).
    """
    d = check_digest(digest)
    return f"{d[0:2]}/{d[2:4]}/{d}"


def is_blob_name(outer: str, inner: str, name: str) -> bool:
    """Whether ``name`` in fan-out folders ``outer``/``inner`` is a blob's canonical name."""
    return name.startswith(outer + inner) and is_digest(name)
